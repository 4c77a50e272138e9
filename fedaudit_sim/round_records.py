"""Per-round records of a simulated federation, read from the coordinator's stored audit.

:func:`round_record` turns what the coordinator stored about one closed round (``get_round``:
its ``audit`` and ``coordinator_seconds``), the clients' statuses, the global model's accuracy
and what each client's training reported (:class:`ClientRound`) into a
:class:`~fedaudit_sim.records.RoundRecord`. The audit lists its clients in its own order
(``client_ids``), not in the simulator's: every per-client value is looked up by client id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fedaudit_sim.records import ClientRoundRecord, RoundRecord

if TYPE_CHECKING:
    from fedaudit_sim.preparation import ModelScores

__all__ = [
    "ClientRound",
    "Roster",
    "round_record",
]


@dataclass
class ClientRound:
    """What one client's training of a round reported: its role and the SDK's summary."""

    role: str | None
    summary: Any  # client_sdk RoundSummary


class Roster(Protocol):
    """The clients of a federation: names in index order, their ids, the resolved config."""

    names: list[str]
    ids: dict[str, str]
    config: dict[str, Any]


@dataclass(frozen=True)
class _StoredAudit:
    """The parts of a round's stored audit that are read per client, parsed once."""

    position: dict[str, int]
    name_of: dict[str, str]
    detections: dict[str, Any]
    weights: list[Any]
    expertise: list[Any] | None
    neighbors: dict[str, Any]
    self_weights: dict[str, Any]
    primary_flags: list[Any]

    @classmethod
    def parse(cls, audit: dict[str, Any], roster: Roster) -> _StoredAudit:
        """Read ``audit`` (the stored JSON, ``{}`` when the round has none)."""
        ids: list[str] = list(audit.get("client_ids") or [])
        return cls(
            position={cid: i for i, cid in enumerate(ids)},
            name_of={cid: name for name, cid in roster.ids.items()},
            detections=audit.get("detections") or {},
            weights=(audit.get("aggregation") or {}).get("weights") or [],
            expertise=audit.get("expertise"),
            neighbors=audit.get("neighbors") or {},
            self_weights=audit.get("self_weights") or {},
            primary_flags=audit.get("primary_flags") or [],
        )


def _float_or_none(value: Any) -> float | None:
    """``value`` as a float, None stays None."""
    return None if value is None else float(value)


def _at(values: list[Any], pos: int | None) -> Any:
    """``values[pos]``, or None when the client has no position or the list is shorter."""
    return values[pos] if pos is not None and pos < len(values) else None


def round_record(
    roster: Roster,
    round_index: int,
    info: Any,
    statuses: dict[str, str],
    acc: ModelScores,
    trained: tuple[float, list[ClientRound]],
) -> RoundRecord:
    """The record of one closed round.

    Parameters
    ----------
    roster : Roster
        The federation's clients (names in index order, ids) and its resolved config.
    round_index : int
    info : client_sdk round
        What ``AdminClient.get_round`` returned (``audit``, ``coordinator_seconds``,
        ``aggregation_rule``).
    statuses : dict
        Client name -> status after the round.
    acc : ModelScores
        The global model's accuracy, balanced accuracy and per-class recall on the test split.
    trained : tuple
        The round's wall seconds and, per client in index order, its :class:`ClientRound`.
    """
    audit: dict[str, Any] = {} if info.audit is None else info.audit.model_dump()
    stored = _StoredAudit.parse(audit, roster)
    wall, trained_clients = trained
    clients = [
        _client_round_record(stored, name, roster.ids[name], statuses, trained_clients[k])
        for k, name in enumerate(roster.names)
    ]
    primary = audit.get("primary")
    primary_summary = (stored.detections.get(primary or "") or {}).get("summary") or {}
    aggregation = audit.get("aggregation") or {}
    warmup_rounds = int(roster.config["warmup_rounds"])
    return RoundRecord(
        index=round_index,
        in_warmup=(
            round_index < warmup_rounds
            if audit.get("in_warmup") is None
            else bool(audit["in_warmup"])
        ),
        accuracy=acc.accuracy,
        balanced_accuracy=acc.balanced_accuracy,
        class_recall=acc.class_recall,
        coordinator_seconds=_float_or_none(info.coordinator_seconds),
        wall_seconds=wall,
        aggregation_rule=info.aggregation_rule or aggregation.get("rule"),
        fallback_reason=aggregation.get("fallback_reason"),
        primary=primary,
        detector_status={n: d.get("status") for n, d in stored.detections.items()},
        detector_reason={n: d.get("reason") for n, d in stored.detections.items()},
        ashman_d=_float_or_none(primary_summary.get("ashman_d")),
        clients=clients,
    )


def _client_round_record(
    stored: _StoredAudit,
    name: str,
    cid: str,
    statuses: dict[str, str],
    trained: ClientRound,
) -> ClientRoundRecord:
    """What the round's audit and the client's training said about client ``name``."""
    pos = stored.position.get(cid)
    entries, normalised = _detector_entries(stored.detections, pos)
    summary = trained.summary
    metrics: dict[str, Any] = dict(summary.metrics)
    return ClientRoundRecord(
        name=name,
        role=trained.role,
        detectors=entries,
        primary_flag=_at(stored.primary_flags, pos),
        status=statuses.get(name),
        expertise=(
            _float_or_none(stored.expertise[pos])
            if stored.expertise is not None and pos is not None
            else None
        ),
        neighbors=(
            [stored.name_of.get(n["client_id"], n["client_id"]) for n in stored.neighbors[cid]]
            if cid in stored.neighbors
            else None
        ),
        self_weight=_float_or_none(stored.self_weights.get(cid)),
        weight=_float_or_none(_at(stored.weights, pos)),
        train_loss=_float_or_none(summary.train_loss),
        train_seconds=float(summary.train_seconds),
        signal_seconds=float(summary.signal_seconds),
        upload_bytes=int(summary.upload_bytes),
        download_bytes=int(summary.download_bytes),
        label_precision=_float_or_none(metrics.get("label_precision")),
        label_recall=_float_or_none(metrics.get("label_recall")),
        normalised_loss=normalised,
    )


def _detector_entries(
    detections: dict[str, Any], pos: int | None
) -> tuple[dict[str, dict[str, Any]], Any]:
    """Each detector's verdict on the client at ``pos`` (``{"status", "score", "flag",
    "noisiness"}``, plus FedNoRo's evidence) and FedNoRo's normalised losses (None if absent).

    A detector whose status is not ``ok`` gives no verdict (score and flag None).
    """
    entries: dict[str, dict[str, Any]] = {}
    normalised = None
    for det_name, detection in detections.items():
        verdict = _at(detection.get("verdicts") or [], pos)
        if detection.get("status") != "ok":
            verdict = None
        score = None if verdict is None else _float_or_none(verdict.get("score"))
        entries[det_name] = {
            "status": detection.get("status"),
            "score": score,
            "flag": None if verdict is None else verdict.get("flag"),
            "noisiness": score,
        }
        if det_name == "fednoro" and verdict is not None:
            evidence = verdict.get("evidence") or {}
            entries[det_name].update(_fednoro_evidence(evidence))
            normalised = evidence.get("normalised_loss")
    return entries, normalised


def _fednoro_evidence(evidence: dict[str, Any]) -> dict[str, float | None]:
    """The graded statistics behind FedNoRo's flags, from its verdict's evidence."""
    return {
        # the client's mean loss on its own labels under the global model (the separation
        # guard's input)
        "mean_loss": _float_or_none(evidence.get("mean_loss")),
        # the same loss standardised class by class (the guard's default input)
        "class_z": _float_or_none(evidence.get("class_z")),
        # the mixture's posterior before the guard (two-group membership)
        "posterior": _float_or_none(evidence.get("gmm_noisy_probability")),
    }
