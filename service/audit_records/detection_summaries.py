"""Each detector's round ``summary`` in a stored audit, typed.

As with the verdicts' evidence (:mod:`service.audit_records.verdict_evidence`), which keys a
summary holds depends on the detector, on the path it took (an undetermined FedNoRo says only
which columns it used; a small federation's evidence detector answers a narrower question) and
on the version that stored it: every field is optional and absent from the JSON where the stored
summary lacks it; a null stays null and an unknown key is kept.
"""

from __future__ import annotations

from pydantic import MISSING

from service.audit_records.stored_record import StoredRecord, stored_key

__all__ = [
    "SUMMARY_MODELS",
    "EvidenceSummary",
    "ExpertiseSummary",
    "FedNCLSummary",
    "FedNoRoSummary",
    "GroupMeans",
    "PrimarySummary",
    "read_summary",
]


class EvidenceSummary(StoredRecord):
    """The evidence detector's round (docs/algorithms.md, "Calibrated evidence")."""

    verdict: str | MISSING = stored_key(
        "ok, inconclusive or undetermined, as the detection's status"
    )
    reason: str | None | MISSING = stored_key("Why the round abstained or is undetermined")
    mode: str | MISSING = stored_key(
        "consensus, anchored, or the small federation's test (worse than the label prior)"
    )
    q: float | MISSING = stored_key("The Benjamini-Hochberg level of the round's flags")
    flagged: int | MISSING = stored_key("Sites flagged (0 when the round abstained)")
    informativeness: float | None | MISSING = stored_key(
        "How much better than the label prior the global model's loss is on the sites' data "
        "(1 - loss / entropy, capped sites' median; about 0: at chance)"
    )
    accuracy_informativeness: float | None | MISSING = stored_key(
        "The same, from the error counts (null: not counted)"
    )
    heterogeneity: float | None | MISSING = stored_key(
        "I^2 of the classes' losses across the sites (how much they differ beyond chance)"
    )
    mixture_flagged: int | None | MISSING = stored_key(
        "Sites FedNoRo's mixture put on the noisy side (the cross-check; null: not run)"
    )
    label_entropy: float | None | MISSING = stored_key(
        "The pooled labels' entropy: the loss of predicting the label prior, in nats"
    )
    anchors: int | MISSING = stored_key("Trust anchors that took part")
    anchor_orientation: str | MISSING = stored_key(
        "consensus, or inverted where the anchors showed the consensus to be the noisy side"
    )
    spreads_reported: bool | MISSING = stored_key("Every site sent per_class_loss_sd")
    accuracy_flagged: int | MISSING = stored_key("Sites flagged by the accuracy evidence alone")
    accuracy_note: str | None | MISSING = stored_key(
        "Why the accuracy evidence was not used or was set aside"
    )
    accuracy_centre: float | None | MISSING = stored_key("The sites' central local accuracy")
    significant_high: int | MISSING = stored_key("Sites significantly above the consensus")
    significant_low: int | MISSING = stored_key("Sites significantly below the consensus")
    errors_counted: bool | MISSING = stored_key("The error counts entered the sites' p-values")
    errors_dispersion: float | None | MISSING = stored_key(
        "phi: the error counts' fitted dispersion between clean sites"
    )
    confident_errors_counted: bool | MISSING = stored_key("The confident share's test entered")
    class_centre: list[float | None] | MISSING = stored_key(
        "Per class: the fitted consensus loss (null: the class did not enter)"
    )
    class_tau: list[float | None] | MISSING = stored_key(
        "Per class: the fitted spread between clean sites (null: the class did not enter)"
    )
    site_tau: float | None | MISSING = stored_key(
        "The fitted spread of the sites' overall difficulty (null: not used)"
    )
    site_df: float | None | MISSING = stored_key(
        "Its degrees of freedom (null: not used or infinite)"
    )
    majority_suspected: bool | MISSING = stored_key(
        "The round abstained because the group it would flag was not a clear minority"
    )
    majority_rounds: int | MISSING = stored_key(
        "Of the recent rounds, how many abstained so (the majority memory)"
    )
    geometry_judged: int | MISSING = stored_key("Sites the update geometry judged among peers")
    geometry_flagged: int | MISSING = stored_key("Sites flagged by the update geometry alone")
    geometry_note: str | None | MISSING = stored_key("Why the geometry's flags were set aside")
    geometry_carried: int | MISSING = stored_key(
        "Sites whose geometry flag was carried from an earlier round"
    )
    geometry_carry_note: str | None | MISSING = stored_key("Why nothing was carried")
    disagreeing_classes: list[int] | MISSING = stored_key(
        "Where the round flagged nobody: the classes in which the sites disagree far beyond "
        "sampling error (I^2 above 0.9), a group of noisy sites too large or too spread to "
        "single out, or populations that differ there"
    )


class GroupMeans(StoredRecord):
    """A statistic's mean over the noisy group and over the others."""

    noisy: float | None | MISSING = stored_key("Over the noisy group (null: empty)")
    clean: float | None | MISSING = stored_key("Over the others (null: empty)")


class FedNoRoSummary(StoredRecord):
    """FedNoRo's round: the mixture vote and its separation guard (docs/algorithms.md)."""

    columns_used: list[int] | MISSING = stored_key("The classes whose losses entered the mixture")
    columns_dropped_missing: list[int] | MISSING = stored_key("Classes no site holds")
    columns_dropped_constant: list[int] | MISSING = stored_key("Classes whose loss does not vary")
    n_fits: int | MISSING = stored_key("Mixture fits (seeds) that voted")
    vote_count: int | MISSING = stored_key("Fits that proposed the judged group")
    separation_groups: str | MISSING = stored_key("How the guard chose the groups it judged")
    groups_tested: int | MISSING = stored_key(
        "Different groups the fits proposed and the guard judged"
    )
    group_rank: int | MISSING = stored_key("The judged group's rank by votes (0: the majority's)")
    separation_quantile_judged: float | None | MISSING = stored_key(
        "The null quantile each group was judged at"
    )
    fits_converged: list[bool] | MISSING = stored_key("Per fit: whether it converged")
    ashman_d: float | None | MISSING = stored_key(
        "Ashman's D between the groups (null: undefined or infinite)"
    )
    ashman_d_infinite: bool | MISSING = stored_key("D is infinite (a group without spread)")
    separation_required: bool | MISSING = stored_key("The guard was on")
    separation_threshold: float | None | MISSING = stored_key("The D the groups had to reach")
    separation_null_threshold: float | None | MISSING = stored_key(
        "The null quantile of D for this size and group (simulated)"
    )
    separation_passed: bool | None | MISSING = stored_key("The groups were separated")
    separation_confirmed_group: bool | None | MISSING = stored_key(
        "The flagged clients were already noisy (a lower threshold applies)"
    )
    separation_statistic: str | MISSING = stored_key("The statistic D was computed on")
    class_z_classes: list[int] | MISSING = stored_key("The classes the class z was computed over")
    guard: str | None | MISSING = stored_key("What the guard decided, in words")
    mixture_noisy_count: int | MISSING = stored_key("Clients in the mixture's noisy component")
    n_flagged: int | MISSING = stored_key("Clients flagged")
    group_mean_loss: GroupMeans | MISSING = stored_key("Mean loss of each group")
    group_mean_statistic: GroupMeans | MISSING = stored_key(
        "Mean separation statistic of each group"
    )


class FedNCLSummary(StoredRecord):
    """Fed-NCL's round: the sigma rule on q (Fed-NCL, eq. 9-10)."""

    mean: float | MISSING = stored_key("The round's mean q")
    std: float | MISSING = stored_key("The round's standard deviation of q")
    std_ddof: int | MISSING = stored_key("Its delta degrees of freedom")
    beta: float | MISSING = stored_key("The rule's multiple of the standard deviation")
    two_sided: bool | MISSING = stored_key("Low q flagged too")
    loss_mode: str | MISSING = stored_key("h as the summed (sum) or mean (mean) training loss")
    threshold: float | MISSING = stored_key("mean + beta std: above it a site is flagged")
    lower_threshold: float | None | MISSING = stored_key("mean - beta std where two-sided")
    n_flagged: int | MISSING = stored_key("Sites flagged")


class ExpertiseSummary(StoredRecord):
    """FedRN's expertise over the round."""

    min_accuracy: float | MISSING = stored_key("The lowest local accuracy")
    max_accuracy: float | MISSING = stored_key("The highest local accuracy")
    note: str | MISSING = stored_key("What the expertise is for")


PrimarySummary = EvidenceSummary | FedNoRoSummary | FedNCLSummary | ExpertiseSummary
"""Any detector's round summary; which one a stored summary is, its detector's name says."""

SUMMARY_MODELS: dict[str, type[StoredRecord]] = {
    "evidence": EvidenceSummary,
    "fednoro": FedNoRoSummary,
    "fedncl": FedNCLSummary,
    "expertise": ExpertiseSummary,
}
"""The summary record of each detector (``tests/api/test_audit_records.py`` checks that it names
the registry's detectors)."""


def read_summary(detector: str | None, summary: object) -> object:
    """A stored summary as its detector's record: a JSON object, or a record read for another
    detector (a generic :class:`StoredRecord` where the detector was not known). Anything else
    is returned as it is (a null, a value that is not an object: the model that holds it
    decides), and a detector this version does not know keeps a plain object."""
    model = SUMMARY_MODELS.get(detector) if detector is not None else None
    if isinstance(summary, StoredRecord):
        if model is not None and type(summary) is model:
            return summary
        summary = summary.model_dump()
    if isinstance(summary, dict) and model is not None:
        return model.model_validate(summary)
    return summary
