"""A round's participation counted in the database (``repositories.participation_counts``), as a
waiting site's poll and the completeness check read it: the same answers as the sets of selected
and submitted clients it replaced."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import delete

from service.config import Settings
from service.coordinator import rounds
from service.coordinator.resources import Services
from service.store import repositories as repo
from service.store.tables import RoundParticipant
from tests.coordinator.test_close_once import make_services, prepare_round, submit

pytestmark = pytest.mark.db


def by_sets(services: Services, round_id: uuid.UUID) -> tuple[int, int, bool]:
    """(selected, selected that submitted, complete) from the rows themselves."""
    with services.sessions() as session:
        selected = {p.client_id for p in repo.participants(session, round_id)}
        submitted = {u.client_id for u in repo.updates_of_round(session, round_id)}
    return len(selected), len(selected & submitted), bool(selected) and selected <= submitted


def by_counts(services: Services, round_id: uuid.UUID) -> tuple[int, int, bool]:
    with services.sessions() as session:
        rnd = repo.get_round(session, round_id)
        assert rnd is not None
        selected, submitted = repo.participation_counts(session, round_id)
        return selected, submitted, rounds.round_is_complete(session, rnd)


def test_counts_follow_the_uploads_and_ignore_sites_not_selected(settings: Settings) -> None:
    settings.close_rounds_inline = False
    services = make_services(settings)
    services.worker.submit_once = lambda key, job: None  # type: ignore[method-assign]  # stays open
    fid, round_id, members = prepare_round(services, ["a", "b", "c"])

    assert by_counts(services, round_id) == by_sets(services, round_id) == (3, 0, False)
    submit(services, fid, members["a"], 1.0)
    submit(services, fid, members["b"], 2.0)
    assert by_counts(services, round_id) == by_sets(services, round_id) == (3, 2, False)
    submit(services, fid, members["c"], 3.0)
    assert by_counts(services, round_id) == by_sets(services, round_id) == (3, 3, True)

    # An update whose site is not (or no longer) among the selected does not count.
    with services.sessions.begin() as session:
        session.execute(
            delete(RoundParticipant).where(
                RoundParticipant.round_id == round_id,
                RoundParticipant.client_id == members["a"].id,
            )
        )
    assert by_counts(services, round_id) == by_sets(services, round_id) == (2, 2, True)

    # A round that selected nobody is never complete.
    with services.sessions.begin() as session:
        session.execute(delete(RoundParticipant).where(RoundParticipant.round_id == round_id))
    assert by_counts(services, round_id) == by_sets(services, round_id) == (0, 0, False)
    services.close()
