"""A Flower strategy that audits each training round with fedaudit, in process or forwarded.

:class:`FedAuditStrategy` wraps a message-API strategy (``flwr.serverapp.strategy``, FedAvg by
default). Sampling, configuration and evaluation are the wrapped strategy's. After each
training round, :meth:`FedAuditStrategy.aggregate_train`:

1. lets the wrapped strategy aggregate the replies as it always does;
2. reads every reply's model (its ``ArrayRecord``) and fedaudit signals (the ``ConfigRecord``
   under :data:`~fedaudit_flower.SIGNALS_KEY`, written by the ClientApp helper
   :func:`~fedaudit_flower.signals_record`), and has its auditor audit them against the global
   model sent this round, with each site's status history: :func:`service.audit.run_audit` in
   process (:class:`~fedaudit_flower.auditing.InProcessAuditor`, the default), or the same audit
   on a running fedaudit coordinator the round is forwarded to over HTTP
   (``coordinator=CoordinatorConnection(url, admin_token)``,
   :mod:`fedaudit_flower.coordinator`);
3. when the primary detector decided (status ``ok``), returns the audit's aggregate (its rule and
   weights: with the default :data:`DEFAULT_AUDIT_CONFIG`, DaAgg down-weights the sites whose
   status is "noisy"); when it did not (``undetermined``, ``inconclusive``), it keeps the
   wrapped strategy's aggregate and says why, except when forwarding, where the coordinator's
   aggregate is the round's model in every audited round (so that the Flower global model is
   the one the coordinator audits the next round against; the coordinator module says more).
   When the audit could not run (a reply without signals, no global model seen), the wrapped
   strategy's aggregate is kept in both modes;
4. updates each site's status (trusted, suspect, noisy: the rule of
   :func:`service.audit.next_status` over its determined flags; when forwarding, the
   coordinator's), adds the audit to the round's ``MetricRecord`` (keys ``fedaudit.*``, below)
   and rewrites the JSON report file.

Sites are Flower nodes: a site's id in the audit is its node id as a decimal string.

Metrics added to the round's ``MetricRecord`` (lists aligned with ``fedaudit.node_ids``, sites
in increasing node id):

==========================  ===================================================================
``fedaudit.decided``        1 when the primary detector decided, else 0
``fedaudit.applied``        1 when the audit's or coordinator's aggregate replaced the wrapped
``fedaudit.num_flagged``    sites the primary detector flagged this round
``fedaudit.num_noisy``      sites whose status is "noisy" after the round
``fedaudit.node_ids``       the audited sites
``fedaudit.flags``          1 flagged, 0 not flagged, -1 no verdict (undetermined, inconclusive)
``fedaudit.status``         after the round: 0 trusted, 1 suspect, 2 noisy
``fedaudit.weights``        the audit's aggregation weights (applied only when ``applied``)
``fedaudit.scores``         the primary detector's scores (higher = noisier; NaN: none)
==========================  ===================================================================
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy

from client_sdk._responses import SignalPolicy
from client_sdk.flower_report import FLOWER_REPORT_FORMAT
from client_sdk.privacy import PER_CLASS_SIGNALS
from fedaudit_flower._records import (
    SIGNALS_KEY,
    SignalsFormatError,
    WireSignals,
    decode_signals,
    policy_entries,
)
from fedaudit_flower.auditing import AuditNotRun, Auditor, InProcessAuditor, RoundAudit, SiteReply
from fedaudit_flower.coordinator import CoordinatorAuditor, CoordinatorConnection
from service.audit import AuditConfig, InvalidInputError

__all__ = ["DEFAULT_AUDIT_CONFIG", "REPORT_FORMAT", "STATUS_CODES", "FedAuditStrategy"]

_log = logging.getLogger(__name__)

DEFAULT_AUDIT_CONFIG = AuditConfig(aggregation="daagg")
"""The calibrated evidence detector, FedNoRo's distance-aware aggregation (DaAgg) over the sites
whose status is "noisy" (flagged in 2 of their last 3 decided rounds), the weight cap at 4 / K."""

REPORT_FORMAT = FLOWER_REPORT_FORMAT
"""Value of the report file's ``format`` entry (``fedaudit report --file`` reads the file:
:mod:`client_sdk.flower_report`)."""

STATUS_CODES = {"trusted": 0, "suspect": 1, "noisy": 2}
"""How ``fedaudit.status`` encodes a status in the (numeric) ``MetricRecord``."""


class FedAuditStrategy(Strategy):
    """Wrap a Flower strategy and audit every training round with fedaudit.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy, optional
        The strategy to wrap (``FedAvg()`` when omitted). It samples, configures and evaluates,
        and its aggregate is kept whenever the audit does not decide (in process).
    audit_config : service.audit.AuditConfig, optional
        The audit's detectors, aggregation rule and status rule (:data:`DEFAULT_AUDIT_CONFIG`).
    report_path : str or pathlib.Path, optional
        JSON file rewritten (atomically) after every training round; None: no file.
    signals_key : str
        Key of the signals' ``ConfigRecord`` in each reply (:data:`~fedaudit_flower.SIGNALS_KEY`).
    arrayrecord_key : str, optional
        Key of the model's ``ArrayRecord`` in each reply; None: the reply's only ``ArrayRecord``.
    coordinator : fedaudit_flower.CoordinatorConnection, optional
        Forward every round to this running fedaudit coordinator and apply the audit it stores
        (:mod:`fedaudit_flower.coordinator`); None (default): audit in process.
    privacy : client_sdk.SignalPolicy, optional
        The federation's signal privacy policy: sent to the sites in every training message's
        config (``fedaudit.privacy.*``, read by :func:`~fedaudit_flower.privacy_policy` for
        :func:`~fedaudit_flower.signals_record`), and every reply's signals are checked against
        it: a reply that breaks it leaves the round not audited, the reason naming the node.
        The audit reads the replies as the coordinator reads updates under the policy (no error
        counts under a ``count_bucket``, the Gaussian mechanism's noise as the per-class
        spread); when forwarding, the coordinator's federation is created with the policy.

    Attributes
    ----------
    rounds : list of dict
        One entry per training round, as in the report file's ``rounds``.
    auditor : fedaudit_flower.auditing.Auditor
        The backend: :class:`~fedaudit_flower.auditing.InProcessAuditor` or
        :class:`~fedaudit_flower.coordinator.CoordinatorAuditor`.
    """

    def __init__(
        self,
        strategy: Strategy | None = None,
        *,
        audit_config: AuditConfig | None = None,
        report_path: str | os.PathLike[str] | None = None,
        signals_key: str = SIGNALS_KEY,
        arrayrecord_key: str | None = None,
        coordinator: CoordinatorConnection | None = None,
        privacy: SignalPolicy | None = None,
    ) -> None:
        self.strategy: Strategy = FedAvg() if strategy is None else strategy
        self.audit_config = DEFAULT_AUDIT_CONFIG if audit_config is None else audit_config
        if not isinstance(self.audit_config, AuditConfig):
            raise TypeError("audit_config: expected a service.audit.AuditConfig")
        if coordinator is not None and not isinstance(coordinator, CoordinatorConnection):
            raise TypeError("coordinator: expected a fedaudit_flower.CoordinatorConnection")
        self.report_path = None if report_path is None else Path(report_path)
        self.signals_key = signals_key
        self.arrayrecord_key = arrayrecord_key
        if privacy is not None and not isinstance(privacy, SignalPolicy):
            raise TypeError("privacy: expected a client_sdk.SignalPolicy")
        self.privacy = privacy
        self.rounds: list[dict[str, Any]] = []
        self.auditor: Auditor = (
            InProcessAuditor(self.audit_config, privacy)
            if coordinator is None
            else CoordinatorAuditor(coordinator, self.audit_config, privacy)
        )
        self._global: ArrayRecord | None = None

    # -- the wrapped strategy's work -----------------------------------------------------------

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Run the federation as :meth:`flwr.serverapp.strategy.Strategy.start` does.

        With a coordinator, its federation is planned for ``num_rounds`` rounds (unless the
        connection sets ``rounds``), so it finishes with the Flower run; its HTTP clients are
        closed at the end.
        """
        if isinstance(self.auditor, CoordinatorAuditor):
            self.auditor.planned_rounds = num_rounds
        try:
            return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)
        finally:
            self.close()

    def close(self) -> None:
        """Close the coordinator's HTTP clients, if any (they reopen when needed)."""
        if isinstance(self.auditor, CoordinatorAuditor):
            self.auditor.close()

    def summary(self) -> None:
        """Log the wrapped strategy's summary and the audit's rule."""
        self.strategy.summary()
        _log.info(
            "fedaudit: primary detector %r, aggregation %r when it decides%s",
            self.audit_config.primary_detector,
            self.audit_config.aggregation,
            "" if isinstance(self.auditor, InProcessAuditor) else ", forwarded to a coordinator",
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the global model sent this round (the audit's theta_G), add the privacy
        policy to the config, then delegate."""
        self.set_global_arrays(arrays)
        if self.privacy is not None:
            config = ConfigRecord({**dict(config.items()), **policy_entries(self.privacy)})
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Delegate to the wrapped strategy."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Delegate to the wrapped strategy."""
        return self.strategy.aggregate_evaluate(server_round, replies)

    def set_global_arrays(self, arrays: ArrayRecord) -> None:
        """Set the global model the next :meth:`aggregate_train` audits against.

        :meth:`configure_train` calls it; call it yourself only when replies reach
        :meth:`aggregate_train` without going through this strategy's ``configure_train``.
        """
        self._global = arrays

    @property
    def statuses(self) -> dict[str, str]:
        """Each audited site's status (node id as a string -> trusted / suspect / noisy)."""
        return {str(node): s.status for node, s in self.auditor.statuses().items()}

    # -- the audit -----------------------------------------------------------------------------

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate with the wrapped strategy, audit, and use the audit's aggregate if decided.

        Returns
        -------
        tuple of (ArrayRecord or None, MetricRecord or None)
            The audit's aggregate when its primary detector decided, else the wrapped
            strategy's (in process) or the coordinator's (forwarding); the wrapped strategy's
            metrics plus the ``fedaudit.*`` entries.
        """
        replies = list(replies)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        metrics = MetricRecord() if metrics is None else MetricRecord(dict(metrics.items()))
        valid = sorted(
            (m for m in replies if not m.has_error() and m.has_content()),
            key=lambda m: m.metadata.src_node_id,
        )
        entry: dict[str, Any] = {"round": server_round, "sites": len(valid)}
        try:
            sites = [self._site(m) for m in valid]
            if not sites:
                raise AuditNotRun("no reply without an error")
            if self._global is None:
                raise AuditNotRun("no global model: configure_train was not called")
            audit = self.auditor.audit_round(server_round, self._global, sites)
        except (AuditNotRun, InvalidInputError, SignalsFormatError) as exc:
            why = f"not audited: {exc}"
            _log.warning(
                "fedaudit round %d: %s; the wrapped strategy's aggregate is kept",
                server_round,
                why,
            )
            entry.update(audited=False, decided=False, applied="wrapped", reason=why)
            metrics["fedaudit.decided"] = 0
            metrics["fedaudit.applied"] = 0
            self._finish(entry)
            return arrays, metrics

        arrays, applied, reason = self._choose(server_round, arrays, audit)
        entry.update(
            audited=True,
            decided=audit.decided,
            applied=applied,
            reason=reason,
            detector_status=audit.detector_status,
            rule=audit.rule,
            clients=[site.row() for site in audit.sites],
            audit=audit.audit,
            **audit.details,
        )
        metrics.update(round_metrics(audit, applied=applied != "wrapped"))
        self._finish(entry)
        return arrays, metrics

    def _choose(
        self, server_round: int, wrapped: ArrayRecord | None, audit: RoundAudit
    ) -> tuple[ArrayRecord | None, str, str | None]:
        """The round's model, what it is (audit, wrapped, coordinator) and why, when not the
        audit's decided aggregate."""
        if audit.decided:
            return audit.aggregate, "audit", None
        why = (
            f"primary detector {audit.detector!r} {audit.detector_status} ({audit.detector_reason})"
        )
        if self.auditor.keeps_wrapped_when_undecided:
            reason = f"{why}: the wrapped strategy's aggregate is kept"
            _log.info("fedaudit round %d: %s", server_round, reason)
            return wrapped, "wrapped", reason
        reason = (
            f"{why}: the coordinator's aggregate is used, so that the Flower global model stays "
            "the one the coordinator audits the next round against"
        )
        _log.info("fedaudit round %d: %s", server_round, reason)
        return audit.aggregate, "coordinator", reason

    def _site(self, message: Message) -> SiteReply:
        content = message.content
        node = str(message.metadata.src_node_id)
        if self.signals_key not in content.config_records:
            raise AuditNotRun(f"node {node} sent no {self.signals_key!r} ConfigRecord")
        try:
            signals = decode_signals(content.config_records[self.signals_key])
        except SignalsFormatError as exc:
            raise SignalsFormatError(f"node {node}: {exc}") from None
        if self.privacy is not None:
            problems = policy_problems(signals, self.privacy)
            if problems:
                raise AuditNotRun(
                    f"node {node}'s signals break the privacy policy: {'; '.join(problems)}"
                )
        if self.arrayrecord_key is not None:
            if self.arrayrecord_key not in content.array_records:
                raise AuditNotRun(f"node {node} sent no ArrayRecord {self.arrayrecord_key!r}")
            record = content.array_records[self.arrayrecord_key]
        elif len(content.array_records) == 1:
            record = next(iter(content.array_records.values()))
        else:
            raise AuditNotRun(
                f"node {node} sent {len(content.array_records)} ArrayRecords; set arrayrecord_key"
            )
        return SiteReply(node_id=int(message.metadata.src_node_id), signals=signals, arrays=record)

    def _finish(self, entry: dict[str, Any]) -> None:
        self.rounds.append(entry)
        if self.report_path is not None:
            write_json_atomically(self.report_path, self.report())

    def report(self) -> dict[str, Any]:
        """Return the report: the audit configuration, every round, and each site's status."""
        return {
            "format": REPORT_FORMAT,
            "wrapped_strategy": type(self.strategy).__name__,
            **self.auditor.report_fields(),
            "audit_config": self.audit_config.to_json(),
            "rounds": self.rounds,
            "statuses": {
                str(node): {"status": s.status, "recent_flags": list(s.recent_flags)}
                for node, s in sorted(self.auditor.statuses().items())
            },
        }


def round_metrics(audit: RoundAudit, *, applied: bool) -> dict[str, Any]:
    """The ``fedaudit.*`` entries of an audited round's ``MetricRecord``."""
    sites = audit.sites
    return {
        "fedaudit.decided": int(audit.decided),
        "fedaudit.applied": int(applied),
        "fedaudit.num_flagged": sum(1 for s in sites if s.flag),
        "fedaudit.num_noisy": sum(1 for s in sites if s.status == "noisy"),
        "fedaudit.node_ids": [s.node_id for s in sites],
        "fedaudit.flags": [-1 if s.flag is None else int(s.flag) for s in sites],
        "fedaudit.status": [STATUS_CODES[s.status] for s in sites],
        "fedaudit.weights": [float(s.weight) for s in sites],
        "fedaudit.scores": [math.nan if s.score is None else float(s.score) for s in sites],
    }


def write_json_atomically(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` through a temporary file and a rename (no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, allow_nan=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def policy_problems(signals: WireSignals, policy: SignalPolicy) -> list[str]:
    """What a reply's signals send that the privacy policy forbids (empty when none), checked
    as the coordinator checks an update (``service/coordinator/signal_policy.py``: it is not
    imported here, by the import contracts): a class count below ``min_class_count`` not
    suppressed, a suppressed class when none is, a count not a multiple of ``count_bucket``;
    under the Gaussian mechanism a spread or error counts, or a mean loss outside [0, B]. The
    messages name the settings, not the values sent. The noise itself cannot be checked."""
    m, b = policy.min_class_count, max(policy.count_bucket, 1)
    found: list[str] = []
    for c, count in enumerate(signals.class_counts):
        if count is None and m <= 1:
            found.append(f"class_counts[{c}]: suppressed, but the policy suppresses no class")
        elif count is not None and 0 < count < m:
            found.append(f"class_counts[{c}]: below min_class_count {m}, must be suppressed")
        elif count is not None and count % b:
            found.append(f"class_counts[{c}]: not a multiple of count_bucket {b}")
    if signals.num_samples % b:
        found.append(f"num_samples: not a multiple of count_bucket {b}")
    for name in PER_CLASS_SIGNALS:
        values = getattr(signals, name) or []
        for c, count in enumerate(signals.class_counts):
            if count is None and c < len(values) and values[c] is not None:
                found.append(f"{name}[{c}]: sent for a suppressed class")
    if policy.dp_active:
        for name in PER_CLASS_SIGNALS[1:]:
            if getattr(signals, name) is not None:
                found.append(f"{name}: not sent under the Gaussian mechanism")
        bound = policy.dp_clip_loss
        for c, value in enumerate(signals.per_class_loss or []):
            if value is not None and bound is not None and not 0.0 <= value <= bound:
                found.append(f"per_class_loss[{c}]: outside [0, dp_clip_loss {bound}]")
    return found
