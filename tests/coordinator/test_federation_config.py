"""What each method preset resolves to (resolve_config): warm-up and method audit settings."""

from __future__ import annotations

import pytest

from service.coordinator.federation_config import FederationConfigInput, resolve_config


@pytest.mark.parametrize(
    ("method", "rounds", "expected"),
    [
        ("fednoro", 30, 3),  # FedNoRo T1 = 10 of 100 rounds -> 3 of 30
        ("fednoro", 100, 10),
        ("fedncl", 30, 3),  # FedNoRo's 10 % (the Fed-NCL paper has none; see METHOD_WARMUP)
        ("fedncl", 150, 15),
        ("fedrn", 30, 6),  # FedRN 100 of 500 -> 6 of 30
        ("fedavg", 20, 2),
        ("fednoro", 1, 0),  # a one-round federation cannot warm up: capped at rounds - 1
        ("fedncl", 2, 1),  # 10 % of 2 is 0.2 -> at least 1, and 1 <= rounds - 1
    ],
)
def test_default_warmup(method: str, rounds: int, expected: int) -> None:
    config = resolve_config(FederationConfigInput(method=method), rounds=rounds)
    assert config["warmup_rounds"] == expected


@pytest.mark.parametrize("method", ["fedncl", "fednoro", "fedrn"])
def test_explicit_warmup_wins(method: str) -> None:
    config = resolve_config(FederationConfigInput(method=method, warmup_rounds=0), rounds=30)
    assert config["warmup_rounds"] == 0


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("fedncl", "round"),  # Fed-NCL penalises each round's flagged clients (METHOD_AUDIT)
        ("fednoro", "status"),  # AuditConfig's default
        ("fedavg", "status"),
    ],
)
def test_noisy_set_for_the_aggregation(method: str, expected: str) -> None:
    config = resolve_config(FederationConfigInput(method=method), rounds=30)
    assert config["audit"]["aggregation_flags"] == expected


def test_the_operators_audit_settings_win_over_the_method() -> None:
    data = FederationConfigInput(method="fedncl", audit={"aggregation_flags": "status"})
    assert resolve_config(data, rounds=30)["audit"]["aggregation_flags"] == "status"


def test_the_accuracy_evidence_asks_the_sites_for_their_accuracy() -> None:
    # Detectors without "expertise": the sites send train_accuracy only when the evidence
    # detector's accuracy check is on (else the check would never have its input).
    def signals(audit: dict) -> list[str]:
        data = FederationConfigInput(method="fedavg", detectors=["evidence"], audit=audit)
        return list(resolve_config(data, rounds=30)["signals"])

    assert "train_accuracy" not in signals({})
    assert "train_accuracy" in signals({"evidence_accuracy_check": True})


def test_the_detectors_signals_are_signals_a_site_can_send() -> None:
    from service.audit import DETECTOR_REGISTRY, AuditConfig, EvidenceSettings
    from service.coordinator.federation_config import SIGNALS

    every = AuditConfig(evidence=EvidenceSettings(accuracy_check=True))
    for spec in DETECTOR_REGISTRY.values():
        assert spec.signals(every) <= set(SIGNALS)


@pytest.mark.parametrize(
    ("primary", "detectors", "expected"),
    [
        ("fedncl", ["fedncl"], ["train_loss"]),
        ("fednoro", ["fednoro"], ["per_class_loss", "train_loss"]),
        ("evidence", ["evidence"], ["per_class_loss", "train_loss"]),
        ("fedncl", ["expertise", "fedncl"], ["probe_softmax", "train_accuracy", "train_loss"]),
        ("fedncl", None, ["per_class_loss", "probe_softmax", "train_accuracy", "train_loss"]),
    ],
)
def test_a_federation_asks_for_its_detectors_signals(
    primary: str, detectors: list[str] | None, expected: list[str]
) -> None:
    data = FederationConfigInput(method="fedavg", primary_detector=primary, detectors=detectors)
    assert resolve_config(data, rounds=30)["signals"] == expected
