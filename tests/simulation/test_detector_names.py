"""The simulator's table order of detectors is the service's registry (it may not import it)."""

from __future__ import annotations

from fedaudit_sim.records import DETECTOR_NAMES
from service.audit import DETECTORS


def test_the_simulator_names_the_registered_detectors_in_their_order() -> None:
    assert DETECTOR_NAMES == DETECTORS
