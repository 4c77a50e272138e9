"""Who takes part in a round: a site an admin suspended, a site whose token is revoked and a
site that stopped answering are left out of the selection, so that one dead site does not make
every round wait for its deadline.

- **Suspended** (an admin's decision, with a reason: ``PUT/DELETE .../clients/{id}/suspend``,
  ``fedaudit client suspend/resume``): not selected until resumed. Suspended while the open
  round waits for its update, it is withdrawn from that round (which closes at once if the
  others have all sent theirs), unless fewer than ``min_clients`` selected sites would remain
  in it: then it stays in that round and is left out of the next. A suspension that would
  leave fewer than ``min_clients`` sites able to take part in a running federation is refused;
  round 0 opens only with ``min_clients`` sites that are not suspended.
- **Revoked token**: not selected (it can neither poll nor upload) until a rotation.
- **Absent**: selected for ``absent_after_missed`` rounds in a row (the federation's setting,
  default 2; 0 turns it off) without its update stored when they closed. Not selected again
  until its next poll of ``rounds/current``, which marks it present (one write, at its return:
  a poll writes nothing otherwise). If leaving the absent sites out would leave fewer than
  ``min_clients`` sites, they are selected all the same.

Every change is an event in the audit trail (``client.suspended``, ``client.resumed``,
``client.absent``, ``client.returned``) and the round's ``round.opened`` event lists the sites
left out and why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from sqlalchemy.orm import Session

from service.coordinator.federation_config import DEFAULT_ABSENT_AFTER_MISSED
from service.coordinator.resources import Services
from service.errors import BadRequestError, FederationStateError
from service.store import repositories as repo
from service.store.tables import Client, Federation, Round

__all__ = [
    "Pool",
    "absent_after_missed",
    "mark_returned",
    "pool",
    "record_round",
    "set_suspended",
    "state",
]


def absent_after_missed(federation: Federation) -> int:
    """Rounds in a row a site may miss before it counts as absent (0: never); federations
    created before the setting existed get the default."""
    return int(federation.config.get("absent_after_missed", DEFAULT_ABSENT_AFTER_MISSED))


def state(
    client: Client,
) -> Literal["not_joined", "present", "absent", "suspended", "token_revoked"]:
    """Whether a site takes part in the next rounds, in one word (the API's ``attendance``)."""
    if client.suspended_at is not None:
        return "suspended"
    if client.token_revoked_at is not None:
        return "token_revoked"
    if client.joined_at is None:
        return "not_joined"
    return "absent" if client.absent_since is not None else "present"


def _barred(client: Client) -> bool:
    return client.suspended_at is not None or client.token_revoked_at is not None


@dataclass(frozen=True)
class Pool:
    """The joined sites a round may select (``available``), and those it leaves out, by reason."""

    available: list[Client]
    suspended: list[Client] = field(default_factory=list)
    revoked: list[Client] = field(default_factory=list)
    absent: list[Client] = field(default_factory=list)

    def left_out(self) -> dict[str, list[str]]:
        """The ids of the sites left out, by reason (for the ``round.opened`` event)."""
        return {
            "suspended": [str(c.id) for c in self.suspended],
            "token_revoked": [str(c.id) for c in self.revoked],
            "absent": [str(c.id) for c in self.absent],
        }


def pool(federation: Federation, joined: list[Client]) -> Pool:
    """The joined sites that may take part in the next round: not suspended, token not revoked,
    and not absent, unless leaving the absent ones out would leave fewer than ``min_clients``."""
    suspended = [c for c in joined if c.suspended_at is not None]
    revoked = [c for c in joined if c.suspended_at is None and c.token_revoked_at is not None]
    available = [c for c in joined if not _barred(c)]
    present = [c for c in available if c.absent_since is None]
    if len(present) < federation.min_clients:
        # too few without them: asking the absent sites again beats a round nobody can fill
        return Pool(available, suspended=suspended, revoked=revoked)
    absent = [c for c in available if c.absent_since is not None]
    return Pool(present, suspended=suspended, revoked=revoked, absent=absent)


def record_round(
    session: Session,
    federation: Federation,
    rnd: Round,
    clients: dict[uuid.UUID, Client],
    submitted: set[uuid.UUID],
    now: datetime,
) -> None:
    """At a round's close: a selected site that sent its update has missed no round; one that
    did not has missed one more, and at the federation's limit it is absent from now on."""
    limit = absent_after_missed(federation)
    for client_id in repo.selected_client_ids(session, rnd.id):
        client = clients[client_id]
        if client_id in submitted:
            client.missed_rounds = 0
            continue
        client.missed_rounds = (client.missed_rounds or 0) + 1
        if limit and client.missed_rounds >= limit and client.absent_since is None:
            client.absent_since = now
            repo.add_event(
                session,
                kind="client.absent",
                actor="system",
                message=(
                    f"client {client.name!r} sent no update in the last {client.missed_rounds} "
                    f"rounds it was selected for (up to round {rnd.index}); not selected again "
                    "until it polls the coordinator"
                ),
                federation_id=federation.id,
                round_id=rnd.id,
                client_id=client.id,
                data={"missed_rounds": client.missed_rounds, "round": rnd.index},
            )


def mark_returned(services: Services, client_id: uuid.UUID) -> None:
    """An absent site polled: it is present again from the next round on. Its own write, made
    only when the poll found it absent, after the federation's lock (so it cannot interleave with
    a round's close, which counts the rounds sites missed); of two concurrent polls, one clears
    the mark and records the return. Nothing is written once the federation stopped running."""
    with services.sessions.begin() as session:
        client = repo.get_client(session, client_id)
        if client is None or client.absent_since is None:
            return
        federation = repo.lock_federation(session, client.federation_id)
        if federation is None or federation.status != "running":
            return
        since = client.absent_since
        if not repo.clear_absence(session, client_id):
            return  # another poll cleared it first
        repo.add_event(
            session,
            kind="client.returned",
            actor=f"client:{client.id}",
            message=f"client {client.name!r} polled again; it can be selected from the next round",
            federation_id=client.federation_id,
            client_id=client.id,
            data={"absent_since": since.isoformat()},
        )


def set_suspended(
    session: Session,
    federation: Federation,
    client: Client,
    *,
    reason: str | None,
    actor: str,
    now: datetime,
) -> Round | None:
    """Suspend a site (``reason`` given) or resume it (None), recorded in the event trail; the
    caller holds the federation's write lock (``repo.lock_federation_for_write``).

    A suspended site is withdrawn from the open round unless its update is already stored or
    the round would be left with fewer than ``min_clients`` selected sites. Refused (409) when
    it would leave a running federation fewer than ``min_clients`` sites able to take part.
    Resuming a site that is not suspended changes nothing. Returns the round the site was
    withdrawn from (which may now be complete), else None.
    """
    if reason is not None and not reason.strip():
        raise BadRequestError(
            "a suspension needs a reason", errors=[{"loc": ["body", "reason"], "msg": "required"}]
        )
    if reason is None:
        if client.suspended_at is None:
            return None
        client.suspended_at = client.suspend_reason = None
        client.missed_rounds = 0
        repo.add_event(
            session,
            kind="client.resumed",
            actor=actor,
            message=f"client {client.name!r} resumed by {actor}: it can be selected again",
            federation_id=federation.id,
            client_id=client.id,
            data={"reason": None},
        )
        return None
    withdrawn: Round | None = None
    kept_in: int | None = None
    if client.suspended_at is None and federation.status == "running":
        _check_enough_remain(session, federation, client)
        withdrawn, kept_in = _withdraw_from_open_round(session, federation, client)
    client.suspended_at = client.suspended_at or now
    client.suspend_reason = reason
    note = ""
    if withdrawn is not None:
        note = f" (withdrawn from round {withdrawn.index})"
    elif kept_in is not None:
        note = (
            f" (it stays in round {kept_in}: without it the round would have fewer than "
            f"{federation.min_clients} selected sites)"
        )
    repo.add_event(
        session,
        kind="client.suspended",
        actor=actor,
        message=f"client {client.name!r} suspended by {actor}: {reason}{note}",
        federation_id=federation.id,
        client_id=client.id,
        data={
            "reason": reason,
            "withdrawn_from_round": None if withdrawn is None else withdrawn.index,
        },
    )
    return withdrawn


def _check_enough_remain(session: Session, federation: Federation, client: Client) -> None:
    others = [
        c
        for c in repo.joined_clients(session, federation.id)
        if c.id != client.id and not _barred(c)
    ]
    if len(others) < federation.min_clients:
        sites = "site" if len(others) == 1 else "sites"
        raise FederationStateError(
            f"suspending {client.name!r} would leave {len(others)} {sites} able to take part; "
            f"the federation needs {federation.min_clients} per round"
        )


def _withdraw_from_open_round(
    session: Session, federation: Federation, client: Client
) -> tuple[Round | None, int | None]:
    """Remove the site from the open round's selection if its update is not stored and enough
    selected sites remain: (the round it was withdrawn from, None), or (None, the index of the
    round it stays in), or (None, None) when it was in no open round's wait. The round's row is
    locked first, as an upload locks it, so an update cannot slip in between."""
    rnd = repo.open_round_of(session, federation.id)
    if rnd is None or not repo.touch_open_round(session, rnd.id):
        return None, None
    if repo.has_update(session, rnd.id, client.id):
        return None, None
    if repo.participant(session, rnd.id, client.id) is None:
        return None, None
    selected, _ = repo.participation_counts(session, rnd.id)
    if selected - 1 < federation.min_clients:
        return None, rnd.index
    repo.remove_participant(session, rnd.id, client.id)
    return rnd, None
