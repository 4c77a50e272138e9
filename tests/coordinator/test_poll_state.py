"""A site's poll read in one statement (``service.store.poll_state``) and the answer built from it
(``rounds.current_for_client_id``): counts, participation and stored updates written literally,
on a federation of four registered sites, three of them joined and selected."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import delete, update

from service.config import Settings
from service.coordinator import clients, federations, rounds
from service.coordinator.federation_config import FederationConfigInput
from service.errors import NotFoundError
from service.store import repositories as repo
from service.store.poll_state import poll_state
from service.store.tables import Round, RoundParticipant
from tests.coordinator._federations import new_federation
from tests.coordinator.test_close_once import (
    federation_with_model,
    make_services,
    prepare_round,
    submit,
)

pytestmark = pytest.mark.db


def test_the_poll_state_follows_the_round(settings: Settings) -> None:
    settings.close_rounds_inline = False
    services = make_services(settings)
    services.worker.submit_once = lambda key, job: None  # type: ignore[method-assign]  # stays open
    fid, round_id, members = prepare_round(services, ["a", "b", "c"])
    with services.sessions.begin() as session:
        late = federations.add_client(session, fid, name="late", actor="admin")[0]
        other = new_federation(session, "elsewhere")
        federations.add_client(session, other, name="a", actor="admin")

    with services.sessions() as session:
        state = poll_state(session, members["a"].id)
        assert state is not None
        assert (state.federation_name, state.federation_status) == ("race", "running")
        # counted only where the answer quotes them: the registered sites while the federation
        # waits for them, the round's while the site's own update is in
        assert (state.clients, state.joined_clients) == (None, None)
        assert (state.round_id, state.round_index) == (round_id, 0)
        assert state.joined
        assert state.selected
        assert not state.has_update
        assert (state.sites_selected, state.sites_submitted) == (None, None)
        stored = repo.participant(session, round_id, members["a"].id)
        assert stored is not None
        assert state.instructions == stored.instructions
        answer = rounds.current_for_client_id(session, members["a"].id)
        assert isinstance(answer, rounds.Train)
        assert (answer.round.id, answer.round.index) == (round_id, 0)

        late_state = poll_state(session, late.id)
        assert late_state is not None
        assert not late_state.joined
        assert not late_state.selected
        assert late_state.instructions is None
        answer = rounds.current_for_client_id(session, late.id)
        assert answer == rounds.Wait(2.0, "join the federation first")

    submit(services, fid, members["a"], 1.0)
    submit(services, fid, members["b"], 2.0)
    with services.sessions() as session:
        state = poll_state(session, members["a"].id)
        assert state is not None
        assert state.has_update
        assert (state.sites_selected, state.sites_submitted) == (3, 2)
        c_state = poll_state(session, members["c"].id)
        assert c_state is not None
        assert not c_state.has_update
        assert rounds.current_for_client_id(session, members["a"].id) == rounds.Wait(
            0.5,
            "update for round 0 received; 2 of 3 sites sent theirs, waiting for 1",
            sites_selected=3,
            sites_submitted=2,
        )

    # Site a no longer among the selected: not told to train, and its update does not count.
    with services.sessions.begin() as session:
        session.execute(
            delete(RoundParticipant).where(
                RoundParticipant.round_id == round_id,
                RoundParticipant.client_id == members["a"].id,
            )
        )
    with services.sessions() as session:
        state = poll_state(session, members["a"].id)
        assert state is not None
        assert not state.selected
        assert state.instructions is None
        assert (state.sites_selected, state.sites_submitted) == (2, 1)
        assert rounds.current_for_client_id(session, members["a"].id) == rounds.Wait(
            2.0, "not selected for round 0"
        )

    # No open round (being aggregated): no round, no counts.
    with services.sessions.begin() as session:
        session.execute(update(Round).where(Round.id == round_id).values(state="aggregating"))
    with services.sessions() as session:
        state = poll_state(session, members["b"].id)
        assert state is not None
        assert (state.round_id, state.round_index, state.deadline_at) == (None, None, None)
        assert not state.selected
        assert not state.has_update
        assert (state.sites_selected, state.sites_submitted) == (None, None)
        assert rounds.current_for_client_id(session, members["b"].id) == rounds.Wait(
            0.5, "the last round is being aggregated"
        )

        unknown = uuid.uuid4()
        assert poll_state(session, unknown) is None
        with pytest.raises(NotFoundError):
            rounds.current_for_client_id(session, unknown)
    services.close()


def test_a_waiting_federation_counts_its_sites(settings: Settings) -> None:
    services = make_services(settings)
    with services.sessions.begin() as session:
        federation = federation_with_model(
            services,
            session,
            name="gathering",
            min_clients=3,
            config=FederationConfigInput(method="fedavg"),
        )
        a, b, c = (
            federations.add_client(session, federation.id, name=n, actor="admin")[0]
            for n in ("a", "b", "c")
        )
        for site in (a, b):
            clients.join(session, site, num_samples=10, class_counts=[5, 5], now=services.clock())
    with services.sessions() as session:
        state = poll_state(session, a.id)
        assert state is not None
        assert (state.federation_status, state.clients, state.joined_clients) == ("waiting", 3, 2)
        assert state.round_id is None
        assert rounds.current_for_client_id(session, c.id) == rounds.Wait(
            2.0, "the federation has not started: 2 of 3 sites joined"
        )
    services.close()
