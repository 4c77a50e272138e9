"""Trust anchors: error counts against the anchors and anchor-led aggregation
(service.audit.anchor_mode)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.audit import AuditConfig, DictStateReader, EvidenceDetector, run_audit
from service.audit.anchor_mode import (
    ANCHOR_LEAD_ONLY_ROUNDS,
    ANCHORED_MIN_ERROR_EXCESS,
    anchor_led_clients,
    anchored_error_evidence,
)
from service.audit.detection import ClientVerdict, DetectionResult
from service.audit.round_inputs import ClientRoundData
from service.audit.verdict_types import EvidenceSummary, EvidenceVerdictEvidence
from tests.audit._synthetic import loss_clients, synthetic_federation


def _counts(
    errors: list[list[int]], counts: list[list[int]], anchor: list[bool], excess: float = 0.1
):
    return anchored_error_evidence(
        np.array(errors),
        np.array(counts),
        exclude=~np.array(anchor),
        min_excess=excess,
        min_dispersion=0.5,
    )


def test_defaults_are_the_documented_ones():
    assert ANCHORED_MIN_ERROR_EXCESS == 0.10
    assert ANCHOR_LEAD_ONLY_ROUNDS == 2


def test_a_site_far_above_the_anchors_rate_is_significant_and_one_within_the_floor_is_not():
    # The anchor: 50 + 50 samples, no error: each class's rate (0 + 1/2) / (50 + 1) = 1/102.
    ev = _counts(
        errors=[[0, 0], [20, 0], [4, 2]],
        counts=[[50, 50], [40, 40], [40, 40]],
        anchor=[True, False, False],
    )
    assert ev.expected[1] == pytest.approx(80 / 102)
    assert ev.expected[2] == pytest.approx(80 / 102)
    assert list(ev.observed) == [0, 20, 6]
    assert ev.p_value[0] == 1.0  # an anchor is never judged
    assert ev.p_value[1] < 1e-3  # 20 errors where 0.78 expected
    # 6 errors of 80 is 5.2 above the expectation: under the floor 0.1 x 80 = 8, so p = 1.
    assert ev.p_value[2] == 1.0
    assert ev.z[0] == 0.0
    assert ev.z[1] > 3.0
    assert list(ev.fit_set) == [True, False, False]
    assert ev.dispersion == 0.5
    # Without the floor the same 6 errors are judged (and more likely than 20 errors).
    bare = _counts(
        [[0, 0], [20, 0], [4, 2]], [[50, 50], [40, 40], [40, 40]], [True] + [False] * 2, 0.0
    )
    assert ev.p_value[1] == bare.p_value[1] < bare.p_value[2] < 1.0


def test_a_class_no_anchor_holds_gives_no_evidence():
    ev = _counts(
        errors=[[0, 0], [0, 30]],
        counts=[[50, 0], [0, 30]],
        anchor=[True, False],
    )
    assert ev.expected[1] == 0.0
    assert ev.observed[1] == 0
    assert ev.p_value[1] == 1.0
    assert np.isnan(ev.class_rate[1])
    assert ev.class_rate[0] == 0.0


def test_the_anchors_rates_are_pooled_and_the_order_of_sites_does_not_matter():
    # Two anchors: class 0 pooled 2 errors of 40 -> (2 + 0.5) / 41.
    errors = [[1, 0], [1, 0], [12, 0], [1, 0]]
    counts = [[20, 0], [20, 0], [30, 0], [30, 0]]
    anchor = [True, True, False, False]
    ev = _counts(errors, counts, anchor)
    assert ev.expected[2] == pytest.approx(30 * 2.5 / 41)
    assert ev.class_rate[0] == pytest.approx(2 / 40)
    order = [3, 2, 1, 0]
    swapped = _counts(
        [errors[i] for i in order], [counts[i] for i in order], [anchor[i] for i in order]
    )
    assert np.array_equal(swapped.p_value, ev.p_value[order])


def _evidence(mode: str, flags: list[bool | None] | None = None) -> DetectionResult:
    verdicts: list[ClientVerdict | None] = [
        None if f is None else ClientVerdict(score=0.0, flag=f, evidence=EvidenceVerdictEvidence())
        for f in (flags or [None] * 4)
    ]
    return DetectionResult("evidence", "ok", None, verdicts, EvidenceSummary(mode=mode))


def test_the_lead_starts_only_where_the_anchors_are_the_reference():
    anchors = [True, False, False, False]
    flags: list[bool | None] = [False, False, True, None]
    anchored = _evidence("anchored", flags)
    assert anchor_led_clients(anchors, anchored, None, None) is None  # warm-up, or off
    assert anchor_led_clients([False] * 4, anchored, None, 3) is None
    assert anchor_led_clients(None, anchored, None, 3) is None
    assert anchor_led_clients(anchors, _evidence("consensus", flags), None, 0) is None
    assert anchor_led_clients(anchors, None, None, 0) is None
    first = anchor_led_clients(anchors, anchored, None, 0)
    assert first is not None
    assert first.tolist() == [True, False, False, False]


def test_the_lead_lasts_and_admits_the_sites_the_anchored_audit_cleared():
    anchors = [True, False, False, False]
    flags: list[bool | None] = [False, False, True, None]
    # Once it has led, the mode of the round no longer matters (the lead lasts).
    second = anchor_led_clients(anchors, _evidence("consensus", flags), None, 1)
    assert second is not None
    assert second.tolist() == [True, False, False, False]
    later = anchor_led_clients(anchors, _evidence("anchored", flags), None, 2)
    assert later is not None
    assert later.tolist() == [True, True, False, False]  # flagged and undetermined stay out
    nobody = anchor_led_clients(anchors, None, None, 2)  # no evidence: the anchors alone
    assert nobody is not None
    assert nobody.tolist() == [True, False, False, False]
    at_once = anchor_led_clients(anchors, _evidence("anchored", flags), None, 0, only_rounds=0)
    assert at_once is not None
    assert at_once.tolist() == [True, True, False, False]


def test_an_admin_s_pins_win_over_the_anchored_audit():
    anchors = [True, True, False, False]
    flags: list[bool | None] = [False, False, False, True]
    pins: list[bool | None] = [True, None, True, False]  # an anchor pinned noisy, too
    chosen = anchor_led_clients(anchors, _evidence("anchored", flags), pins, 2)
    assert chosen is not None
    assert chosen.tolist() == [False, True, False, True]
    # Every anchor pinned noisy: nobody to lead, the round is not anchor-led.
    assert (
        anchor_led_clients([True, False, False, False], None, [True, None, None, None], 5) is None
    )


def _clients() -> list[ClientRoundData]:
    """12 sites, the first 3 noisy; every site reports spreads; site 11 will be the anchor."""
    loss, counts = synthetic_federation(12, 5, seed=3, n_noisy=3, noise_rate=0.4)
    sd = np.where(counts > 0, 0.3, np.nan)
    return [
        dataclasses.replace(c, per_class_loss_sd=[float(v) for v in sd[k]])
        for k, c in enumerate(loss_clients(loss, counts))
    ]


def test_run_audit_takes_the_aggregate_from_the_anchor_during_the_first_rounds_of_the_lead():
    clients = _clients()
    anchors = [False] * 11 + [True]
    state = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
    config = AuditConfig(detectors=("fednoro", "evidence"), primary_detector="evidence")
    plain = run_audit(state, clients, config, round_index=5, anchors=anchors)
    assert "anchor_led" not in plain.aggregation.details
    led = run_audit(state, clients, config, round_index=5, anchors=anchors, anchor_led_rounds=1)
    # FedAvg over the anchor alone: its state (every value 11) and all the weight.
    assert led.aggregation.state["w"].tolist() == [11.0, 11.0]
    assert led.aggregation.weights.tolist() == [0.0] * 11 + [1.0]
    assert led.aggregation.details["anchor_led"] == {"round": 2, "sites": 1}
    assert led.aggregation.fallback_reason is not None
    assert "anchor-led aggregation, round 2 of the lead" in led.aggregation.fallback_reason
    assert led.detections["evidence"].summary.mode == "anchored"
    switched_off = AuditConfig.from_json({**config.to_json(), "anchor_lead": False})
    off = run_audit(
        state, clients, switched_off, round_index=5, anchors=anchors, anchor_led_rounds=1
    )
    assert "anchor_led" not in off.aggregation.details


def test_run_audit_adds_the_sites_the_anchored_audit_cleared():
    clients = _clients()
    anchors = [False] * 11 + [True]
    state = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
    config = AuditConfig(detectors=("fednoro", "evidence"), primary_detector="evidence")
    led = run_audit(state, clients, config, round_index=9, anchors=anchors, anchor_led_rounds=5)
    flags = led.primary_flags
    weights = led.aggregation.weights
    cleared = [k for k in range(12) if flags[k] is False]
    assert 11 in cleared
    assert len(cleared) < 12  # somebody was flagged and left out
    for k in range(12):
        assert (weights[k] > 0) == (k in cleared)
    sizes = np.array([c.num_samples for c in clients], dtype=np.float64)[cleared]
    share = sizes / sizes.sum()
    cap = min(1.0, 4.0 / len(cleared))
    assert weights[cleared].max() <= cap + 1e-12
    # These sizes never reach the cap (the largest share is under 0.2, the cap at least 4 / 12):
    # the aggregate is FedAvg over the cleared sites, site k's state being k everywhere.
    assert share.max() <= cap
    expected = float(np.dot(share, np.array(cleared, dtype=np.float64)))
    assert led.aggregation.state["w"][0] == pytest.approx(expected, rel=1e-6)


def test_in_anchored_mode_the_error_counts_find_what_the_losses_cannot():
    # Six sites with the same losses; site 3 has 30 errors of 100 where the anchor has none.
    loss = np.full((6, 2), 0.3)
    counts = np.full((6, 2), 50)
    sd = np.full((6, 2), 0.5)
    errors = np.array([[0, 0], [1, 1], [1, 0], [15, 15], [0, 1], [1, 1]])
    anchors = [True] + [False] * 5
    detector = EvidenceDetector()
    led = detector.fit(loss, counts, sd, anchors=anchors, per_class_errors=errors, anchor_led=True)
    assert led.summary.mode == "anchored"
    assert led.flags == [False, False, False, True, False, False]
    losses_only = detector.fit(loss, counts, sd, anchors=anchors, anchor_led=True)
    assert losses_only.summary.mode == "anchored"
    assert not any(losses_only.flags)


def test_a_capped_anchor_led_round_names_the_capped_sites_in_the_round_s_order():
    clients = _clients()
    anchors = [False] * 11 + [True]
    state = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
    config = AuditConfig.from_json(
        {
            **AuditConfig(detectors=("fednoro", "evidence"), primary_detector="evidence").to_json(),
            "max_client_weight_factor": 1.0,  # cap = 1 / (sites aggregated): above-average capped
        }
    )
    led = run_audit(state, clients, config, round_index=9, anchors=anchors, anchor_led_rounds=5)
    cap = led.aggregation.weight_cap
    assert cap is not None
    weights = led.aggregation.weights
    aggregated = np.flatnonzero(weights > 0)
    assert len(aggregated) >= 3
    assert cap["cap"] == pytest.approx(1.0 / len(aggregated))
    assert cap["capped"]  # the sample counts differ: somebody was above the equal share
    for entry in cap["capped"]:
        assert entry["index"] in aggregated.tolist()
        assert weights[entry["index"]] == pytest.approx(entry["after"])
    assert weights.sum() == pytest.approx(1.0)
