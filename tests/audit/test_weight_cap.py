"""Bounded influence: water-filling on hand-worked inputs, its properties, and every rule's cap.

Expected values are worked out by hand in the comments (min(cap, lam * w) summing to 1), not
computed by the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    AGGREGATION_RULES,
    AuditConfig,
    DictStateReader,
    InvalidInputError,
    InvalidParameterError,
    aggregate,
    aggregate_daagg,
    aggregate_fedavg,
    aggregate_fedncl_layerwise,
    aggregate_median,
    aggregate_reliability_weighted,
    aggregate_trimmed_mean,
    cap_weights,
    client_weight_cap,
)


class TestCapWeights:
    def test_one_dominant_weight(self):
        # 0.97 -> 0.5; the other three share the remaining 0.5 equally: 1/6 each.
        result = cap_weights([0.97, 0.01, 0.01, 0.01], 0.5)
        assert result.tolist() == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6], abs=1e-12)

    def test_second_pass_caps_a_weight_pushed_over_by_the_first(self):
        # Pass 1: 0.6 -> 0.35; 0.65 left for [0.3, 0.05, 0.05] (sum 0.4): x1.625 ->
        # [0.4875, 0.08125, 0.08125]; 0.4875 > 0.35. Pass 2: it is capped too; 0.3 left for
        # [0.05, 0.05]: 0.15 each. Check: 0.35 + 0.35 + 0.15 + 0.15 = 1.
        result = cap_weights([0.6, 0.3, 0.05, 0.05], 0.35)
        assert result.tolist() == pytest.approx([0.35, 0.35, 0.15, 0.15], abs=1e-12)

    def test_unnormalised_counts(self):
        # A site with 10x the data of each of 9 others: 10/19 = 0.526 > cap 0.4; the 9 share
        # 0.6: 0.0666... each.
        result = cap_weights([10, 1, 1, 1, 1, 1, 1, 1, 1, 1], 0.4)
        assert result.tolist() == pytest.approx([0.4] + [0.6 / 9] * 9, abs=1e-12)

    def test_a_zero_weight_stays_zero(self):
        # 0.9 -> 0.5; the remaining 0.5 goes to 0.1 (the zero gets nothing): [0.5, 0.5, 0].
        result = cap_weights([0.9, 0.1, 0.0], 0.5)
        assert result.tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-12)

    def test_nothing_above_the_cap_changes_nothing(self):
        assert cap_weights([0.3, 0.3, 0.4], 0.4).tolist() == pytest.approx([0.3, 0.3, 0.4])
        assert cap_weights([3, 3, 4], 1.0).tolist() == pytest.approx([0.3, 0.3, 0.4])

    def test_all_equal_unchanged(self):
        assert cap_weights([0.25] * 4, 0.25).tolist() == pytest.approx([0.25] * 4)
        assert cap_weights([7.0] * 5, 0.2).tolist() == pytest.approx([0.2] * 5)

    def test_cap_below_one_over_m_is_refused(self):
        with pytest.raises(InvalidParameterError, match="below 1/2"):
            cap_weights([0.5, 0.5, 0.0], 0.4)
        with pytest.raises(InvalidParameterError, match="cap"):
            cap_weights([0.5, 0.5], 0.0)
        with pytest.raises(InvalidParameterError, match="cap"):
            cap_weights([0.5, 0.5], 1.5)

    @pytest.mark.parametrize("weights", [[-0.1, 1.1], [0.0, 0.0], [math.nan, 1.0], [[0.5, 0.5]]])
    def test_invalid_weights(self, weights):
        with pytest.raises(InvalidInputError):
            cap_weights(weights, 1.0)

    @pytest.mark.parametrize("seed", range(40))
    def test_properties(self, seed):
        rng = np.random.default_rng(seed)
        k = int(rng.integers(1, 30))
        raw = rng.pareto(0.7, size=k) + 1e-6  # heavy-tailed: often one weight dominates
        if seed % 5 == 0:
            raw[rng.integers(0, k)] = 0.0 if k > 1 else raw[0]
        factor = float(rng.uniform(1.0, 6.0))
        positive = int(np.count_nonzero(raw))
        cap = max(min(1.0, factor / k), 1.0 / positive)
        result = cap_weights(raw, cap)
        # sums to 1, none above the cap, zero stays zero
        assert result.sum() == pytest.approx(1.0, abs=1e-12)
        assert (result <= cap).all()
        assert (result[raw == 0.0] == 0.0).all()
        # order preserved (weakly): a larger input never gets a smaller output
        order = np.argsort(raw, kind="stable")
        assert (np.diff(result[order]) >= -1e-15).all()
        # the uncapped keep their ratios: result = lam * w for a single lam >= 1
        normalised = raw / raw.sum()
        free = (result < cap) & (raw > 0.0)
        if free.any():
            lam = result[free] / normalised[free]
            assert lam == pytest.approx(np.full(lam.size, lam[0]), rel=1e-9)
            assert lam[0] >= 1.0 - 1e-12
        # permutation invariant
        perm = rng.permutation(k)
        assert cap_weights(raw[perm], cap) == pytest.approx(result[perm], abs=1e-15)
        # nothing changes when nothing exceeds the cap
        if (normalised <= cap).all():
            assert result == pytest.approx(normalised, abs=1e-15)

    def test_client_weight_cap(self):
        assert client_weight_cap(1, 4.0) == 1.0
        assert client_weight_cap(4, 4.0) == 1.0
        assert client_weight_cap(10, 4.0) == pytest.approx(0.4)
        assert client_weight_cap(100, 4.0) == pytest.approx(0.04)
        assert client_weight_cap(5, 1.0) == pytest.approx(0.2)
        with pytest.raises(InvalidParameterError, match="max_client_weight_factor"):
            client_weight_cap(5, 0.5)


# Five clients, one float tensor "w" (global 0). Client 0 holds most of the data and sends 10;
# the others send 0, so the aggregate "w" is client 0's weight times 10.
GLOBAL = {"w": np.array([0.0])}
VALUES = [10.0, 0.0, 0.0, 0.0, 0.0]
N = [60, 10, 10, 10, 10]  # FedAvg: [0.6, 0.1, 0.1, 0.1, 0.1]
FACTOR = 2.0  # cap = min(1, 2 / 5) = 0.4


def g() -> DictStateReader:
    return DictStateReader(GLOBAL)


def updates(values: list[float] = VALUES) -> list[DictStateReader]:
    return [DictStateReader({"w": np.array([v])}) for v in values]


class TestRulesRespectTheCap:
    def test_fedavg(self):
        # 0.6 -> 0.4; the four others share 0.6: 0.15 each. w = 0.4 * 10 = 4.0 (uncapped 6.0).
        result = aggregate_fedavg(g(), updates(), N, max_client_weight_factor=FACTOR)
        assert result.weights.tolist() == pytest.approx([0.4, 0.15, 0.15, 0.15, 0.15])
        assert result.state["w"].tolist() == pytest.approx([4.0])
        cap = result.weight_cap
        assert cap is not None
        assert cap["factor"] == 2.0
        assert cap["cap"] == pytest.approx(0.4)
        assert cap["capped"] == [
            {"index": 0, "before": pytest.approx(0.6), "after": pytest.approx(0.4)}
        ]
        assert result.to_json()["weight_cap"]["capped"][0]["index"] == 0

    def test_fedavg_without_cap_is_plain_fedavg(self):
        result = aggregate_fedavg(g(), updates(), N, max_client_weight_factor=None)
        assert result.weights.tolist() == pytest.approx([0.6, 0.1, 0.1, 0.1, 0.1])
        assert result.state["w"].tolist() == pytest.approx([6.0])
        assert result.weight_cap is None

    def test_default_cap_is_on_and_spares_four_clients(self):
        # Default f = 4. Ten clients, one with 10x the data of each other: 100/190 = 0.526 ->
        # cap 4/10 = 0.4, the nine share 0.6 (0.0667 each).
        ten = aggregate_fedavg(g(), updates([10.0] + [0.0] * 9), [100] + [10] * 9)
        assert ten.weights.tolist() == pytest.approx([0.4] + [0.6 / 9] * 9)
        assert ten.state["w"].tolist() == pytest.approx([4.0])
        # Four clients: cap min(1, 4/4) = 1, plain FedAvg even for a dominant client.
        four = aggregate_fedavg(g(), updates(VALUES[:4]), [97, 1, 1, 1])
        assert four.weights.tolist() == pytest.approx([0.97, 0.01, 0.01, 0.01])
        assert four.weight_cap is not None
        assert four.weight_cap["cap"] == 1.0
        assert four.weight_cap["capped"] == []

    def test_a_size_claim_of_ten_to_the_twelve_gains_only_the_cap(self):
        result = aggregate_fedavg(g(), updates([10.0] + [0.0] * 9), [10**12] + [100] * 9)
        assert result.weights[0] == pytest.approx(0.4)
        assert result.weights.max() <= 0.4

    def test_daagg_caps_after_the_distance_weighting(self):
        # Client 4 noisy and sends 3: d = 3 (nearest clean sends 0), D = 1, its factor e^-1.
        # Raw n * exp(-D) = [60, 10, 10, 10, 3.6788]; 60 / 93.6788 = 0.6405 > 0.4 -> 0.4; the
        # rest share 0.6 over 33.6788: 10 -> 0.178154, 3.6788 -> 0.065539.
        # w = 0.4 * 10 + 0.065539 * 3 = 4.196617.
        result = aggregate_daagg(
            g(),
            updates([10.0, 0.0, 0.0, 0.0, 3.0]),
            N,
            [False, False, False, False, True],
            max_client_weight_factor=FACTOR,
        )
        assert result.rule == "daagg"
        assert result.weights.tolist() == pytest.approx(
            [0.4, 0.178154, 0.178154, 0.178154, 0.065539], abs=1e-6
        )
        assert result.state["w"].tolist() == pytest.approx([4.196617], abs=1e-6)
        assert result.weight_cap is not None
        assert result.weight_cap["capped"][0]["before"] == pytest.approx(0.640486, abs=1e-6)

    def test_daagg_fallback_is_capped_too(self):
        result = aggregate_daagg(g(), updates(), N, None, max_client_weight_factor=FACTOR)
        assert result.rule == "fedavg"
        assert result.weights.tolist() == pytest.approx([0.4, 0.15, 0.15, 0.15, 0.15])

    def test_fedncl_layerwise_caps_each_tensor(self):
        # No noisy client (penalty 1). d = 1 + ||0 - theta_k||^2 = [2, 1, 1, 1, 1] (client 0
        # sends 1, the others 0); n / d = [30, 10, 10, 10, 10] -> 30/70 = 0.428571 > 0.4 -> 0.4,
        # the others 0.15. w = 0.4 * 1 = 0.4 (uncapped 0.428571).
        result = aggregate_fedncl_layerwise(
            g(),
            updates([1.0, 0.0, 0.0, 0.0, 0.0]),
            N,
            [False] * 5,
            max_client_weight_factor=FACTOR,
        )
        assert result.layer_weights is not None
        assert result.layer_weights["w"] == pytest.approx([0.4, 0.15, 0.15, 0.15, 0.15])
        assert result.weights.tolist() == pytest.approx([0.4, 0.15, 0.15, 0.15, 0.15])
        assert result.state["w"].tolist() == pytest.approx([0.4])
        assert result.weight_cap is not None
        assert result.weight_cap["capped"] == [
            {
                "index": 0,
                "before": pytest.approx(30 / 70),
                "after": pytest.approx(0.4),
                "layers": 1,
            }
        ]

    def test_reliability_weighted(self):
        # p = [0, 0, 0, 0, 1]: raw n (1 - p) = [60, 10, 10, 10, 0] -> [2/3, 1/9, 1/9, 1/9, 0];
        # 2/3 -> 0.4, the three others share 0.6 (0.2 each), the p = 1 client stays at 0.
        result = aggregate_reliability_weighted(
            g(), updates(), N, [0.0, 0.0, 0.0, 0.0, 1.0], max_client_weight_factor=FACTOR
        )
        assert result.weights.tolist() == pytest.approx([0.4, 0.2, 0.2, 0.2, 0.0])
        assert result.state["w"].tolist() == pytest.approx([4.0])

    def test_reliability_weighted_with_few_positive_weights_raises_the_cap(self):
        # Only two clients have a positive weight ([60, 10] -> [6/7, 1/7]); 2 x 0.4 < 1, so
        # the cap becomes 1/2 and both get 0.5.
        result = aggregate_reliability_weighted(
            g(), updates(), N, [0.0, 0.0, 1.0, 1.0, 1.0], max_client_weight_factor=FACTOR
        )
        assert result.weights.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0, 0.0])
        assert result.weight_cap is not None
        assert result.weight_cap["cap"] == pytest.approx(0.5)
        assert "raised to 1/2" in result.weight_cap["note"]

    @pytest.mark.parametrize("rule", ["trimmed_mean", "median"])
    def test_unweighted_rules_record_a_moot_cap(self, rule):
        # Values [10, 0, 0, 0, 0]: the median is 0; trimming floor(0.2 * 5) = 1 per side keeps
        # [0, 0, 0]: mean 0. Weights 1/5 each, never above the cap 0.4.
        if rule == "median":
            result = aggregate_median(g(), updates(), max_client_weight_factor=FACTOR)
        else:
            result = aggregate_trimmed_mean(
                g(), updates(), trim_fraction=0.2, max_client_weight_factor=FACTOR
            )
        assert result.state["w"].tolist() == [0.0]
        assert result.weights.tolist() == pytest.approx([0.2] * 5)
        assert result.weight_cap is not None
        assert result.weight_cap["cap"] == pytest.approx(0.4)
        assert result.weight_cap["capped"] == []
        assert "not a weighted average" in result.weight_cap["note"]

    @pytest.mark.parametrize("rule", AGGREGATION_RULES)
    def test_every_rule_through_aggregate(self, rule):
        result = aggregate(
            rule,
            g(),
            updates(),
            N,
            noisy=[False] * 5,
            noisy_probability=[0.0] * 5,
            max_client_weight_factor=FACTOR,
        )
        assert result.rule == rule
        assert result.weights.max() <= 0.4 + 1e-12
        assert result.weights.sum() == pytest.approx(1.0)
        assert result.weight_cap is not None
        assert result.weight_cap["cap"] == pytest.approx(0.4)
        uncapped = aggregate(
            rule,
            g(),
            updates(),
            N,
            noisy=[False] * 5,
            noisy_probability=[0.0] * 5,
            max_client_weight_factor=None,
        )
        assert uncapped.weight_cap is None

    def test_factor_below_one_is_refused(self):
        for call in (
            lambda: aggregate("fedavg", g(), updates(), N, max_client_weight_factor=0.9),
            lambda: aggregate_median(g(), updates(), max_client_weight_factor=0.0),
        ):
            with pytest.raises(InvalidParameterError, match="max_client_weight_factor"):
                call()


class TestAuditConfig:
    def test_default_and_round_trip(self):
        config = AuditConfig()
        assert config.aggregation_settings.max_client_weight_factor == 4.0
        assert config.to_json()["max_client_weight_factor"] == 4.0
        off = AuditConfig.from_json({"max_client_weight_factor": None})
        assert off.aggregation_settings.max_client_weight_factor is None
        two = AuditConfig.from_json({"max_client_weight_factor": 2})
        assert two.aggregation_settings.max_client_weight_factor == 2.0

    @pytest.mark.parametrize("value", [0.5, 0, -1, "4", True, math.inf])
    def test_invalid(self, value):
        with pytest.raises(InvalidParameterError, match="max_client_weight_factor"):
            AuditConfig.from_flat(max_client_weight_factor=value)
