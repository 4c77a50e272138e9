"""What the admin should know before trusting the latest audit: the report's ``latest.warnings``
(the JSON report, ``fedaudit report`` and the dashboard show them)."""

from __future__ import annotations

import numpy as np

from service.audit.evidence_abstention import MIN_LOWER_TAIL
from service.audit_records.detection_summaries import EvidenceSummary
from service.coordinator.stored_audit import StoredAudit, read_audit
from service.store.tables import AuditResult, Client, Federation


def class_label(federation: Federation, index: int) -> str:
    """A class's name where the federation named its classes, else its index."""
    names = federation.class_names
    return names[index] if names and 0 <= index < len(names) else str(index)


def latest_warnings(
    round_index: int, audit: StoredAudit, federation: Federation, clients: list[Client]
) -> list[str]:
    """Every warning on the latest audited round (``audit``, read), in the report's order."""
    return (
        _warnings(round_index, audit)
        + disagreement_warnings(round_index, audit, federation)
        + lower_tail_warnings(round_index, audit)
        + label_skew_warnings(federation, clients)
    )


def report_warnings(audit: AuditResult) -> list[str]:
    """What the admin should know before trusting the latest audit's flags.

    Every detector compares the clients with the global model, so each assumes that model is
    fitted mostly by correctly labelled data. When the flagged clients are most of the
    clients *and* hold most of the round's samples, that is doubtful: a site with most of the
    data and mostly wrong labels, or a majority whose labels are inverted, pulls the model to
    its labels, and then the clean sites look noisy (``docs/evaluation.md``, "Known
    limits": flags inverted in every round this rule fired on except chance flags of
    a clean federation; a rule on the share of samples alone also fired where a truly noisy
    group happened to hold just over half of the data).
    """
    return _warnings(audit.round_index, read_audit(audit.result))


def _warnings(round_index: int, audit: StoredAudit) -> list[str]:
    """:func:`report_warnings` on an audit already read."""
    flags = audit.primary_flags
    if audit.in_warmup or not flags or len(flags) != len(audit.clients):
        return []
    sizes = [row.num_samples or 0 for row in audit.clients]
    total = sum(sizes)
    flagged = [n for n, flag in zip(sizes, flags, strict=True) if flag is True]
    if total <= 0 or 2 * len(flagged) <= len(flags) or 2 * sum(flagged) <= total:
        return []
    return [
        f"{len(flagged)} of the {len(flags)} clients, holding {sum(flagged) / total:.0%} of "
        f"round {round_index}'s samples, are flagged: the detectors compare each client "
        "with the global model and assume it is fitted mostly by correctly labelled data; "
        "when most clients and most of the data are flagged, the flags may be inverted (the "
        "unflagged clients may be the noisy ones). Check both groups."
    ]


def disagreement_warnings(
    round_index: int, audit: StoredAudit, federation: Federation
) -> list[str]:
    """Where the evidence detector flagged nobody but the sites disagree in some classes far
    beyond sampling error (its summary's ``disagreeing_classes``): "ok" there does not mean the
    labels agree (``service.audit.evidence_abstention.MAX_CLASS_HETEROGENEITY``)."""
    classes = audit.primary_detection.disagreeing_classes  # none unless the evidence detector's
    if audit.in_warmup or not classes:
        return []
    names = ", ".join(class_label(federation, int(c)) for c in classes)
    return [
        f"round {round_index} flags nobody, but in class(es) {names} the sites disagree far "
        "beyond sampling error (I^2 above 0.9) and none stands out: several sites may hold wrong "
        "labels there, a group too large or too spread to single out, or those classes differ "
        "between the sites' populations. Check those classes' labels at the sites with the "
        "highest scores."
    ]


def lower_tail_warnings(round_index: int, audit: StoredAudit) -> list[str]:
    """Where the evidence detector flagged sites above the consensus while
    :data:`~service.audit.evidence_abstention.MIN_LOWER_TAIL` or more others lie significantly
    below it (its summary's ``flagged`` and ``significant_low``): the evidence points both ways.
    The flags stand (sites can lie about their losses, and two that did silenced the audit when
    this made the round abstain); the admin is told what else it may mean."""
    summary = audit.primary_detection.summary
    if audit.in_warmup or not isinstance(summary, EvidenceSummary):  # the evidence detector's
        return []
    flagged, below = summary.flagged, summary.significant_low
    if not isinstance(flagged, int) or not isinstance(below, int):
        return []
    if flagged == 0 or below < MIN_LOWER_TAIL:
        return []
    return [
        f"round {round_index} flags {flagged} site(s) above the consensus while {below} other(s) "
        "lie significantly below it: either those sites are cleaner than the rest, and then "
        "the consensus itself may hold wrong labels (check the unflagged sites too), or they "
        "under-report their losses. Compare their updates and their history before acting."
    ]


def label_skew_warnings(federation: Federation, clients: list[Client]) -> list[str]:
    """A warning when the paper's FedNoRo logit adjustment meets sites holding few classes.

    With ``absent_class_prior: "zero"`` (the FedNoRo paper and its authors' code) and the logit
    adjustment on (``la_tau`` > 0, the paper's 1) a class a site does not hold gets the logit
    offset log 0 = -inf, so each site trains only the contrast
    between its own classes. With two classes per site (digits, 20 sites) that cost 21 points
    against FedAvg (the stress matrix's ``m04``, seed 0), where the default ``"rarest"`` matched
    FedAvg in that seed and trailed it by 2.2 points over seeds 0-2
    (``client_sdk/recipes/fednoro.py``). The line drawn here, the median site holding at
    most half of the classes, is a heuristic; the warning says what to configure instead.
    """
    num_classes = federation.num_classes
    if federation.config.get("recipe") != "fednoro" or num_classes < 3:
        return []
    hyperparameters = federation.config.get("hyperparameters") or {}
    if hyperparameters.get("absent_class_prior", "rarest") != "zero":
        return []
    if float(hyperparameters.get("la_tau", 0.0)) <= 0.0:
        return []  # no logit adjustment at all (the default since la_tau): nothing to warn of
    held = [
        sum(1 for count in client.class_counts if count is None or int(count) > 0)
        for client in clients
        if client.class_counts
    ]
    if not held:
        return []
    median = float(np.median(held))
    if 2 * median > num_classes:
        return []
    return [
        f"the median site holds {median:g} of the {num_classes} classes: with "
        'absent_class_prior "zero" FedNoRo\'s logit adjustment trains each site only on the '
        "contrast between its own classes, which cost 21 accuracy points against FedAvg with two "
        'classes per site. The default, absent_class_prior "rarest", does not.'
    ]
