"""Test helpers: a StateReader that records every read (to check streaming), Optional narrowing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from service.audit import DictStateReader
from service.audit.verdict_types import ABSENT, Absent

T = TypeVar("T")


class RecordingReader(DictStateReader):
    """A DictStateReader that appends ``(label, name)`` to a shared log on every ``get``."""

    def __init__(
        self, tensors: Mapping[str, np.ndarray], label: str, log: list[tuple[str, str]]
    ) -> None:
        super().__init__(tensors)
        self.label = label
        self.log = log

    def get(self, name: str) -> np.ndarray:
        self.log.append((self.label, name))
        return super().get(name)


def reads_grouped_by_tensor(log: list[tuple[str, str]], names: list[str]) -> bool:
    """True when the reads of each tensor name form one contiguous run per pass.

    Streaming means: for each name, every reader's copy of that tensor is read, then the
    next name; never all names of one reader first.
    """
    sequence = [name for _label, name in log]
    runs = [sequence[0]] if sequence else []
    for name in sequence[1:]:
        if name != runs[-1]:
            runs.append(name)
    # each pass over the state visits the names in order, one run per name
    return len(runs) % len(names) == 0 and all(
        runs[i] == names[i % len(names)] for i in range(len(runs))
    )


def present(value: T | None) -> T:
    """Return ``value`` after asserting it is not None (narrows Optional results in tests)."""
    assert value is not None
    return value


def given(value: T | Absent | None) -> T:
    """Return a record's field after asserting it is there and not None (narrows the
    ``ABSENT``-or-None fields of :mod:`service.audit.verdict_types` in tests)."""
    assert value is not ABSENT
    assert value is not None
    return value
