"""EventBudget: at most `limit` events per key and window, the rest counted, never lost.
FailureThrottle: wrong tokens per address, refused past the limit until the window ends."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from service.coordinator.ratelimit import Admission, EventBudget, FailureThrottle

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_limit_per_window_then_the_next_recorded_event_counts_the_rest():
    budget = EventBudget(limit=2, window_s=60)
    assert budget.admit("f", at(0)) == Admission(True, 0, False)
    assert budget.admit("f", at(1)) == Admission(True, 0, False)
    # third and fourth in the same window: left out, only the first of them says so
    assert budget.admit("f", at(2)) == Admission(False, 0, True)
    assert budget.admit("f", at(59.9)) == Admission(False, 0, False)
    # the window started at 0 s ends at 60 s: a new one, whose first event carries the 2
    assert budget.admit("f", at(60)) == Admission(True, 2, False)
    assert budget.admit("f", at(61)) == Admission(True, 0, False)
    assert budget.admit("f", at(62)) == Admission(False, 0, True)


def test_keys_have_separate_budgets():
    budget = EventBudget(limit=1, window_s=60)
    assert budget.admit("a", at(0)).record
    assert budget.admit("b", at(0)).record
    assert not budget.admit("a", at(1)).record
    assert budget.admit("b", at(61)) == Admission(True, 0, False)
    assert budget.admit("a", at(61)) == Admission(True, 1, False)


def test_concurrent_callers_never_exceed_the_limit():
    budget = EventBudget(limit=5, window_s=60)
    answers: list[Admission] = []
    lock = threading.Lock()

    def hammer() -> None:
        for _ in range(100):
            answer = budget.admit("f", at(1))
            with lock:
                answers.append(answer)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(a.record for a in answers) == 5
    assert sum(a.first_left_out for a in answers) == 1
    # all 795 left out are reported by the first event of the next window
    assert budget.admit("f", at(61)).left_out_before == 795


@pytest.mark.parametrize(("limit", "window"), [(0, 60.0), (1, 0.0)])
def test_bad_parameters(limit: int, window: float):
    with pytest.raises(ValueError, match="limit|window_s"):
        EventBudget(limit=limit, window_s=window)


def test_failure_throttle_refuses_past_the_limit_until_the_window_ends() -> None:
    throttle = FailureThrottle(limit=3, window_s=60.0)
    start = datetime(2026, 11, 26, tzinfo=UTC)
    for i in range(3):
        assert throttle.retry_after("10.0.0.1", start) is None
        throttle.failed("10.0.0.1", start + timedelta(seconds=i))
    assert throttle.retry_after("10.0.0.1", start + timedelta(seconds=10)) == 50
    assert throttle.retry_after("10.0.0.1", start + timedelta(seconds=59.5)) == 1
    assert throttle.retry_after("10.0.0.2", start) is None  # per key
    assert throttle.retry_after("10.0.0.1", start + timedelta(seconds=60)) is None
    throttle.failed("10.0.0.1", start + timedelta(seconds=60))  # a new window, count 1
    assert throttle.retry_after("10.0.0.1", start + timedelta(seconds=61)) is None


def test_failure_throttle_memory_is_bounded() -> None:
    throttle = FailureThrottle(limit=1, window_s=60.0, max_keys=100)
    now = datetime(2026, 11, 26, tzinfo=UTC)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", now)
    assert len(throttle._keys) <= 100
    assert throttle.retry_after("10.0.3.231", now) is not None  # the newest is kept
