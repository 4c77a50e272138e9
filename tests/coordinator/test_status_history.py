"""status_history: what a client's status and flags were before a round (live and replayed)."""

from __future__ import annotations

from typing import Any

from service.audit import AuditConfig, StatusHistory, StatusRule
from service.coordinator.audits import counted_flags, status_history
from service.store.tables import Client


def entry(round_index: int, primary: bool | None, *, warmup: bool = False) -> dict[str, Any]:
    return {"round": round_index, "in_warmup": warmup, "primary": primary}


# rounds 0-1 warm-up (flagged, which must not count), then T, None, T, F, F, F in rounds 2-7
HISTORY = [
    entry(0, True, warmup=True),
    entry(1, True, warmup=True),
    entry(2, True),
    entry(3, None),
    entry(4, True),
    entry(5, False),
    entry(6, False),
    entry(7, False),
]
CONFIG = AuditConfig()  # m = 2, w = 3


def client(status: str, history: list[dict[str, Any]]) -> Client:
    return Client(name="site", status=status, flag_history=history)


def test_counted_flags_skip_the_warm_up_and_undetermined_rounds() -> None:
    assert counted_flags(client("trusted", HISTORY), 8) == [True, True, False, False, False]
    assert counted_flags(client("trusted", HISTORY), 5) == [True, True]
    assert counted_flags(client("trusted", []), 5) == []


def test_at_a_round_close_the_stored_status_and_the_last_w_determined_flags() -> None:
    # every entry is older than round 8: the stored status is the live one; of the determined
    # flags T, T, F, F, F (warm-up and None skipped) the last three are kept
    assert status_history(client("trusted", HISTORY), 8, CONFIG) == StatusHistory(
        status="trusted", flags=(False, False, False)
    )
    # a stored status is taken as it is (whatever produced it, e.g. a different rule)
    assert status_history(client("noisy", HISTORY), 8, CONFIG).status == "noisy"


def test_an_older_round_replays_the_rule() -> None:
    # before round 5: determined T (r2), T (r4) -> after r2 "suspect", after r4 two flags in
    # the window -> "noisy"; the stored status ("trusted", after round 7) is not used
    assert status_history(client("trusted", HISTORY), 5, CONFIG) == StatusHistory(
        status="noisy", flags=(True, True)
    )
    # before round 7: T, T, F, F -> last three T, F, F: one flag, not three clean -> stays noisy
    assert status_history(client("trusted", HISTORY), 7, CONFIG) == StatusHistory(
        status="noisy", flags=(True, False, False)
    )
    # before round 4: only r2's flag (r3 undetermined) -> suspect
    assert status_history(client("noisy", HISTORY), 4, CONFIG) == StatusHistory(
        status="suspect", flags=(True,)
    )
    # before round 2: warm-up entries only -> a new client
    assert status_history(client("noisy", HISTORY), 2, CONFIG) == StatusHistory(
        status="trusted", flags=()
    )


def test_the_replay_uses_the_configs_m_and_w() -> None:
    # m = 1, w = 1: noisy after r2's flag, still noisy after r4's
    one = AuditConfig(status=StatusRule(m=1, w=1))
    assert status_history(client("trusted", HISTORY), 5, one) == StatusHistory(
        status="noisy", flags=(True,)
    )
    # before round 6 the last determined flag is r5's F: with w = 1 one clean round is enough
    assert status_history(client("trusted", HISTORY), 6, one).status == "trusted"


def test_a_client_without_history() -> None:
    assert status_history(client("trusted", []), 3, CONFIG) == StatusHistory()


def test_whether_the_latest_flag_was_the_geometrys() -> None:
    # r2 flagged by the losses, r4 by the update geometry alone, r5-7 clean: the latest flag
    # raised (r4's) was the geometry's, before any round after it
    history = [dict(e) for e in HISTORY]
    history[4]["geometry"] = True
    assert status_history(client("noisy", history), 8, CONFIG).by_geometry is True
    assert status_history(client("noisy", history), 5, CONFIG).by_geometry is True
    # before round 4 the latest flag is r2's, the losses'; warm-up flags never count
    assert status_history(client("noisy", history), 4, CONFIG).by_geometry is False
    history[1]["geometry"] = True
    assert status_history(client("noisy", history), 2, CONFIG).by_geometry is False
    assert status_history(client("noisy", HISTORY), 8, CONFIG).by_geometry is False


def test_a_pin_to_trusted_ends_the_geometrys_claim() -> None:
    history = [dict(e) for e in HISTORY]
    history[4]["geometry"] = True
    # pinned trusted now: not carried
    pinned = Client(name="site", status="noisy", flag_history=history, pinned_status="trusted")
    assert status_history(pinned, 8, CONFIG).by_geometry is False
    # a geometry flag the pin overrode (effective False) is nobody's, also after the unpin
    history.append({"round": 8, "in_warmup": False, "primary": True, "geometry": True})
    history[-1]["effective"] = False
    assert status_history(client("noisy", history), 9, CONFIG).by_geometry is False
    # a pin to noisy keeps the geometry's claim
    noisy_pin = Client(name="site", status="noisy", flag_history=history[:8], pinned_status="noisy")
    assert status_history(noisy_pin, 8, CONFIG).by_geometry is True
