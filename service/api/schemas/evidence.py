"""Each detector's evidence beside the verdict, per site and per class, on the wire.

The report (``ReportClient.latest_detector_evidence``, ``latest_class_evidence``) and a client's
history (``ClientRoundView.detector_evidence``, ``class_evidence``) show them; the coordinator
builds them in ``service.coordinator.report_evidence``. Every field is null where the stored audit
holds no value: an audit stored before the field was recorded, or a part the detector did not use
that round. A detector that did not run, or gave the site no verdict, has no object at all.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


def _number(description: str) -> float | None:
    return Field(default=None, description=description)


class EvidenceParts(BaseModel):
    """The evidence detector's verdict on the site, part by part (docs/algorithms.md, "The
    verdict: which evidence decides"). The losses' test decides through ``p_value`` (the
    site-level, Stouffer and per-class parts combined by Bonferroni, and with the error counts
    where they entered); the accuracy and the update geometry add flags of their own."""

    p_value: float | None = _number(
        "The site's p-value: the losses' parts (and the error counts', where they entered) "
        "combined by Bonferroni"
    )
    q_value: float | None = _number(
        "The p-value adjusted by Benjamini-Hochberg over the round's sites: the site is "
        "significant where it is at most the detector's q"
    )
    site_z: float | None = _number(
        "The site as a whole: its total loss against what its class mix predicts, in standard "
        "errors (null below 10 sites and in anchored mode)"
    )
    site_factor: float | None = _number(
        "The site's total loss over what its class mix predicts (1: as the consensus)"
    )
    stouffer_z: float | None = _number(
        "Stouffer's combination of the site's class z (weights sqrt n), given its difficulty"
    )
    mean_loss: float | None = _number("The global model's mean loss on the site's own labels")
    errors: int | None = Field(
        default=None,
        description="The global model's errors on the site's labels (null: no error counts)",
    )
    errors_expected: float | None = _number("The errors a clean site of this class mix would have")
    errors_z: float | None = _number("The error count's excess in standard errors")
    errors_p_value: float | None = _number("The error count's one-sided p-value")
    confident_errors: int | None = Field(
        default=None,
        description=(
            "Of those errors, the confident ones: the global model gives the site's label a "
            "probability of at most 0.1 (null: not counted)"
        ),
    )
    confident_errors_expected: float | None = _number(
        "The confident errors a clean site's share would give the site's errors"
    )
    confident_errors_z: float | None = _number(
        "The confident share's excess as a normal quantile of its p-value"
    )
    confident_errors_p_value: float | None = _number(
        "The confident share's one-sided p-value, given the site's errors"
    )
    accuracy_z: float | None = _number(
        "The local model's error on its own labels against the others', in standard errors "
        "(null: the accuracy check off or not made)"
    )
    accuracy_p_value: float | None = _number("The accuracy test's one-sided p-value")
    accuracy_gap: float | None = _number("The site's error above the centre (absolute)")
    geometry_cosine: float | None = _number(
        "The cosine between the site's update and the sum of the other sites' (null: not made)"
    )
    geometry_z: float | None = _number(
        "How far that cosine stands below its peers' median, in robust standard deviations "
        "(null: the site was not judged among peers)"
    )
    geometry_p_value: float | None = _number("The geometry's one-sided p-value")


class FedNoRoParts(BaseModel):
    """FedNoRo's verdict on the site (its per-class normalised losses are in class_evidence)."""

    separation_score: float | None = _number(
        "The verdict's score: the statistic its separation guard reads (by default class_z)"
    )
    class_z: float | None = _number(
        "The class-standardised loss excess, in standard errors (about N(0, 1) when clean)"
    )
    mean_loss: float | None = _number("The site's mean loss over its own samples")
    noisy_probability: float | None = _number(
        "The mixture's noisy-component posterior, averaged over its fits, before the guard"
    )
    noisy_votes: int | None = Field(
        default=None, description="In how many mixture fits the site fell in the noisy component"
    )


class FedNCLParts(BaseModel):
    """Fed-NCL's verdict on the site: q = e * h / n (eq. 9) and its terms."""

    q: float | None = _number("The reliability score q (higher = noisier)")
    divergence: float | None = _number(
        "e: the squared distance of the site's model from the global model (eq. 7)"
    )
    data_quality: float | None = _number(
        "h: the site's training loss, summed over its samples (loss_mode sum, eq. 8) or its mean"
    )
    deviation: float | None = _number("q minus the round's mean q, in the round's std of q")


class ExpertiseParts(BaseModel):
    """FedRN's expertise of the site (eq. 4)."""

    expertise: float | None = _number(
        "The accuracy min-max normalised over the round's sites (higher = more reliable)"
    )
    train_accuracy: float | None = _number("The local model's accuracy on the site's own labels")


class DetectorEvidence(BaseModel):
    """Each detector's evidence on one site (null: the detector did not run, or gave the site
    no verdict)."""

    evidence: EvidenceParts | None = None
    fednoro: FedNoRoParts | None = None
    fedncl: FedNCLParts | None = None
    expertise: ExpertiseParts | None = None


class ClassEvidence(BaseModel):
    """One class of a site: what the per-class detectors say of it."""

    index: int = Field(description="The class index")
    label: str = Field(description="The class name (the index where the task names none)")
    evidence_z: float | None = Field(
        default=None,
        description=(
            "The evidence detector's class z: the site's loss in the class against the class's "
            "consensus, in standard errors, as reported (null: the site holds no sample of it)"
        ),
    )
    fednoro_normalised_loss: float | None = Field(
        default=None,
        description="FedNoRo's feature: the site's class loss min-max normalised over the sites",
    )
    noisy_by: list[str] = Field(
        default_factory=list,
        description=(
            "The detectors (that answered ok) whose noisy classes include this one, in the "
            "registry's order"
        ),
    )
