"""Per-key budgets for what anybody can cause: refused-token events, and token guessing.

A caller without a valid token can make the coordinator write an ``auth.rejected`` event on
every request. Unbounded, that is a way to fill the database from outside. :class:`EventBudget`
lets at most ``limit`` such events per key (a federation) through in each window of
``window_s`` seconds and counts the others, so that the next event recorded can say how many
were left out: nothing is dropped without a trace.

:class:`FailureThrottle` slows token guessing: a client address that gave ``limit`` wrong tokens
(bearer or dashboard login) within ``window_s`` seconds is refused (429 with ``Retry-After``)
until that window ends, whatever token it sends meanwhile, so a guess made while throttled
tells nothing even when it is right. Requests without a token are not counted.

Both live in the process. With several coordinator replicas each keeps its own, so the bound is
per replica.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime


@dataclass
class _Window:
    start: datetime
    used: int = 0
    left_out: int = 0
    full: bool = False


@dataclass(frozen=True)
class Admission:
    """The answer for one event."""

    record: bool
    """Whether to write this event."""
    left_out_before: int
    """Events of the same key not written since the last one that was (0 when ``record`` is
    False: the count goes on to the next written event)."""
    first_left_out: bool
    """True for the first event left out in a window (to log once per window, not per event)."""


class EventBudget:
    """At most ``limit`` events per key in each fixed window of ``window_s`` seconds.

    A key's window starts at its first event and restarts at the first event after it ends.
    Thread-safe. Memory: one small record per key seen; callers key by things that exist in the
    database (a federation), not by what a request claims.
    """

    def __init__(self, limit: int, window_s: float = 60.0) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        if window_s <= 0:
            raise ValueError(f"window_s: must be positive, got {window_s}")
        self.limit = limit
        self.window_s = window_s
        self._windows: dict[Hashable, _Window] = {}
        self._lock = threading.Lock()

    def admit(self, key: Hashable, now: datetime) -> Admission:
        """Count one event of ``key`` at ``now`` and say whether to write it."""
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _Window(start=now)
            elif (now - window.start).total_seconds() >= self.window_s:
                window.start, window.used, window.full = now, 0, False
            if window.used < self.limit:
                window.used += 1
                left_out, window.left_out = window.left_out, 0
                return Admission(record=True, left_out_before=left_out, first_left_out=False)
            window.left_out += 1
            first, window.full = not window.full, True
            return Admission(record=False, left_out_before=0, first_left_out=first)


@dataclass
class _Failures:
    start: datetime
    count: int = 0


class FailureThrottle:
    """At most ``limit`` failures per key (a client address) in a window of ``window_s``
    seconds that starts at the key's first failure; then the key is refused until the window
    ends. Thread-safe; memory is bounded by ``max_keys`` (expired windows are dropped first,
    then the oldest)."""

    def __init__(self, limit: int, window_s: float, *, max_keys: int = 100_000) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        if window_s <= 0:
            raise ValueError(f"window_s: must be positive, got {window_s}")
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._keys: dict[Hashable, _Failures] = {}
        self._lock = threading.Lock()

    def _window(self, key: Hashable, now: datetime) -> _Failures | None:
        entry = self._keys.get(key)
        if entry is not None and (now - entry.start).total_seconds() >= self.window_s:
            del self._keys[key]
            return None
        return entry

    def retry_after(self, key: Hashable, now: datetime) -> int | None:
        """Whole seconds until `key` may try again; None when it may try now."""
        with self._lock:
            entry = self._window(key, now)
            if entry is None or entry.count < self.limit:
                return None
            left = self.window_s - (now - entry.start).total_seconds()
            return max(1, math.ceil(left))

    def failed(self, key: Hashable, now: datetime) -> None:
        """Count one failure of `key` at `now`."""
        with self._lock:
            entry = self._window(key, now)
            if entry is None:
                if len(self._keys) >= self.max_keys:
                    self._prune(now)
                entry = self._keys[key] = _Failures(start=now)
            entry.count += 1

    def _prune(self, now: datetime) -> None:
        for key in [
            k for k, e in self._keys.items() if (now - e.start).total_seconds() >= self.window_s
        ]:
            del self._keys[key]
        while len(self._keys) >= self.max_keys:
            del self._keys[next(iter(self._keys))]  # the oldest window (insertion order)
