"""Retention: how long the coordinator keeps the sites' model updates.

A model update is a site's whole local model, the largest thing stored, and the audit reads it
only while it runs (or replays) that update's round. Pruning a federation keeps the updates of its
last N finished rounds and removes, from each older update, its blob and its large signals
(`PRUNED_SIGNALS`: the probe softmax and the centroids). The row stays, marked ``pruned_at``, with
its sha256, size and sample count and the signals that reports, the dashboard and the client
histories read (class counts, per-class losses, training loss and accuracy).

Kept whatever N is:

- every global model (the initial model and each round's aggregate): downloads, the next round,
  and a what-if's comparison with the model a round actually produced read them;
- each site's latest update: the local model that FedRN's neighbour search reads at the next
  round close and that the coordinator hands to other sites as a neighbour;
- the updates assigned as neighbours in a round that is still open;
- every audit result, round record and event: the reports and the dashboard read only those and
  the kept signals.

What reads a pruned update answers 410 Gone (`GoneError`): its download, and a what-if of its
round that does not leave its site out.

The blobs go with the unit of work that marks the rows (`BlobStore.drop`): a directory or a
bucket removes them once the transaction commits and keeps them if it does not; the database
store deletes their rows in the transaction itself. Prune on request with `prune` (the API's
``POST /federations/{id}/prune``, ``fedaudit prune``), or after every round close with the
``retention_rounds`` setting (`prune_after_close`, called in the close's transaction).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from service.coordinator.resources import Services
from service.errors import BadRequestError, GoneError, NotFoundError
from service.store import repositories as repo
from service.store.blobs import BlobStore, referenced_by_rows
from service.store.tables import Federation, ModelUpdate, Round

PRUNED_SIGNALS = ("probe_softmax", "centroids")
"""The signals removed with a pruned update's blob: only a replay of its round's audit reads
them, and they are the large ones (a probe's softmax rows, a site's class centroids)."""


class PrunedCounts(TypedDict):
    """What a prune removed (or, in a dry run, would remove)."""

    rounds: list[int]
    updates: int
    blobs: int
    bytes: int
    signals: list[str]


class KeptCounts(TypedDict):
    """What a prune kept of the rounds it looked at, and what earlier prunes removed."""

    rounds: list[int]
    latest_updates: int
    neighbor_updates: int
    global_models: int
    already_pruned: int


class RetentionReport(TypedDict):
    """A prune's report: answered as it is (``PruneReport`` on the wire) and recorded as the
    ``federation.pruned`` event's data."""

    federation_id: str
    keep_rounds: int
    dry_run: bool
    pruned: PrunedCounts
    kept: KeptCounts


def prune_federation(
    session: Session,
    blobs: BlobStore,
    federation: Federation,
    *,
    keep_rounds: int,
    actor: str,
    now: datetime,
    dry_run: bool = False,
) -> RetentionReport:
    """Prune the updates of the federation's finished rounds older than its last `keep_rounds`
    (a step: it flushes, the caller commits; the caller holds the federation's lock). Returns
    what was pruned and what was kept; with `dry_run` the rows are changed all the same and the
    caller must roll back (no blob is dropped, no event recorded)."""
    if keep_rounds < 0:
        raise BadRequestError("keep_rounds must be >= 0")
    already = repo.count_pruned_updates(session, federation.id)
    finished = repo.finished_round_indices(session, federation.id)
    older = finished[keep_rounds:]
    candidates = repo.unpruned_updates_up_to(session, federation.id, older[0]) if older else []
    clients = [c.id for c in repo.list_clients(session, federation.id)]
    latest = {u.id for u in repo.latest_updates(session, federation.id, clients).values()}
    assigned = _assigned_neighbor_models(session, federation.id)
    pruned: list[ModelUpdate] = []
    kept_latest = kept_assigned = 0
    for update in candidates:
        if update.id in latest:
            kept_latest += 1
        elif str(update.id) in assigned:
            kept_assigned += 1
        else:
            pruned.append(update)
    for update in pruned:
        update.pruned_at = now
        update.signals = {k: v for k, v in update.signals.items() if k not in PRUNED_SIGNALS}
    session.flush()
    sizes = {u.blob_key: int(u.size_bytes) for u in pruned}
    needed = referenced_by_rows(session, list(sizes))  # the same content kept by another row
    removed = sorted(key for key in sizes if key not in needed)
    report: RetentionReport = {
        "federation_id": str(federation.id),
        "keep_rounds": keep_rounds,
        "dry_run": dry_run,
        "pruned": {
            "rounds": sorted({u.round_index for u in pruned}),
            "updates": len(pruned),
            "blobs": len(removed),
            "bytes": sum(sizes[key] for key in removed),
            "signals": list(PRUNED_SIGNALS),
        },
        "kept": {
            "rounds": sorted(finished[:keep_rounds]),
            "latest_updates": kept_latest,
            "neighbor_updates": kept_assigned,
            "global_models": len(repo.list_model_versions(session, federation.id)),
            "already_pruned": already,
        },
    }
    if pruned and not dry_run:
        blobs.drop(removed, session=session)
        _record(session, federation, report, actor)
    return report


def _assigned_neighbor_models(session: Session, federation_id: uuid.UUID) -> set[str]:
    """The update ids an open round hands to its sites as neighbour models (FedRN)."""
    return {
        str(neighbor["model_id"])
        for instructions in repo.open_round_instructions(session, federation_id)
        for neighbor in instructions.get("neighbors") or []
    }


def _record(session: Session, federation: Federation, report: RetentionReport, actor: str) -> None:
    pruned, kept = report["pruned"], report["kept"]
    rounds = pruned["rounds"]
    span = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"
    repo.add_event(
        session,
        kind="federation.pruned",
        actor=actor,
        message=(
            f"retention: pruned {pruned['updates']} update(s) of {span} ({pruned['blobs']} "
            f"blob(s), {pruned['bytes']} bytes, and their {', '.join(pruned['signals'])}); kept "
            f"the updates of the last {report['keep_rounds']} finished round(s), "
            f"{kept['latest_updates']} older site's latest update(s), "
            f"{kept['neighbor_updates']} assigned neighbour model(s) and every global model"
        ),
        federation_id=federation.id,
        data=dict(report),
    )


def prune(
    services: Services,
    federation_id: uuid.UUID,
    *,
    keep_rounds: int | None,
    dry_run: bool,
    actor: str,
) -> RetentionReport:
    """Prune a federation's old updates (`prune_federation`) and commit; `keep_rounds` None:
    the ``retention_rounds`` setting. A dry run changes nothing: it answers what a prune would
    remove and rolls back."""
    if keep_rounds is None:
        keep_rounds = services.settings.retention_rounds
    if keep_rounds is None:
        raise BadRequestError(
            "keep_rounds is required (`fedaudit prune --keep-rounds N`): the coordinator has "
            "no FEDAUDIT_RETENTION_ROUNDS setting to fall back on",
            errors=[{"loc": ["body", "keep_rounds"], "msg": "required"}],
        )
    # A dry run works in a transaction it rolls back; a prune in one that commits.
    with services.sessions() if dry_run else services.sessions.begin() as session:
        federation = _locked(session, federation_id)
        report = prune_federation(
            session,
            services.blobs,
            federation,
            keep_rounds=keep_rounds,
            actor=actor,
            now=services.clock(),
            dry_run=dry_run,
        )
        if dry_run:
            session.rollback()
        return report


def _locked(session: Session, federation_id: uuid.UUID) -> Federation:
    """The federation, locked against a round close that runs meanwhile."""
    federation = repo.lock_federation(session, federation_id)
    if federation is None:
        raise NotFoundError(f"federation {federation_id} does not exist")
    return federation


def prune_after_close(
    services: Services, session: Session, federation: Federation, now: datetime
) -> RetentionReport | None:
    """With the ``retention_rounds`` setting, prune in the transaction that closes a round."""
    keep_rounds = services.settings.retention_rounds
    if keep_rounds is None:
        return None
    return prune_federation(
        session, services.blobs, federation, keep_rounds=keep_rounds, actor="system", now=now
    )


def check_not_pruned(
    updates: Iterable[ModelUpdate], names: Mapping[uuid.UUID, str], *, needed_for: str
) -> None:
    """GoneError (410) naming the sites whose update among `updates` was pruned."""
    gone = [u for u in updates if u.pruned_at is not None]
    if not gone:
        return
    sites = ", ".join(sorted(names.get(u.client_id, str(u.client_id)) for u in gone))
    when = max(u.pruned_at for u in gone if u.pruned_at is not None)
    raise GoneError(
        f"{needed_for} needs the model updates of round {gone[0].round_index} from {sites}, "
        f"which retention pruned at {when.isoformat()}; the global models, audit results and "
        "reports are kept. Keep more rounds (retention_rounds, fedaudit prune --keep-rounds) "
        "to replay older rounds",
        reason="pruned by retention",
        pruned_at=when.isoformat(),
        round=gone[0].round_index,
        clients=sorted(str(u.client_id) for u in gone),
    )


def pruned_clients(session: Session, rnd: Round) -> list[uuid.UUID]:
    """The sites whose update of the round was pruned."""
    return repo.pruned_clients_of_round(session, rnd.id)
