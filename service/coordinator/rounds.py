"""Round lifecycle: open, tell each client what to do, close exactly once (the deadline checker
that closes or extends a round at its deadline is `service.coordinator.reaper`).

A round opens with its selected clients and their instructions. It closes exactly once when every
selected client has submitted, or at the deadline when at least ``min_clients`` did (otherwise the
deadline is extended and the extension recorded). Closing runs the audit on the stored updates,
aggregates, stores the new global model and opens the next round, all in one transaction that
starts with a compare-and-set on the round's state (see `repositories.claim_round_for_close`), so
two closers — threads, processes or replicas — never both close a round, and a crash half-way
rolls back to an open round whose updates are all still stored.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from service.audit import next_status
from service.coordinator import attendance, audits, retention, round_events
from service.coordinator.notify import mark_changed
from service.coordinator.resources import Services
from service.coordinator.signal_policy import policy_of
from service.coordinator.stored_audit import read_audit
from service.errors import FederationStateError, NotFoundError
from service.store import repositories as repo
from service.store.poll_state import PollState, poll_state
from service.store.tables import (
    ENDED_STATUSES,
    AuditResult,
    Client,
    Federation,
    ModelVersion,
    Round,
)

log = logging.getLogger(__name__)

WAIT_AGGREGATING_S = 0.5
WAIT_DEFAULT_S = 2.0


@dataclass(frozen=True)
class OpenRound:
    """The open round a site is told to train in."""

    id: uuid.UUID
    index: int
    deadline_at: datetime


@dataclass(frozen=True)
class Train:
    round: OpenRound
    instructions: dict[str, Any]


@dataclass(frozen=True)
class Wait:
    retry_after_s: float
    reason: str
    # in an open round the site has sent its update to: how many sites the round selected and
    # how many have sent theirs (counts only: a site learns no other site's name)
    sites_selected: int | None = None
    sites_submitted: int | None = None


@dataclass(frozen=True)
class Finished:
    final_model_id: uuid.UUID | None


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (same inputs, same seed, on every machine)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def effective_status(client: Client) -> str:
    return client.pinned_status or client.status


# --- opening -----------------------------------------------------------------------------------


def select_clients(federation: Federation, available: list[Client], index: int) -> list[Client]:
    """Every site that may take part (`attendance.pool`), or a seeded random subset of
    max_clients of them."""
    if federation.max_clients is None or len(available) <= federation.max_clients:
        return list(available)
    rng = random.Random(derive_seed(federation.seed, "select", index))
    chosen = rng.sample(available, federation.max_clients)
    return sorted(chosen, key=lambda c: (c.name, str(c.id)))


def open_round(
    session: Session,
    federation: Federation,
    *,
    index: int,
    model: ModelVersion,
    now: datetime,
    previous_audit: AuditResult | None,
) -> Round:
    available = attendance.pool(federation, repo.joined_clients(session, federation.id))
    selected = select_clients(federation, available.available, index)
    rnd = Round(
        federation_id=federation.id,
        index=index,
        state="open",
        opened_at=now,
        deadline_at=now + timedelta(seconds=federation.round_deadline_s),
        model_in_id=model.id,
        probe_seed=derive_seed(federation.seed, "probe", index),
    )
    repo.add(session, rnd)
    mark_changed(session, federation.id)
    instructions = build_instructions(session, federation, rnd, model, selected, previous_audit)
    repo.add_participants(session, rnd.id, instructions)
    repo.add_event(
        session,
        kind="round.opened",
        actor="system",
        message=f"round {index} opened with {len(selected)} clients",
        federation_id=federation.id,
        round_id=rnd.id,
        data={
            "index": index,
            "clients": [str(c.id) for c in selected],
            "model_in": str(model.id),
            "deadline_at": rnd.deadline_at.isoformat(),
            "left_out": available.left_out(),
        },
    )
    return rnd


class ProbeSpec(TypedDict):
    """The random probe inputs a site computes its softmax signature on (FedRN)."""

    seed: int
    size: int


class SiteInstructions(TypedDict):
    """What one selected site is told to do in a round, as stored with its participation and
    sent in ``rounds/current`` (the API's ``Instructions``)."""

    recipe: str
    hyperparameters: dict[str, Any]
    """The recipe's typed hyper-parameters (``service.coordinator.hyperparameters``), as JSON."""
    global_model_id: str
    global_model_sha256: str
    round_index: int
    total_rounds: int
    num_classes: int
    input_shape: list[int]
    signals: list[str]
    probe: ProbeSpec | None
    centroids: list[list[float]] | None
    deadline_at: str
    privacy: dict[str, Any]
    """The federation's signal policy (``SignalPolicy``), as JSON."""
    seed: int
    role: Literal["clean", "noisy"]
    distil_classes: list[int] | None  # kd_scope "classes": what a noisy site distils (None: all)
    label_correction: bool
    neighbors: list[audits.AssignedNeighbor]
    self_weight: float | None


def build_instructions(
    session: Session,
    federation: Federation,
    rnd: Round,
    model: ModelVersion,
    selected: list[Client],
    previous_audit: AuditResult | None,
) -> dict[uuid.UUID, SiteInstructions]:
    """What each selected client is told to do in this round."""
    config = federation.config
    after_warmup = rnd.index >= config["warmup_rounds"]
    signals = list(config["signals"])
    neighbor_sets = audits.neighbor_assignments(session, federation, previous_audit)
    t_corr, alpha = int(config["audit"]["fedncl_t_corr"]), float(config["audit"]["fedncl_alpha"])
    probe: ProbeSpec | None = None
    if "probe_softmax" in signals:
        probe = {"seed": rnd.probe_seed, "size": config["probe_size"]}
    privacy = policy_of(config).model_dump()
    noisy = {c.id for c in selected if after_warmup and effective_status(c) == "noisy"}
    distil = audits.distil_classes(previous_audit, selected, noisy, federation)
    result: dict[uuid.UUID, SiteInstructions] = {}
    for client in selected:
        neighbors, self_weight = neighbor_sets.get(client.id, ([], None))
        result[client.id] = SiteInstructions(
            recipe=config["recipe"],
            hyperparameters=config["hyperparameters"],
            global_model_id=str(model.id),
            global_model_sha256=model.sha256,
            round_index=rnd.index,
            total_rounds=federation.rounds,
            num_classes=federation.num_classes,
            input_shape=federation.input_shape,
            signals=signals,
            probe=probe,
            centroids=federation.centroids if config["recipe"] == "rofl" else None,
            deadline_at=rnd.deadline_at.isoformat(),
            privacy=privacy,
            # by name, not by its random id: the same federation seed gives the same run
            seed=derive_seed(federation.seed, "client", client.name, rnd.index),
            role="noisy" if client.id in noisy else "clean",
            distil_classes=distil.get(client.id),
            label_correction=audits.is_correction_candidate(client, t_corr, alpha),
            neighbors=neighbors,
            self_weight=self_weight,
        )
    return result


def maybe_start(session: Session, federation: Federation, now: datetime, *, force: bool) -> bool:
    """Open round 0 when every registered client has joined (or when forced by the admin)."""
    if federation.status != "waiting" or federation.current_model_id is None:
        if force:
            raise FederationStateError(
                f"federation {federation.name!r} cannot start from status {federation.status}"
                + (" (upload the initial model first)" if federation.status == "created" else "")
            )
        return False
    # counted in the database: every join of a federation that waits for its sites asks this
    counts = repo.federation_counts(session, [federation.id])[federation.id]
    joined, registered = counts["joined_clients"], counts["clients"]
    if joined < federation.min_clients:
        if force:
            raise FederationStateError(
                f"only {joined} clients joined; the federation needs at least "
                f"{federation.min_clients} per round"
            )
        return False
    if not force and joined < registered:
        return False
    available = len(
        attendance.pool(federation, repo.joined_clients(session, federation.id)).available
    )
    if available < federation.min_clients:
        if force:
            raise FederationStateError(
                f"only {available} of the {joined} sites that joined can take part (the others "
                f"are suspended or their tokens revoked); the federation needs at least "
                f"{federation.min_clients} per round"
            )
        return False
    model = repo.get_model_version(session, federation.current_model_id)
    assert model is not None
    federation.status = "running"
    open_round(session, federation, index=0, model=model, now=now, previous_audit=None)
    repo.add_event(
        session,
        kind="federation.started",
        actor="system",
        message=f"federation started with {joined} of {registered} clients joined",
        federation_id=federation.id,
    )
    return True


def start_now(services: Services, federation_id: uuid.UUID) -> Federation:
    """The admin's "start": open round 0 now with the clients that have joined, and commit."""
    with services.sessions.begin() as session:
        # locked as in a join (`clients.join`), so a start and a last join never both open round 0
        federation = repo.lock_federation(session, federation_id)
        if federation is None:
            raise NotFoundError(f"federation {federation_id} does not exist")
        maybe_start(session, federation, services.clock(), force=True)
        return federation


# --- what a client sees ------------------------------------------------------------------------


def current_for(services: Services, client_id: uuid.UUID) -> Train | Wait | Finished:
    """What the client should do now, read in a short session of its own (a long-poll calls
    this again after each change signal and holds no connection in between)."""
    with services.sessions() as session:
        state = poll_state(session, client_id)
        answer = answer_poll(state, client_id)
    if state is not None and state.absent:
        attendance.mark_returned(services, client_id)  # the one write a poll can make
    return answer


def current_for_client_id(session: Session, client_id: uuid.UUID) -> Train | Wait | Finished:
    """What the client should do now, from one read of its federation's state
    (:func:`service.store.poll_state.poll_state`); writes nothing."""
    return answer_poll(poll_state(session, client_id), client_id)


def answer_poll(state: PollState | None, client_id: uuid.UUID) -> Train | Wait | Finished:
    """The answer to a site's poll in the state read."""
    if state is None:
        raise NotFoundError(f"client {client_id} does not exist")
    if state.federation_status == "finished":
        return Finished(final_model_id=state.current_model_id)
    if state.federation_status in ("failed", "stopped"):
        how = "failed:" if state.federation_status == "failed" else "was"  # "was stopped by ..."
        raise FederationStateError(
            f"federation {state.federation_name!r} {how} {state.status_reason}"
        )
    if state.federation_status == "created":
        return Wait(WAIT_DEFAULT_S, "the federation has not started (no initial model yet)")
    if state.federation_status == "waiting":
        return Wait(
            WAIT_DEFAULT_S,
            f"the federation has not started: {state.joined_clients or 0} of {state.clients or 0} "
            "sites joined",
        )
    if not state.joined:
        return Wait(WAIT_DEFAULT_S, "join the federation first")
    if state.suspended and not state.has_update:
        return Wait(WAIT_DEFAULT_S, "suspended by the federation's admin until they resume it")
    if state.round_id is None or state.round_index is None or state.deadline_at is None:
        return Wait(WAIT_AGGREGATING_S, "the last round is being aggregated")
    if not state.selected or state.instructions is None:
        return Wait(WAIT_DEFAULT_S, f"not selected for round {state.round_index}")
    if state.has_update:
        total, sent = state.sites_selected or 0, state.sites_submitted or 0
        return Wait(
            WAIT_AGGREGATING_S,
            f"update for round {state.round_index} received; {sent} of {total} sites sent "
            f"theirs, waiting for {total - sent}",
            sites_selected=total,
            sites_submitted=sent,
        )
    return Train(
        round=OpenRound(state.round_id, state.round_index, state.deadline_at),
        instructions=state.instructions,
    )


# --- closing -----------------------------------------------------------------------------------


def participation(session: Session, rnd: Round) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """The selected clients and those that have submitted."""
    return repo.selected_client_ids(session, rnd.id), repo.submitted_client_ids(session, rnd.id)


def round_is_complete(session: Session, rnd: Round) -> bool:
    """Whether the round selected clients and every one of them has submitted (counted in the
    database: an update is unique per round and client, so all have when the counts agree)."""
    selected, submitted = repo.participation_counts(session, rnd.id)
    return selected > 0 and submitted == selected


def close_round(services: Services, round_id: uuid.UUID, *, reason: str) -> bool:
    """Close the round once: audit, aggregate, store the new model, open the next round.

    Returns False when the round was not open (already closed by someone else). Expected
    transient database errors leave the round open for the next attempt; any other error marks
    the round failed (with the reason) in a separate transaction, so it is not retried forever.
    Transient: `OperationalError`, and `sqlalchemy.exc.TimeoutError` (the pool had no connection
    free in time).
    """
    started = time.perf_counter()
    try:
        with services.sessions.begin() as session:
            if not repo.claim_round_for_close(session, round_id):
                return False
            _close_claimed(services, session, round_id, reason=reason, started=started)
        return True
    except (OperationalError, PoolTimeoutError):
        # A busy pool (no connection free in time) is as transient as a dropped connection.
        log.exception("closing round %s hit a database error; it stays open", round_id)
        raise
    except Exception as exc:
        log.exception("closing round %s failed", round_id)
        _mark_failed(services, round_id, f"{type(exc).__name__}: {exc}")
        raise


def _close_claimed(
    services: Services, session: Session, round_id: uuid.UUID, *, reason: str, started: float
) -> None:
    rnd = repo.get_round(session, round_id)
    assert rnd is not None
    session.refresh(rnd)
    federation = repo.lock_federation(session, rnd.federation_id)
    assert federation is not None
    mark_changed(session, federation.id)
    now = services.clock()
    model_in = repo.get_model_version(session, rnd.model_in_id)
    assert model_in is not None
    updates = repo.updates_of_round(session, rnd.id)
    clients = {c.id: c for c in repo.list_clients(session, federation.id)}

    outcome = audits.audit_round(services, session, federation, rnd, model_in, updates, clients)
    model_out = audits.store_new_model(services, session, federation, rnd, outcome)

    rnd.state = "closed"
    rnd.state_reason = reason
    rnd.closed_at = now
    rnd.model_out_id = model_out.id
    rnd.aggregation_rule = outcome.rule
    rnd.aggregation_weights = outcome.weights_by_client
    federation.current_model_id = model_out.id
    if outcome.centroids is not None:
        federation.centroids = outcome.centroids
    audit_row = AuditResult(
        federation_id=federation.id,
        round_id=rnd.id,
        round_index=rnd.index,
        config=federation.config["audit"],
        result=outcome.result,
        created_at=now,
    )
    repo.add(session, audit_row)
    stored = read_audit(outcome.result)
    _update_statuses(
        session,
        federation,
        rnd,
        clients,
        outcome.flags_by_client,
        bool(stored.in_warmup),
        verdict=stored.primary_detection.status,
    )
    attendance.record_round(session, federation, rnd, clients, {u.client_id for u in updates}, now)
    _log_closed(session, rnd, reason, len(updates), model_out.id, outcome)
    round_events.record_flags(session, rnd, clients, stored, outcome.result)
    round_events.record_abstention(session, federation.id, rnd, stored)
    round_events.record_anchor_lead(session, federation.id, rnd, outcome.result)
    _finish_or_open_next(session, federation, rnd, model_out, now, audit_row)
    retention.prune_after_close(services, session, federation, now)
    rnd.coordinator_seconds = time.perf_counter() - started


def _log_closed(
    session: Session,
    rnd: Round,
    reason: str,
    updates: int,
    model_out_id: uuid.UUID,
    outcome: audits.RoundOutcome,
) -> None:
    """The audit trail's ``round.closed`` event: why, how many updates, the aggregation."""
    repo.add_event(
        session,
        kind="round.closed",
        actor="system",
        message=(
            f"round {rnd.index} closed ({reason}) with {updates} updates; "
            f"aggregation {outcome.rule}"
            + (f" (fallback: {outcome.fallback_reason})" if outcome.fallback_reason else "")
        ),
        federation_id=rnd.federation_id,
        round_id=rnd.id,
        data={
            "index": rnd.index,
            "reason": reason,
            "updates": updates,
            "model_out": str(model_out_id),
            "aggregation_rule": outcome.rule,
            "weights": outcome.weights_by_client,
            "fallback": outcome.fallback_reason,
        },
    )


def _finish_or_open_next(
    session: Session,
    federation: Federation,
    rnd: Round,
    model_out: ModelVersion,
    now: datetime,
    audit_row: AuditResult,
) -> None:
    """After the last round the federation is finished; otherwise the next round opens."""
    if rnd.index + 1 >= federation.rounds:
        federation.status = "finished"
        repo.add_event(
            session,
            kind="federation.finished",
            actor="system",
            message=f"federation finished after {federation.rounds} rounds",
            federation_id=federation.id,
            data={"final_model": str(model_out.id)},
        )
    else:
        open_round(
            session,
            federation,
            index=rnd.index + 1,
            model=model_out,
            now=now,
            previous_audit=audit_row,
        )


def _update_statuses(
    session: Session,
    federation: Federation,
    rnd: Round,
    clients: dict[uuid.UUID, Client],
    flags: dict[str, dict[str, bool | None]],
    in_warmup: bool,
    *,
    verdict: str | None = None,
) -> None:
    """Append this round's flags to each client's history and apply the status rule.

    Flags raised during the warm-up are kept in the history (marked) but do not count
    towards a status: the global model is not trained enough for them to mean much. Each
    entry also records the primary detector's status (``verdict``: ok, inconclusive,
    undetermined), so that the dashboard tells an abstention from a missing flag.
    """
    m = int(federation.config["audit"]["status_m"])
    w = int(federation.config["audit"]["status_w"])
    for client_id_text, client_flags in flags.items():
        client = clients[uuid.UUID(client_id_text)]
        history = list(client.flag_history or [])
        history.append(
            {"round": rnd.index, "in_warmup": in_warmup, "verdict": verdict, **client_flags}
        )
        client.flag_history = history
        if in_warmup:
            continue
        # this round's entry is in the history now: the flags of every round up to this one
        new = next_status(client.status, audits.counted_flags(client, rnd.index + 1), m=m, w=w)
        if new != client.status:
            repo.add_event(
                session,
                kind="client.status_changed",
                actor="system",
                message=f"client {client.name!r}: {client.status} -> {new} after round {rnd.index}",
                federation_id=federation.id,
                round_id=rnd.id,
                client_id=client.id,
                data={"from": client.status, "to": new, "round": rnd.index},
            )
            client.status = new


def _mark_failed(services: Services, round_id: uuid.UUID, reason: str) -> None:
    with services.sessions.begin() as session:
        rnd = repo.get_round(session, round_id)
        if rnd is None or rnd.state != "open":  # closed meanwhile, or failed by an admin's stop
            return
        federation = repo.lock_federation_for_write(session, rnd.federation_id)
        assert federation is not None
        session.refresh(rnd)
        if rnd.state != "open" or federation.status in ENDED_STATUSES:
            return
        rnd.state = "failed"
        rnd.state_reason = reason
        mark_changed(session, federation.id)
        federation.status = "failed"
        federation.status_reason = f"round {rnd.index} failed to close: {reason}"
        repo.add_event(
            session,
            kind="round.failed",
            actor="system",
            message=f"round {rnd.index} failed to close: {reason}",
            federation_id=rnd.federation_id,
            round_id=rnd.id,
        )


def get_round(session: Session, federation_id: uuid.UUID, index: int) -> Round:
    rnd = repo.get_round_by_index(session, federation_id, index)
    if rnd is None:
        raise NotFoundError(f"round {index} of federation {federation_id} does not exist")
    return rnd
