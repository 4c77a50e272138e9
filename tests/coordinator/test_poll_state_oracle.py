"""The one-statement poll (``rounds.current_for_client_id``) against the seven ORM reads it
replaced, kept here as the oracle (``old_current_for_client_id``), in every state reachable by
writing rows directly: federation created, waiting, running, finished, failed; no open round,
two open rounds; a site not joined, not selected, selected with or without its update, of
another federation, unknown."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import delete, update

from service.config import Settings
from service.coordinator import federations, rounds
from service.errors import FederationStateError, NotFoundError
from service.store import repositories as repo
from service.store.tables import Client, Federation, Round, RoundParticipant
from tests.coordinator._federations import new_federation
from tests.coordinator.test_close_once import make_services, prepare_round, submit

pytestmark = pytest.mark.db


def old_current_for_client_id(session, client_id):
    client = repo.get_client(session, client_id)
    if client is None:
        raise NotFoundError(f"client {client_id} does not exist")
    federation = repo.get_federation(session, client.federation_id)
    assert federation is not None
    if federation.status == "finished":
        return rounds.Finished(final_model_id=federation.current_model_id)
    if federation.status == "failed":
        raise FederationStateError(
            f"federation {federation.name!r} failed: {federation.status_reason}"
        )
    if federation.status == "stopped":  # added with the status (an admin's stop)
        raise FederationStateError(f"federation {federation.name!r} was {federation.status_reason}")
    if federation.status == "created":
        return rounds.Wait(
            rounds.WAIT_DEFAULT_S, "the federation has not started (no initial model yet)"
        )
    if federation.status == "waiting":
        counts = repo.federation_counts(session, [federation.id])[federation.id]
        return rounds.Wait(
            rounds.WAIT_DEFAULT_S,
            f"the federation has not started: {counts['joined_clients']} of {counts['clients']} "
            "sites joined",
        )
    if client.joined_at is None:
        return rounds.Wait(rounds.WAIT_DEFAULT_S, "join the federation first")
    rnd = repo.open_round_of(session, federation.id)
    if rnd is None:
        return rounds.Wait(rounds.WAIT_AGGREGATING_S, "the last round is being aggregated")
    participant = repo.participant(session, rnd.id, client.id)
    if participant is None:
        return rounds.Wait(rounds.WAIT_DEFAULT_S, f"not selected for round {rnd.index}")
    if repo.has_update(session, rnd.id, client.id):
        total, sent = repo.participation_counts(session, rnd.id)
        return rounds.Wait(
            rounds.WAIT_AGGREGATING_S,
            f"update for round {rnd.index} received; {sent} of {total} sites sent theirs, "
            f"waiting for {total - sent}",
            sites_selected=total,
            sites_submitted=sent,
        )
    return ("train", rnd.id, rnd.index, rnd.deadline_at, participant.instructions)


def normal(answer):
    if isinstance(answer, rounds.Train):
        return (
            "train",
            answer.round.id,
            answer.round.index,
            answer.round.deadline_at,
            answer.instructions,
        )
    return answer


def outcome(fn, services, cid):
    with services.sessions() as session:
        try:
            return normal(fn(session, cid))
        except Exception as exc:  # noqa: BLE001
            return (type(exc).__name__, str(exc))


def test_the_one_statement_poll_answers_as_the_orm_reads(settings: Settings) -> None:
    settings.close_rounds_inline = False
    services = make_services(settings)
    services.worker.submit_once = lambda key, job: None  # type: ignore[method-assign]
    fid, round_id, members = prepare_round(services, ["a", "b", "c", "d"])
    with services.sessions.begin() as session:
        late = federations.add_client(session, fid, name="late", actor="admin")[0]
        other_fid = new_federation(session, "elsewhere")
        stranger = federations.add_client(session, other_fid, name="a", actor="admin")[0]
    submit(services, fid, members["a"], 1.0)
    ids = [m.id for m in members.values()] + [late.id, stranger.id, uuid.uuid4()]
    checked = 0

    def compare(label: str) -> None:
        nonlocal checked
        for cid in ids:
            old, new = (
                outcome(old_current_for_client_id, services, cid),
                outcome(rounds.current_for_client_id, services, cid),
            )
            assert old == new, (label, cid, old, new)
            checked += 1

    def set_status(status: str, reason: str | None = None) -> None:
        with services.sessions.begin() as session:
            session.execute(
                update(Federation)
                .where(Federation.id == fid)
                .values(status=status, status_reason=reason)
            )

    compare("running, a submitted")
    # b unselected but its update stored (deleted participation after submit)
    submit(services, fid, members["b"], 2.0)
    with services.sessions.begin() as session:
        session.execute(
            delete(RoundParticipant).where(
                RoundParticipant.round_id == round_id, RoundParticipant.client_id == members["b"].id
            )
        )
    compare("b's update stored, b unselected")
    # d not joined any more
    with services.sessions.begin() as session:
        session.execute(update(Client).where(Client.id == members["d"].id).values(joined_at=None))
    compare("d not joined")
    # a second open round (index 1) with c selected in it only
    with services.sessions.begin() as session:
        r0 = session.get(Round, round_id)
        r1 = Round(
            federation_id=fid,
            index=1,
            state="open",
            deadline_at=r0.deadline_at + timedelta(hours=1),
            model_in_id=r0.model_in_id,
            probe_seed=7,
        )
        session.add(r1)
        session.flush()
        session.add(
            RoundParticipant(round_id=r1.id, client_id=members["c"].id, instructions={"r": 1})
        )
    compare("two open rounds")
    with services.sessions.begin() as session:
        session.execute(delete(RoundParticipant).where(RoundParticipant.round_id != round_id))
        session.execute(delete(Round).where(Round.id != round_id))
    # no open round
    for state in ("aggregating", "closed", "failed"):
        with services.sessions.begin() as session:
            session.execute(update(Round).where(Round.id == round_id).values(state=state))
        compare(f"round {state}")
    with services.sessions.begin() as session:
        session.execute(update(Round).where(Round.id == round_id).values(state="open"))
    # federation statuses, each with the round open and without
    for status, reason in (
        ("created", None),
        ("waiting", None),
        ("finished", None),
        ("failed", "boom"),
        ("stopped", "stopped by the admin: x"),
        ("running", None),
        ("paused", "x"),
    ):
        set_status(status, reason)
        compare(f"federation {status}")
    # empty instructions
    with services.sessions.begin() as session:
        session.execute(
            update(RoundParticipant)
            .where(RoundParticipant.client_id == members["c"].id)
            .values(instructions={})
        )
    set_status("running")
    compare("empty instructions")
    assert checked > 90
    services.close()
