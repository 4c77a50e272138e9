"""Attendance (``service.coordinator.attendance``): a suspended site, a site whose token is
revoked and a site that stopped sending updates are left out of the rounds' selection, so a
dead site does not make every round wait for its deadline."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.config import Settings
from service.coordinator import attendance, clients, federations, overrides, reaper, rounds, updates
from service.coordinator.federation_config import FederationConfigInput
from service.coordinator.resources import Services
from service.errors import BadRequestError, FederationStateError, ForbiddenError
from service.store import repositories as repo
from service.store import tables
from tests.coordinator.test_close_once import federation_with_model, make_services, submit

pytestmark = pytest.mark.db

# --- which joined sites a round may select (no database) -----------------------------------

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def site(name: str, **fields: Any) -> tables.Client:
    values: dict[str, Any] = {"joined_at": T0, "suspended_at": None, "token_revoked_at": None}
    values.update({"absent_since": None, "missed_rounds": 0, **fields})
    return tables.Client(id=uuid.uuid4(), name=name, **values)


def federation(min_clients: int) -> tables.Federation:
    return tables.Federation(min_clients=min_clients, max_clients=None, config={})


def names(sites: list[tables.Client]) -> list[str]:
    return [c.name for c in sites]


def test_every_present_site_is_available() -> None:
    joined = [site("a"), site("b"), site("c")]
    pool = attendance.pool(federation(2), joined)
    assert names(pool.available) == ["a", "b", "c"]
    assert pool.left_out() == {"suspended": [], "token_revoked": [], "absent": []}


def test_suspended_revoked_and_absent_sites_are_left_out_by_reason() -> None:
    a, b = site("a"), site("b")
    s = site("s", suspended_at=T0)
    r = site("r", token_revoked_at=T0)
    gone = site("gone", absent_since=T0, missed_rounds=2)
    pool = attendance.pool(federation(2), [a, s, r, gone, b])
    assert names(pool.available) == ["a", "b"]
    assert pool.left_out() == {
        "suspended": [str(s.id)],
        "token_revoked": [str(r.id)],
        "absent": [str(gone.id)],
    }


def test_absent_sites_come_back_when_too_few_would_remain() -> None:
    """min_clients 3 with two present sites: the absent one is asked again (a round nobody can
    fill is worse); a suspended or revoked site is not."""
    joined = [
        site("a"),
        site("b"),
        site("gone", absent_since=T0),
        site("s", suspended_at=T0),
        site("r", token_revoked_at=T0),
    ]
    pool = attendance.pool(federation(3), joined)
    assert names(pool.available) == ["a", "b", "gone"]
    assert pool.absent == []
    assert names(pool.suspended) == ["s"]
    assert names(pool.revoked) == ["r"]


def test_state_names_each_case() -> None:
    assert attendance.state(site("a", joined_at=None)) == "not_joined"
    assert attendance.state(site("a")) == "present"
    assert attendance.state(site("a", absent_since=T0)) == "absent"
    assert attendance.state(site("a", token_revoked_at=T0)) == "token_revoked"
    # a suspension is said first: it is the admin's decision and outlasts the others
    assert attendance.state(site("a", suspended_at=T0, token_revoked_at=T0)) == "suspended"
    assert attendance.state(site("a", joined_at=None, suspended_at=T0)) == "suspended"


def test_the_default_applies_to_federations_stored_without_the_setting() -> None:
    assert attendance.absent_after_missed(federation(1)) == 2
    fed = tables.Federation(min_clients=1, config={"absent_after_missed": 0})
    assert attendance.absent_after_missed(fed) == 0


# --- through the coordinator's use cases, on the database -----------------------------------


def start(
    services: Services, names: list[str], *, min_clients: int = 1, absent_after: int = 2
) -> tuple[uuid.UUID, dict[str, tables.Client]]:
    """A five-round federation with round 0 open, every site joined, 30 s deadlines."""
    config = FederationConfigInput(
        method="fedavg",
        detectors=["fedncl"],
        primary_detector="fedncl",
        absent_after_missed=absent_after,
    )
    with services.sessions.begin() as session:
        fed = federation_with_model(
            services,
            session,
            name="attendance",
            min_clients=min_clients,
            deadline_s=30,
            config=config,
            rounds=5,
        )
        created = [federations.add_client(session, fed.id, name=n, actor="admin")[0] for n in names]
        for client in created:
            clients.join(session, client, num_samples=10, class_counts=[5, 5], now=services.clock())
        return fed.id, {c.name: c for c in created}


def selected(services: Services, fid: uuid.UUID, index: int) -> set[str]:
    with services.sessions() as session:
        rnd = rounds.get_round(session, fid, index)
        by_id = {c.id: c.name for c in repo.list_clients(session, fid)}
        return {by_id[cid] for cid in repo.selected_client_ids(session, rnd.id)}


def round_state(services: Services, fid: uuid.UUID, index: int) -> tuple[str, str | None]:
    with services.sessions() as session:
        rnd = rounds.get_round(session, fid, index)
        return rnd.state, rnd.state_reason


def client_row(services: Services, client_id: uuid.UUID) -> tables.Client:
    with services.sessions() as session:
        client = repo.get_client(session, client_id)
        assert client is not None
        session.expunge(client)
        return client


def event_kinds(services: Services, client_id: uuid.UUID) -> list[str]:
    with services.sessions() as session:
        query = select(tables.Event.kind).where(tables.Event.client_id == client_id)
        return list(session.scalars(query.order_by(tables.Event.id)))


def past_deadline(services: Services, fid: uuid.UUID, index: int) -> None:
    """Move the clock past round `index`'s deadline and run the deadline checker."""
    with services.sessions() as session:
        deadline = rounds.get_round(session, fid, index).deadline_at
    services.clock = lambda: deadline + timedelta(seconds=1)
    reaper.check_rounds(services)


def test_a_site_that_stopped_is_left_out_after_two_missed_rounds_and_returns_when_it_polls(
    settings: Settings,
) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"])
    a, b, c = site_of["a"], site_of["b"], site_of["c"]
    for index in (0, 1):  # c sends nothing: each round waits for its deadline
        submit(services, fid, a, 1.0, index)
        submit(services, fid, b, 1.0, index)
        assert round_state(services, fid, index) == ("open", None)
        past_deadline(services, fid, index)
        assert round_state(services, fid, index) == ("closed", "deadline")
    row = client_row(services, c.id)
    assert row.missed_rounds == 2
    assert row.absent_since is not None
    assert client_row(services, a.id).missed_rounds == 0
    assert "client.absent" in event_kinds(services, c.id)

    # Round 2 leaves c out and closes as soon as a and b have sent theirs: no deadline.
    assert selected(services, fid, 2) == {"a", "b"}
    submit(services, fid, a, 1.0, 2)
    submit(services, fid, b, 1.0, 2)
    assert round_state(services, fid, 2) == ("closed", "complete")

    # c polls: it is told it was not selected, and is present again from the next round.
    answer = rounds.current_for(services, c.id)
    assert isinstance(answer, rounds.Wait)
    assert "not selected" in answer.reason
    row = client_row(services, c.id)
    assert (row.absent_since, row.missed_rounds) == (None, 0)
    assert event_kinds(services, c.id)[-1] == "client.returned"
    submit(services, fid, a, 1.0, 3)
    submit(services, fid, b, 1.0, 3)
    assert selected(services, fid, 4) == {"a", "b", "c"}
    services.close()


def test_a_poll_of_a_present_site_changes_neither_its_record_nor_the_trail(
    settings: Settings,
) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b"])
    a = site_of["a"].id

    def seen() -> tuple[object, ...]:
        row = client_row(services, a)
        return (
            row.absent_since,
            row.missed_rounds,
            row.last_seen_at,
            tuple(event_kinds(services, a)),
        )

    before = seen()
    assert isinstance(rounds.current_for(services, a), rounds.Train)
    assert seen() == before
    services.close()


def test_attendance_off_keeps_selecting_a_silent_site(settings: Settings) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b"], absent_after=0)
    for index in (0, 1, 2):
        submit(services, fid, site_of["a"], 1.0, index)
        past_deadline(services, fid, index)
    assert selected(services, fid, 3) == {"a", "b"}
    row = client_row(services, site_of["b"].id)
    assert (row.missed_rounds, row.absent_since) == (3, None)
    services.close()


def test_a_suspended_site_leaves_the_open_round_and_is_not_selected_until_resumed(
    settings: Settings,
) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"])
    a, b, c = site_of["a"], site_of["b"], site_of["c"]
    submit(services, fid, a, 1.0, 0)
    submit(services, fid, b, 1.0, 0)
    assert round_state(services, fid, 0) == ("open", None)  # waiting for c

    suspended = overrides.suspend(services, fid, c.id, reason="offline until Monday", actor="x")
    assert suspended.suspend_reason == "offline until Monday"
    assert selected(services, fid, 0) == {"a", "b"}
    with services.sessions() as session:
        event = session.scalars(
            select(tables.Event).where(tables.Event.kind == "client.suspended")
        ).one()
    assert event.data == {"reason": "offline until Monday", "withdrawn_from_round": 0}
    # the round, now complete, closes at once, as after its last upload
    assert round_state(services, fid, 0) == ("closed", "complete")
    assert selected(services, fid, 1) == {"a", "b"}
    answer = rounds.current_for(services, c.id)
    assert isinstance(answer, rounds.Wait)
    assert "suspended" in answer.reason
    assert "Monday" not in answer.reason  # the admin's reason stays with the admin

    resumed = overrides.suspend(services, fid, c.id, reason=None, actor="x")
    assert (resumed.suspended_at, resumed.suspend_reason) == (None, None)
    submit(services, fid, a, 1.0, 1)
    submit(services, fid, b, 1.0, 1)
    assert selected(services, fid, 2) == {"a", "b", "c"}
    assert event_kinds(services, c.id)[-2:] == ["client.suspended", "client.resumed"]
    services.close()


def test_a_site_whose_update_is_stored_stays_in_the_open_round_when_suspended(
    settings: Settings,
) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"])
    submit(services, fid, site_of["c"], 1.0, 0)
    overrides.suspend(services, fid, site_of["c"].id, reason="audit", actor="x")
    assert selected(services, fid, 0) == {"a", "b", "c"}
    services.close()


def test_a_suspension_that_leaves_too_few_sites_is_refused_and_changes_nothing(
    settings: Settings,
) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"], min_clients=2)
    overrides.suspend(services, fid, site_of["c"].id, reason="one", actor="x")
    with pytest.raises(FederationStateError, match="would leave 1 site able to take part"):
        overrides.suspend(services, fid, site_of["b"].id, reason="two", actor="x")
    row = client_row(services, site_of["b"].id)
    assert row.suspended_at is None
    assert selected(services, fid, 0) == {"a", "b"}
    with pytest.raises(BadRequestError, match="needs a reason"):
        overrides.suspend(services, fid, site_of["a"].id, reason="  ", actor="x")
    services.close()


def test_a_site_whose_token_is_revoked_is_not_selected(settings: Settings) -> None:
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b"])
    with services.sessions.begin() as session:
        revoked = repo.get_client(session, site_of["b"].id)
        assert revoked is not None
        revoked.token_revoked_at = services.clock()
    submit(services, fid, site_of["a"], 1.0, 0)
    past_deadline(services, fid, 0)
    assert selected(services, fid, 1) == {"a"}
    with services.sessions() as session:
        opened = session.scalars(
            select(tables.Event)
            .where(tables.Event.kind == "round.opened")
            .order_by(tables.Event.id.desc())
        ).first()
    assert opened is not None
    assert opened.data["left_out"]["token_revoked"] == [str(site_of["b"].id)]
    services.close()


def test_an_update_sent_while_its_site_is_withdrawn_is_refused(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suspension lands while c's upload is being checked: the upload, which locks the
    round, finds c no longer selected and is refused; nothing of it is stored."""
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"])
    checked = updates.check_join_consistency

    def suspended_meanwhile(*args: Any, **kwargs: Any) -> Any:
        overrides.suspend(services, fid, site_of["c"].id, reason="meanwhile", actor="x")
        return checked(*args, **kwargs)

    monkeypatch.setattr(updates, "check_join_consistency", suspended_meanwhile)
    with pytest.raises(ForbiddenError, match="withdrawn from round 0"):
        submit(services, fid, site_of["c"], 9.0, 0)
    monkeypatch.setattr(updates, "check_join_consistency", checked)
    with services.sessions() as session:
        rnd = rounds.get_round(session, fid, 0)
        assert repo.submitted_client_ids(session, rnd.id) == []
    assert selected(services, fid, 0) == {"a", "b"}
    services.close()


def test_a_suspended_site_stays_in_a_round_that_would_have_too_few_sites_without_it(
    settings: Settings,
) -> None:
    """min_clients 2, and c absent: round 2 selected a and b. Suspending b keeps b in round 2
    (one selected site would be below min_clients) and leaves it out of round 3."""
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"], min_clients=2)
    for index in (0, 1):
        submit(services, fid, site_of["a"], 1.0, index)
        submit(services, fid, site_of["b"], 1.0, index)
        past_deadline(services, fid, index)
    assert selected(services, fid, 2) == {"a", "b"}  # c absent
    overrides.suspend(services, fid, site_of["b"].id, reason="check", actor="x")
    assert selected(services, fid, 2) == {"a", "b"}
    with services.sessions() as session:
        event = session.scalars(
            select(tables.Event).where(tables.Event.kind == "client.suspended")
        ).one()
    assert "it stays in round 2" in event.message
    assert event.data["withdrawn_from_round"] is None
    submit(services, fid, site_of["a"], 1.0, 2)
    submit(services, fid, site_of["b"], 1.0, 2)
    # without b, a alone is below min_clients: the absent c is asked again
    assert selected(services, fid, 3) == {"a", "c"}
    services.close()


def test_round_0_opens_only_with_min_clients_sites_that_are_not_suspended(
    settings: Settings,
) -> None:
    services = make_services(settings)
    with services.sessions.begin() as session:
        fed = federation_with_model(
            services, session, name="waiting", min_clients=2, deadline_s=30, rounds=2
        )
        a, b, _ = (
            federations.add_client(session, fed.id, name=n, actor="admin")[0]
            for n in ("a", "b", "c")
        )
        for client in (a, b):
            clients.join(session, client, num_samples=10, class_counts=[5, 5], now=services.clock())
        fid = fed.id
    overrides.suspend(services, fid, b.id, reason="not ready", actor="x")  # waiting: allowed
    with pytest.raises(FederationStateError, match="only 1 of the 2 sites that joined can take"):
        rounds.start_now(services, fid)
    with services.sessions() as session:
        assert repo.open_round_of(session, fid) is None
    overrides.suspend(services, fid, b.id, reason=None, actor="x")
    rounds.start_now(services, fid)
    assert selected(services, fid, 0) == {"a", "b"}
    services.close()


def test_a_return_is_recorded_once_when_two_polls_race(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two polls of an absent site (two replicas): the second to take the federation's lock
    finds it present already and records nothing."""
    services = make_services(settings)
    fid, site_of = start(services, ["a", "b", "c"])
    for index in (0, 1):
        submit(services, fid, site_of["a"], 1.0, index)
        submit(services, fid, site_of["b"], 1.0, index)
        past_deadline(services, fid, index)
    c = site_of["c"].id
    assert client_row(services, c).absent_since is not None
    lock = repo.lock_federation
    order: list[str] = []

    def other_poll_first(session: Any, federation_id: uuid.UUID) -> Any:
        if not order:
            order.append("outer")
            inner = threading.Thread(target=lambda: attendance.mark_returned(services, c))
            inner.start()
            inner.join(timeout=60)
            order.append("inner done")
        return lock(session, federation_id)

    monkeypatch.setattr(repo, "lock_federation", other_poll_first)
    attendance.mark_returned(services, c)
    assert order == ["outer", "inner done"]
    assert event_kinds(services, c).count("client.returned") == 1
    assert client_row(services, c).absent_since is None
    services.close()
