"""How :class:`~fedaudit_flower.FedAuditStrategy` audits a round: one small interface, two backends.

The strategy reads each reply (:class:`SiteReply`: node id, signals, model), hands the round's
replies and the global model it sent to an :class:`Auditor`, and applies the
:class:`RoundAudit` it gets back. Two auditors implement the interface:

- :class:`InProcessAuditor` (the default): :func:`service.audit.run_audit` in the ServerApp's
  process, with each site's status history kept in memory; nothing is sent anywhere.
- :class:`fedaudit_flower.coordinator.CoordinatorAuditor` (``coordinator=`` of the strategy):
  forwards the replies to a running fedaudit coordinator over HTTP through the SDK and reads
  the round's audit back.

Both run the same audit code on the same inputs, so on the same replies they give the same
flags, statuses and weights. Under a signal privacy policy both read the replies as the
coordinator reads a federation's updates (``service/coordinator/audits.py``): the in-process
auditor is given the policy (:func:`audit_inputs`), the coordinator's federation is created with
it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord

from client_sdk._responses import SignalPolicy
from fedaudit_flower._records import WireSignals
from fedaudit_privacy.accounting import (
    NOISED_SIGNALS,
    accountant,
    releases_per_update,
    round_account,
)
from service.audit import (
    AuditConfig,
    AuditOutcome,
    ClientRoundData,
    DictStateReader,
    StatusHistory,
    next_status,
    raised_by_geometry,
    run_audit,
)
from service.audit.verdict_types import EvidenceSummary

__all__ = [
    "AuditNotRun",
    "Auditor",
    "InProcessAuditor",
    "RoundAudit",
    "SiteReply",
    "SiteResult",
    "SiteStatus",
    "audit_inputs",
    "mechanism_spread",
]


class AuditNotRun(Exception):
    """The audit cannot run on this round's replies (the message says why); the strategy keeps
    the wrapped strategy's aggregate."""


@dataclass(frozen=True)
class SiteReply:
    """One training reply, read: the node that sent it, its signals and its model."""

    node_id: int
    signals: WireSignals
    arrays: ArrayRecord


@dataclass(frozen=True)
class SiteResult:
    """What the audit says about one site this round (a row of the report's ``clients``)."""

    node_id: int
    num_samples: int
    flag: bool | None
    status_before: str
    status: str
    weight: float
    score: float | None
    verdict: dict[str, Any] | None

    def row(self) -> dict[str, Any]:
        """The report's row: node id, samples, flag, status before and after, weight, verdict."""
        return {
            "node_id": self.node_id,
            "num_samples": self.num_samples,
            "flag": self.flag,
            "status_before": self.status_before,
            "status": self.status,
            "weight": self.weight,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class SiteStatus:
    """A site's status after its latest audited round and its last determined flags."""

    status: str
    recent_flags: tuple[bool, ...] = ()


@dataclass(frozen=True)
class RoundAudit:
    """A round's audit, as the strategy applies and reports it.

    Attributes
    ----------
    sites : list of SiteResult
        The audited sites, in increasing node id.
    detector, detector_status, detector_reason
        The primary detector's name, status (``ok``, ``undetermined``, ``inconclusive``) and
        why it did not decide.
    rule : str
        The aggregation rule the audit applied.
    aggregate : flwr.app.ArrayRecord
        The audit's aggregate (its rule and weights over the audited sites' models).
    audit : dict
        The whole audit as JSON (the report's ``audit``).
    details : dict
        What the backend adds to the round's report entry (none in process).
    """

    sites: list[SiteResult]
    detector: str
    detector_status: str
    detector_reason: str | None
    rule: str
    aggregate: ArrayRecord
    audit: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def decided(self) -> bool:
        """Whether the primary detector decided (status ``ok``)."""
        return self.detector_status == "ok"


class Auditor(Protocol):
    """What :class:`~fedaudit_flower.FedAuditStrategy` needs from an audit backend."""

    keeps_wrapped_when_undecided: bool
    """True: a round the primary detector did not decide keeps the wrapped strategy's aggregate.
    False: the audit's aggregate is the round's model whatever the detector said (the coordinator
    backend: the next round is audited against that model)."""

    def audit_round(
        self, server_round: int, global_arrays: ArrayRecord, sites: Sequence[SiteReply]
    ) -> RoundAudit:
        """Audit the round's replies against the global model sent this round.

        Raises :class:`AuditNotRun` (or ``service.audit.InvalidInputError``) when the audit
        cannot run on them.
        """
        ...

    def statuses(self) -> dict[int, SiteStatus]:
        """Each audited site's status (node id -> status), after the latest round."""
        ...

    def report_fields(self) -> dict[str, Any]:
        """Entries the backend adds to the top of the report file (none in process)."""
        ...


def _sent_signals(signals: WireSignals) -> list[str]:
    """The noised signals a reply carries (the names of :data:`NOISED_SIGNALS` it holds)."""
    return [name for name in NOISED_SIGNALS if getattr(signals, name, None) is not None]


def numpy_state(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    """An ``ArrayRecord`` as ``{name: numpy array}``, in its order."""
    return {name: array.numpy() for name, array in arrays.items()}


def array_record(state: dict[str, Any]) -> ArrayRecord:
    """``{name: array-like}`` as an ``ArrayRecord``, dtypes kept."""
    return ArrayRecord({name: Array(np.asarray(value)) for name, value in state.items()})


class InProcessAuditor:
    """:func:`service.audit.run_audit` in the ServerApp's process, statuses kept in memory.

    Parameters
    ----------
    audit_config : service.audit.AuditConfig
        The detectors, the aggregation rule and the status rule.
    privacy : client_sdk.SignalPolicy, optional
        The federation's signal privacy policy: the replies are read as the coordinator reads
        updates under it (:func:`audit_inputs`: no error counts under a ``count_bucket``, the
        Gaussian mechanism's noise as the per-class spread). None: no policy.
    """

    keeps_wrapped_when_undecided = True

    def __init__(self, audit_config: AuditConfig, privacy: SignalPolicy | None = None) -> None:
        self.audit_config = audit_config
        self.privacy = privacy
        self._history: dict[str, StatusHistory] = {}
        self._updates: dict[str, int] = {}  # audited updates per site (the privacy account)
        self._majority_rounds = 0  # rounds abstained for a majority (majority_memory)
        if privacy is not None and privacy.dp_active:
            accountant()  # ImportError (what to install) before any round, as the coordinator

    def audit_round(
        self, server_round: int, global_arrays: ArrayRecord, sites: Sequence[SiteReply]
    ) -> RoundAudit:
        """Run the audit on the replies; update the statuses (decided rounds only)."""
        clients = [audit_inputs(site, self.privacy) for site in sites]
        history = [self._history.get(c.client_id, StatusHistory()) for c in clients]
        outcome = run_audit(
            DictStateReader(numpy_state(global_arrays)),
            clients,
            self.audit_config,
            round_index=server_round - 1,
            status_history=history,
            majority_rounds=self._majority_rounds,
        )
        primary = outcome.detections[outcome.primary]
        summary = primary.summary
        self._majority_rounds += (
            isinstance(summary, EvidenceSummary) and summary.majority_suspected is True
        )
        for client in clients:
            self._updates[client.client_id] = self._updates.get(client.client_id, 0) + 1
        privacy = self._round_privacy(sites)
        return RoundAudit(
            sites=self._update_history(clients, history, outcome),
            detector=primary.method,
            detector_status=primary.status,
            detector_reason=primary.reason,
            rule=outcome.aggregation.rule,
            aggregate=array_record(dict(outcome.aggregation.state)),
            audit=outcome.to_json(),
            details={} if privacy is None else {"privacy": privacy},
        )

    def _round_privacy(self, sites: Sequence[SiteReply]) -> dict[str, Any] | None:
        """The round's privacy account under the Gaussian mechanism, as the coordinator's audit
        stores it (``service/coordinator/privacy_budget.py``): each noised signal a reply
        carries is one release; per site its releases and epsilon over every reply audited so
        far (this round's included). None without the mechanism."""
        policy = self.privacy
        if policy is None or not policy.dp_active:
            return None
        sigma, delta = float(policy.dp_noise_multiplier or 0.0), float(policy.dp_delta or 0.0)
        per_site = [releases_per_update(_sent_signals(site.signals)) for site in sites]
        totals = [
            k * self._updates[str(site.node_id)] for k, site in zip(per_site, sites, strict=True)
        ]
        account = round_account(sigma, delta, max(per_site, default=0), totals)
        return {**account, "node_ids": [site.node_id for site in sites]}

    def _update_history(
        self,
        clients: list[ClientRoundData],
        history: list[StatusHistory],
        outcome: AuditOutcome,
    ) -> list[SiteResult]:
        """Apply the status rule to this round's determined flags; return the per-site rows."""
        rule = self.audit_config.status
        primary = outcome.detections[outcome.primary]
        rows = []
        for i, (client, before) in enumerate(zip(clients, history, strict=True)):
            flag = outcome.primary_flags[i]
            after = before
            verdict = primary.verdicts[i]
            if flag is not None:
                window = (*before.flags, flag)[-rule.w :]
                status = next_status(before.status, list(window), m=rule.m, w=rule.w)
                # whose the latest flag is, as the coordinator's status history tells it
                by_geometry = (
                    before.by_geometry
                    if not flag
                    else verdict is not None and raised_by_geometry(verdict)
                )
                after = StatusHistory(status=status, flags=window, by_geometry=by_geometry)
            self._history[client.client_id] = after
            score = primary.scores[i]
            rows.append(
                SiteResult(
                    node_id=int(client.client_id),
                    num_samples=int(client.num_samples),
                    flag=flag,
                    status_before=before.status,
                    status=after.status,
                    weight=float(outcome.aggregation.weights[i]),
                    score=None if score is None else float(score),
                    verdict=None if verdict is None else verdict.to_json(),
                )
            )
        return rows

    def statuses(self) -> dict[int, SiteStatus]:
        """Each audited site's status and last determined flags."""
        return {
            int(cid): SiteStatus(h.status, tuple(bool(f) for f in h.flags if f is not None))
            for cid, h in self._history.items()
        }

    def report_fields(self) -> dict[str, Any]:
        """Nothing: the in-process report has no backend entry."""
        return {}


def mechanism_spread(class_counts: Sequence[int], policy: SignalPolicy | None) -> list[float]:
    """The per-sample spread whose class mean has the Gaussian mechanism's noise, per class:
    a mean of n_c samples carries noise of sd sigma B / n_c (``client_sdk/privacy.py``), the
    spread of a mean of n_c samples of per-sample sd s is s / sqrt(n_c), so s = sigma B /
    sqrt(n_c); NaN for a class the site does not hold (or whose count is suppressed). Empty
    without the mechanism. The coordinator's ``service/coordinator/audits.py`` gives its audit
    the same (it is not imported here, by the import contracts)."""
    if policy is None or not policy.dp_noise_multiplier or policy.dp_clip_loss is None:
        return []
    scale = float(policy.dp_noise_multiplier) * float(policy.dp_clip_loss)
    return [scale / math.sqrt(n) if n > 0 else math.nan for n in class_counts]


def audit_inputs(site: SiteReply, policy: SignalPolicy | None = None) -> ClientRoundData:
    """What the in-process audit reads of one reply, as the privacy policy lets it.

    As the coordinator reads an update (``service/coordinator/audits.py``,
    ``client_round_data``): a suppressed class count (None) is a class the site does not hold;
    under a ``count_bucket`` (> 1) the error counts are left out (rounded-up class counts bias
    their expected values); under the Gaussian mechanism the sites send no spreads, and the audit
    is given the noise's own (:func:`mechanism_spread`) as ``per_class_loss_sd``, so that the
    evidence counts the noise as sampling error.
    """
    signals = site.signals
    counts = [c or 0 for c in signals.class_counts]
    exact_counts = policy is None or policy.count_bucket <= 1
    spread: Sequence[float | None] | None = signals.per_class_loss_sd
    noise = mechanism_spread(counts, policy)
    if noise and signals.per_class_loss is not None:
        spread = noise
    return ClientRoundData(
        client_id=str(site.node_id),
        num_samples=signals.num_samples,
        class_counts=counts,
        per_class_loss=signals.per_class_loss,
        per_class_loss_sd=spread,
        per_class_errors=signals.per_class_errors if exact_counts else None,
        per_class_confident_errors=signals.per_class_confident_errors if exact_counts else None,
        train_loss=signals.train_loss,
        train_accuracy=signals.train_accuracy,
        probe_softmax=signals.probe_softmax,
        centroids=signals.centroids,
        state=DictStateReader(numpy_state(site.arrays)),
    )
