"""The coordinator's memory of anchor-led rounds (service.audit.anchor_mode's input): the
``audit.anchor_led`` events of the rounds just before, in a row; and the methods it applies to."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from service.config import Settings
from service.coordinator.federation_config import FederationConfigInput, resolve_config
from service.coordinator.resources import Services
from service.coordinator.round_events import anchor_led_rounds, record_anchor_lead
from service.store.session import make_engine, make_sessionmaker
from tests.coordinator._federations import new_federation

pytestmark = pytest.mark.db


def test_the_lead_counts_the_led_rounds_just_before_in_a_row(settings: Settings) -> None:
    services = Services.create(
        settings, make_sessionmaker(make_engine(settings.resolved_database_url))
    )
    with services.sessions.begin() as session:
        fid, other = (new_federation(session, name, method="fednoro") for name in ("led", "other"))
        led = {"aggregation": {"details": {"anchor_led": {"round": 1, "sites": 1}}}}
        plain: dict[str, Any] = {"aggregation": {"details": {}}}
        # rounds 4-6 led, 7 not (the anchor missed it), 9-11 led; another federation's 8
        for federation_id, index, result in (
            (fid, 4, led),
            (fid, 5, led),
            (fid, 6, led),
            (fid, 7, plain),
            (fid, 9, led),
            (fid, 10, led),
            (fid, 11, led),
            (other, 8, led),
        ):
            rnd = cast(Any, SimpleNamespace(index=index, id=None))
            record_anchor_lead(session, federation_id, rnd, cast(dict[str, object], result))
    with services.sessions.begin() as session:
        assert anchor_led_rounds(session, fid, 4) == 0  # nothing before round 4
        assert anchor_led_rounds(session, fid, 7) == 3  # rounds 4, 5 and 6
        assert anchor_led_rounds(session, fid, 8) == 0  # round 7 was not led: the lead broke
        assert anchor_led_rounds(session, fid, 9) == 0
        assert anchor_led_rounds(session, fid, 12) == 3  # 9, 10, 11
        assert anchor_led_rounds(session, fid, 11) == 2  # round 11's own is not before itself
        assert anchor_led_rounds(session, other, 9) == 1
        assert anchor_led_rounds(session, uuid.uuid4(), 9) == 0


def test_plain_fedavg_is_never_anchor_led_and_the_robust_methods_are() -> None:
    def lead(method: str) -> object:
        return resolve_config(FederationConfigInput(method=method), rounds=40)["audit"][
            "anchor_lead"
        ]

    assert lead("fedavg") is False
    assert lead("fednoro") is True
