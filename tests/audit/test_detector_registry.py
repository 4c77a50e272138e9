"""The registry of detectors: its names by hand, which detectors run given a round's inputs, and
the signals a federation requires for them."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from service.audit import (
    DETECTOR_REGISTRY,
    DETECTORS,
    PRIMARY_DETECTORS,
    AuditConfig,
    ClientRoundData,
    DictStateReader,
    EvidenceDetector,
    EvidenceSettings,
    FedNCLDetector,
    FedNCLSettings,
    FedNoRoDetector,
    FedNoRoSettings,
    required_signals,
)
from service.audit.audit_config import PROBABILITY_DETECTORS
from service.audit.detector_registry import evidence_detector, fedncl_detector, fednoro_detector
from service.audit.round_detectors import _detector_present, run_detectors
from service.audit.round_inputs import CheckedClients, check_clients
from service.audit.round_pass import RoundPass


def test_the_registry_holds_the_four_detectors_by_name() -> None:
    # Written out, not read from the registry: a detector added or dropped must change this.
    assert DETECTORS == ("fednoro", "fedncl", "expertise", "evidence")
    assert tuple(DETECTOR_REGISTRY) == DETECTORS
    assert PRIMARY_DETECTORS == ("fednoro", "fedncl", "evidence")
    assert PROBABILITY_DETECTORS == ("fednoro",)
    assert [name for name, spec in DETECTOR_REGISTRY.items() if spec.classes] == [
        "fednoro",
        "evidence",
    ]
    assert {name: spec.input for name, spec in DETECTOR_REGISTRY.items()} == {
        "fednoro": "per_class_loss",
        "fedncl": "train_loss",
        "expertise": "train_accuracy",
        "evidence": "per_class_loss",
    }
    assert {name: spec.reads for name, spec in DETECTOR_REGISTRY.items() if spec.reads} == {
        "evidence": ("fednoro",)
    }


def test_each_input_is_a_field_of_the_round_inputs() -> None:
    round_fields = {f.name for f in dataclasses.fields(ClientRoundData)}
    checked_fields = {f.name for f in dataclasses.fields(CheckedClients)}
    for spec in DETECTOR_REGISTRY.values():
        assert spec.input in round_fields
        assert spec.input in checked_fields


def test_a_detector_that_is_read_reads_none_itself() -> None:
    # run_detectors runs the detectors that are read first, in one step (not a full ordering).
    read = {r for spec in DETECTOR_REGISTRY.values() for r in spec.reads}
    assert read <= set(DETECTOR_REGISTRY)
    assert all(not DETECTOR_REGISTRY[name].reads for name in read)


def test_the_factories_build_the_configured_detectors_from_their_groups() -> None:
    config = AuditConfig(
        fednoro=FedNoRoSettings(min_clients=7),
        fedncl=FedNCLSettings(beta=2.0),
        evidence=EvidenceSettings(q=0.05, min_error_sites=4),
    )
    built = {
        "fednoro": fednoro_detector(config.fednoro),
        "fedncl": fedncl_detector(config.fedncl),
        "evidence": evidence_detector(config.evidence),
    }
    assert isinstance(built["fednoro"], FedNoRoDetector)
    assert built["fednoro"].min_clients == 7
    assert isinstance(built["fedncl"], FedNCLDetector)
    assert built["fedncl"].beta == 2.0
    assert isinstance(built["evidence"], EvidenceDetector)
    assert (built["evidence"].q, built["evidence"].min_error_sites) == (0.05, 4)
    # the evidence group's fields are the detector's parameters, one for one
    for field in dataclasses.fields(EvidenceSettings):
        assert getattr(built["evidence"], field.name) == getattr(config.evidence, field.name)


def test_required_signals() -> None:
    default = AuditConfig()
    with_accuracy = AuditConfig(evidence=EvidenceSettings(accuracy_check=True))
    assert required_signals([], default) == frozenset()
    assert required_signals(["fednoro"], default) == {"per_class_loss"}
    assert required_signals(["fedncl"], default) == {"train_loss"}
    assert required_signals(["expertise"], default) == {"train_accuracy", "probe_softmax"}
    assert required_signals(["evidence"], default) == {"per_class_loss"}
    assert required_signals(["evidence"], with_accuracy) == {"per_class_loss", "train_accuracy"}
    assert required_signals(DETECTORS, default) == {
        "per_class_loss",
        "train_loss",
        "train_accuracy",
        "probe_softmax",
    }


def _clients(**sent: list[Any]) -> CheckedClients:
    """Three clients; ``sent`` maps a signal to each client's value (None: not sent)."""
    clients = [
        ClientRoundData(
            client_id=f"c{k}",
            num_samples=30,
            class_counts=[10, 10, 10],
            state=DictStateReader({"w": np.full(2, float(k), dtype=np.float32)}),
            **{name: values[k] for name, values in sent.items()},
        )
        for k in range(3)
    ]
    return check_clients(clients, "clients")


LOSS = [0.5, 0.6, 0.7]


@pytest.mark.parametrize(
    ("sent", "present"),
    [
        ({}, set()),
        ({"per_class_loss": [LOSS, LOSS, LOSS]}, {"fednoro", "evidence"}),
        ({"per_class_loss": [None, LOSS, None]}, {"fednoro", "evidence"}),
        ({"train_loss": [0.4, None, None]}, {"fedncl"}),
        ({"train_accuracy": [None, None, 0.9]}, {"expertise"}),
        (
            {"train_loss": [0.4, 0.5, 0.6], "train_accuracy": [0.9, 0.8, 0.7]},
            {"fedncl", "expertise"},
        ),
        # spreads and error counts alone run nothing: the evidence detector needs the losses
        ({"per_class_loss_sd": [LOSS, LOSS, LOSS]}, set()),
    ],
)
def test_which_detectors_are_present(sent: dict[str, list[Any]], present: set[str]) -> None:
    data = _clients(**sent)
    assert {name for name in DETECTOR_REGISTRY if _detector_present(name, data)} == present


def test_run_detectors_runs_the_present_ones_and_the_primary() -> None:
    # Only Fed-NCL's input came: with detectors=None, Fed-NCL runs beside the primary (evidence),
    # which is undetermined, naming the clients without losses.
    data = _clients(train_loss=[0.4, 0.5, 0.6])
    shared = RoundPass(DictStateReader({"w": np.zeros(2, dtype=np.float32)}), data.states)
    results = run_detectors(data, AuditConfig(), shared, None, None)
    assert list(results) == ["fedncl", "evidence"]
    assert results["evidence"].status == "undetermined"
    assert results["evidence"].reason == "no per_class_loss from client(s) ['c0', 'c1', 'c2']"
    assert results["fedncl"].method == "fedncl"


def test_run_detectors_runs_a_detector_that_is_read_first() -> None:
    # FedNoRo's result is the evidence detector's cross-check: it runs first whatever the order
    # asked; a detector whose input some client lacks is undetermined and names that client.
    data = _clients(per_class_loss=[LOSS, None, LOSS])
    shared = RoundPass(DictStateReader({"w": np.zeros(2, dtype=np.float32)}), data.states)
    config = AuditConfig(detectors=("evidence", "expertise", "fednoro"))
    results = run_detectors(data, config, shared, None, None)
    assert list(results) == ["fednoro", "evidence", "expertise"]
    assert results["fednoro"].reason == "no per_class_loss from client(s) ['c1']"
    assert results["expertise"].reason == "no train_accuracy from client(s) ['c0', 'c1', 'c2']"
    assert all(r.status == "undetermined" for r in results.values())
