"""AuditConfig's groups against its flat format: the keys, their order, flat keywords, and the
checks each group makes on its own."""

from __future__ import annotations

import dataclasses

import pytest

from service.audit import (
    AggregationSettings,
    AuditConfig,
    EvidenceSettings,
    FedNCLSettings,
    FedNoRoSettings,
    FedRNSettings,
    InvalidParameterError,
    StatusRule,
)
from service.audit.audit_config import FLAT_KEYS

STORED_KEYS = [
    "detectors",
    "primary_detector",
    "aggregation",
    "fednoro_random_states",
    "fednoro_require_separation",
    "fednoro_separation_threshold",
    "fednoro_separation_quantile",
    "fednoro_separation_statistic",
    "fednoro_min_clients",
    "evidence_q",
    "evidence_min_clients",
    "evidence_min_informativeness",
    "evidence_max_flagged_fraction",
    "evidence_max_heterogeneity",
    "evidence_min_class_count",
    "evidence_mixture_check",
    "evidence_accuracy_check",
    "evidence_min_accuracy_gap",
    "evidence_error_check",
    "evidence_min_error_excess",
    "evidence_min_error_sites",
    "evidence_min_error_dispersion",
    "evidence_anchored_min_error_excess",
    "fednoro_confirmed_groups",
    "fednoro_separation_groups",
    "fedncl_beta",
    "fedncl_two_sided",
    "fedncl_divergence_variant",
    "fedncl_loss_mode",
    "fedncl_min_clients",
    "fedncl_tau",
    "fedncl_t_corr",
    "fedncl_t_k",
    "fedncl_alpha",
    "fedrn_k",
    "fedrn_alpha",
    "fedrn_similarity",
    "neighbor_chunk_size",
    "daagg_variant",
    "trim_fraction",
    "status_m",
    "status_w",
    "aggregation_flags",
    "max_client_weight_factor",
    "anchor_lead",
    "anchor_lead_only_rounds",
    "geometry_check",
    "geometry_min_z",
    "geometry_min_sites",
    "geometry_min_homogeneity_p",
]
"""The flat keys of stored configurations and of the API's ``audit`` object, in their order:
written out, so that grouping the fields differently cannot change the format."""


def test_to_json_writes_the_flat_keys_in_their_stored_order() -> None:
    assert list(AuditConfig().to_json()) == STORED_KEYS


def test_every_field_of_every_group_has_exactly_one_flat_key() -> None:
    groups = [
        f.name
        for f in dataclasses.fields(AuditConfig)
        if f.name not in ("detectors", "primary_detector", "aggregation")
    ]
    config = AuditConfig()
    fields = {(name, f.name) for name in groups for f in dataclasses.fields(getattr(config, name))}
    assert sorted(FLAT_KEYS.values()) == sorted(fields)


def test_flat_keywords_build_the_same_groups() -> None:
    flat = AuditConfig.from_flat(
        evidence_q=0.05,
        fednoro_min_clients=6,
        fedncl_t_k=4,
        neighbor_chunk_size=16,
        aggregation_flags="round",
        status_m=1,
    )
    grouped = AuditConfig(
        evidence=EvidenceSettings(q=0.05),
        fednoro=FedNoRoSettings(min_clients=6),
        fedncl=FedNCLSettings(t_k=4),
        fedrn=FedRNSettings(chunk_size=16),
        aggregation_settings=AggregationSettings(flags="round"),
        status=StatusRule(m=1),
    )
    assert flat == grouped
    assert AuditConfig.from_json(grouped.to_json()) == grouped
    assert grouped.to_json()["neighbor_chunk_size"] == 16
    assert grouped.to_json()["aggregation_flags"] == "round"


def test_one_value_of_a_group_is_replaced_in_that_group() -> None:
    config = AuditConfig(aggregation="daagg")
    changed = dataclasses.replace(config, status=dataclasses.replace(config.status, w=5))
    assert (changed.status.m, changed.status.w) == (2, 5)
    assert changed.to_json() == {**config.to_json(), "status_w": 5}


@pytest.mark.parametrize(
    ("build", "match"),
    [
        # a group checks its own values, naming the flat key a user writes
        (lambda: StatusRule(m=4), "status_m: must be <= 3"),
        (lambda: FedRNSettings(chunk_size=0), "neighbor_chunk_size"),
        (lambda: AggregationSettings(flags="always"), "aggregation_flags"),
        (lambda: FedNCLSettings(tau=0.5), "fedncl_tau"),
        (lambda: FedNoRoSettings(random_states=()), "fednoro_random_states"),
        # the evidence detector checks its parameters, under its own names
        (lambda: EvidenceSettings(q=0.9), r"^q: must be <= 0\.5"),
        # and a group is of its type
        (lambda: AuditConfig(status=(1, 3)), "status: expected StatusRule, got tuple"),  # type: ignore[arg-type]
    ],
)
def test_a_group_checks_its_values(build, match) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        build()


def test_flat_keywords_are_checked_like_json() -> None:
    with pytest.raises(InvalidParameterError, match=r"unknown configuration key\(s\) \['q'\]"):
        AuditConfig.from_flat(q=0.05)
    # a group's name is not a flat key either
    with pytest.raises(InvalidParameterError, match=r"\['status'\]"):
        AuditConfig.from_json({"status": {"m": 1}})
