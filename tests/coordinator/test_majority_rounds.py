"""The coordinator's count of rounds abstained for a noisy majority (majority_memory's input)."""

from __future__ import annotations

import pytest

from service.config import Settings
from service.coordinator.resources import Services
from service.coordinator.round_events import majority_rounds
from service.store import repositories
from service.store.session import make_engine, make_sessionmaker
from tests.coordinator._federations import new_federation

pytestmark = pytest.mark.db

MIXTURE = (
    "FedNoRo's loss mixture splits the sites into two separated groups and the higher-loss group "
    "is not a clear minority (6 of 10 sites, 58% of the samples): the consensus may be the noisy "
    "side"
)
FLAGGED = (
    "the sites that would be flagged are not a clear minority (5 of 8 sites, 60% of the samples)"
)
WEAK = "the global model does not beat the label prior on the median site's data (0.01 < 0.05)"


def test_majority_rounds_counts_the_majority_abstentions_of_earlier_rounds(settings: Settings):
    services = Services.create(
        settings, make_sessionmaker(make_engine(settings.resolved_database_url))
    )
    with services.sessions.begin() as session:
        fid, other = (new_federation(session, name) for name in ("memory", "other"))
        # (federation, round, reason, kind, the event's "majority": None = not recorded, as
        # in events written before the field existed: then the reason's text decides)
        for federation_id, index, reason, kind, majority in (
            (fid, 4, MIXTURE, "audit.inconclusive", None),
            (fid, 5, WEAK, "audit.inconclusive", None),
            (fid, 6, FLAGGED, "audit.inconclusive", None),
            (fid, 7, MIXTURE, "audit.undetermined", None),  # not an abstention of the consensus
            (fid, 9, MIXTURE, "audit.inconclusive", None),
            (fid, 11, "reworded", "audit.inconclusive", True),  # the field, not the text
            (fid, 12, MIXTURE, "audit.inconclusive", False),
            (other, 3, MIXTURE, "audit.inconclusive", None),  # another federation's
        ):
            data = {"index": index, "detector": "evidence", "status": "x", "reason": reason}
            if majority is not None:
                data["majority"] = majority
            repositories.add_event(
                session,
                kind=kind,
                actor="system",
                message=f"round {index}",
                federation_id=federation_id,
                data=data,
            )
    with services.sessions.begin() as session:
        assert majority_rounds(session, fid, 10) == 3  # rounds 4, 6 and 9
        assert majority_rounds(session, fid, 9) == 2  # round 9's own not before itself
        assert majority_rounds(session, fid, 5) == 1
        assert majority_rounds(session, fid, 20) == 4  # and 11 (its field), not 12 (its field)
        assert majority_rounds(session, other, 10) == 1
