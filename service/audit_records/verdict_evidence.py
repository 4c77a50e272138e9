"""Each detector's ``evidence`` in a stored audit's verdicts, typed.

A verdict's evidence holds the detector's own facts behind it (docs/algorithms.md). Which keys a
verdict holds depends on the detector, on what the round used (the error counts only where the
sites sent them, the geometry only where it was judged) and on the version that stored the audit,
so every field is optional and **absent from the JSON where the stored audit has no such key**
(the ``MISSING`` default: an absent key stays absent, a stored null stays null). A key this
version does not know is kept (``extra="allow"``).
"""

from __future__ import annotations

from pydantic import MISSING

from service.audit_records.stored_record import StoredRecord, stored_key

__all__ = [
    "EvidenceVerdictEvidence",
    "ExpertiseVerdictEvidence",
    "FedNCLVerdictEvidence",
    "FedNoRoVerdictEvidence",
]


class EvidenceVerdictEvidence(StoredRecord):
    """The evidence detector's facts on one site (docs/algorithms.md, "The verdict: which
    evidence decides"). Below ``min_clients`` sites the small-federation test answers instead:
    ``p_value``, ``q_value``, ``mean_loss``, ``prior_loss``, ``loss_over_prior``,
    ``noisy_classes`` and ``significant``."""

    p_value: float | None | MISSING = stored_key(
        "The site's p-value: the losses' parts (and the error counts', where they entered) "
        "combined by Bonferroni"
    )
    q_value: float | None | MISSING = stored_key(
        "The p-value adjusted by Benjamini-Hochberg over the round's sites"
    )
    site_z: float | None | MISSING = stored_key(
        "The site's total loss against what its class mix predicts, in standard errors (null "
        "below 10 sites and in anchored mode)"
    )
    site_factor: float | None | MISSING = stored_key(
        "The site's total loss over what its class mix predicts (1: as the consensus)"
    )
    stouffer_z: float | None | MISSING = stored_key(
        "Stouffer's combination of the site's class z (weights sqrt n), given its difficulty"
    )
    class_z: list[float | None] | MISSING = stored_key(
        "Per class: the site's loss against the class's consensus, in standard errors (null "
        "where the site holds no sample of the class or the class did not enter)"
    )
    noisy_classes: list[int] | MISSING = stored_key(
        "The classes whose loss alone is significantly above the consensus, highest first"
    )
    mean_loss: float | None | MISSING = stored_key(
        "The global model's mean loss on the site's own labels"
    )
    anchor: bool | MISSING = stored_key("The site is a trust anchor (never flagged)")
    significant: bool | MISSING = stored_key(
        "The losses' (and counts') test found the site significant, before any abstention"
    )
    errors: int | None | MISSING = stored_key(
        "The global model's errors on the site's labels (null: the site sent no error counts)"
    )
    errors_expected: float | None | MISSING = stored_key(
        "The errors a clean site of this class mix would have"
    )
    errors_z: float | None | MISSING = stored_key("The error count's excess in standard errors")
    errors_p_value: float | None | MISSING = stored_key("The error count's one-sided p-value")
    confident_errors: int | None | MISSING = stored_key(
        "Of those errors, the confident ones: the global model gives the site's label a "
        "probability of at most 0.1"
    )
    confident_errors_expected: float | None | MISSING = stored_key(
        "The confident errors a clean site's share would give the site's errors"
    )
    confident_errors_z: float | None | MISSING = stored_key(
        "The confident share's excess as a normal quantile of its p-value"
    )
    confident_errors_p_value: float | None | MISSING = stored_key(
        "The confident share's one-sided p-value, given the site's errors"
    )
    accuracy_z: float | None | MISSING = stored_key(
        "The local model's error on its own labels against the others', in standard errors"
    )
    accuracy_p_value: float | None | MISSING = stored_key("The accuracy test's one-sided p-value")
    accuracy_gap: float | None | MISSING = stored_key(
        "The site's error above the centre (absolute)"
    )
    flagged_by_accuracy: bool | MISSING = stored_key("The accuracy evidence alone added the flag")
    geometry_cosine: float | None | MISSING = stored_key(
        "The cosine between the site's update and the sum of the other sites'"
    )
    geometry_z: float | None | MISSING = stored_key(
        "How far that cosine stands below its peers' median, in robust standard deviations"
    )
    geometry_p_value: float | None | MISSING = stored_key("The geometry's one-sided p-value")
    flagged_by_geometry: bool | MISSING = stored_key("The update geometry alone added the flag")
    geometry_carried: bool | MISSING = stored_key(
        "The flag is the geometry's, carried from an earlier round (docs/algorithms.md)"
    )
    prior_loss: float | None | MISSING = stored_key(
        "Small federations: the loss of predicting the label prior (the labels' entropy)"
    )
    loss_over_prior: float | None | MISSING = stored_key(
        "Small federations: the site's mean loss over the prior's loss"
    )


class FedNoRoVerdictEvidence(StoredRecord):
    """FedNoRo's facts on one site (FedNoRo, stage 1: the per-class losses' mixture)."""

    normalised_loss: list[float | None] | MISSING = stored_key(
        "Per class: the site's loss min-max normalised over the sites (null: a class no site "
        "holds, or that is constant)"
    )
    noisy_classes: list[int] | MISSING = stored_key(
        "The classes on the noisy component's side of the mixture, largest excess first"
    )
    mean_loss: float | None | MISSING = stored_key("The site's mean loss over its own samples")
    class_z: float | None | MISSING = stored_key(
        "The class-standardised loss excess, in standard errors (about N(0, 1) when clean)"
    )
    gmm_noisy_probability: float | None | MISSING = stored_key(
        "The mixture's noisy-component posterior, averaged over its fits, before the guard"
    )
    noisy_votes: int | None | MISSING = stored_key(
        "In how many mixture fits the site fell in the noisy component"
    )


class FedNCLVerdictEvidence(StoredRecord):
    """Fed-NCL's facts on one site: the terms of q = e * h / n (Fed-NCL, eq. 9)."""

    divergence: float | None | MISSING = stored_key(
        "e: the squared distance of the site's model from the global model (eq. 7)"
    )
    data_quality: float | None | MISSING = stored_key(
        "h: the site's training loss, summed over its samples (loss_mode sum, eq. 8) or its mean"
    )
    deviation: float | None | MISSING = stored_key(
        "q minus the round's mean q, in the round's standard deviation of q"
    )


class ExpertiseVerdictEvidence(StoredRecord):
    """FedRN's expertise input on one site (FedRN, eq. 4)."""

    train_accuracy: float | None | MISSING = stored_key(
        "The local model's accuracy on the site's own labels"
    )
