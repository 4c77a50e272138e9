"""Aggregation rules (docs/algorithms.md, aggregation): hand-worked weights, fallbacks,
streaming, properties."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from service.audit import (
    AGGREGATION_RULES,
    NOISY_SET_RULES,
    AggregationResult,
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
)
from tests.audit._readers import RecordingReader, present, reads_grouped_by_tensor

NBT = "bn.num_batches_tracked"


def state(w: list[float], b: list[float], nbt: int) -> dict[str, np.ndarray]:
    return {
        "w": np.array(w, dtype=np.float32),
        NBT: np.array(nbt, dtype=np.int64),
        "b": np.array(b, dtype=np.float64),
    }


GLOBAL = state([1, 2], [0], 0)
CLIENTS = [state([1, 2], [0], 10), state([3, 4], [1], 20), state([5, 8], [2], 30)]
N = [10, 30, 60]


def readers(states: Sequence[Mapping[str, np.ndarray]] = CLIENTS) -> list[DictStateReader]:
    return [DictStateReader(s) for s in states]


def g() -> DictStateReader:
    return DictStateReader(GLOBAL)


class TestFedAvg:
    def test_hand_worked(self):
        # w = n / sum n = [0.1, 0.3, 0.6]
        # w: 0.1*[1,2] + 0.3*[3,4] + 0.6*[5,8] = [0.1+0.9+3.0, 0.2+1.2+4.8] = [4.0, 6.2]
        # b: 0 + 0.3 + 1.2 = 1.5; the integer counter comes from client 2 (largest weight)
        result = aggregate_fedavg(g(), readers(), N)
        assert result.weights.tolist() == pytest.approx([0.1, 0.3, 0.6])
        assert result.state["w"].tolist() == pytest.approx([4.0, 6.2])
        assert result.state["b"].tolist() == pytest.approx([1.5])
        assert result.state[NBT] == 30
        assert result.rule == result.requested_rule == "fedavg"
        assert result.fallback_reason is None
        assert result.layer_weights is None

    def test_dtypes_names_and_shapes_preserved(self):
        result = aggregate_fedavg(g(), readers(), N)
        assert list(result.state) == ["w", NBT, "b"]
        assert result.state["w"].dtype == np.float32
        assert result.state[NBT].dtype == np.int64
        assert result.state[NBT].shape == ()
        assert result.state["b"].dtype == np.float64

    def test_float16_round_trip(self):
        # (1 + (1 + 2^-9)) / 2 = 1 + 2^-10 = 1.0009765625, representable in float16
        gs = {"h": np.array([1.0], dtype=np.float16)}
        cs = [{"h": np.array([1.0], dtype=np.float16)}, {"h": np.array([1.001953125], np.float16)}]
        result = aggregate_fedavg(DictStateReader(gs), readers(cs), [1, 1])
        assert result.state["h"].dtype == np.float16
        assert float(result.state["h"][0]) == 1.0009765625

    def test_integer_tie_goes_to_lowest_index(self):
        result = aggregate_fedavg(g(), readers(), [5, 5, 5])
        assert result.state[NBT] == 10

    def test_streams_tensor_by_tensor(self):
        log: list[tuple[str, str]] = []
        clients = [RecordingReader(s, f"c{k}", log) for k, s in enumerate(CLIENTS)]
        aggregate_fedavg(RecordingReader(GLOBAL, "g", log), clients, N)
        assert reads_grouped_by_tensor(log, list(GLOBAL))
        # one pass: every client tensor read exactly once
        client_reads = [entry for entry in log if entry[0] != "g"]
        assert len(client_reads) == len(set(client_reads)) == 9


class TestDaAgg:
    def test_paper_variant_hand_worked(self):
        # Clients 1 and 2 noisy, client 0 clean. Flattened float vector [w0, w1, b]:
        # d(1) = ||[3,4,1] - [1,2,0]|| = sqrt(4 + 4 + 1) = 3
        # d(2) = ||[5,8,2] - [1,2,0]|| = sqrt(16 + 36 + 4) = sqrt(56) = 7.48331
        # D = [0, 3 / 7.48331 = 0.400892, 1]; w ~ n * exp(-D) = [10, 30 e^-0.400892, 60 e^-1]
        result = aggregate_daagg(g(), readers(), N, [False, True, True])
        d1 = 3.0 / math.sqrt(56.0)
        raw = [10.0, 30.0 * math.exp(-d1), 60.0 * math.exp(-1.0)]
        expected = [r / sum(raw) for r in raw]
        assert result.details["distances"] == pytest.approx([0.0, 3.0, math.sqrt(56.0)])
        assert result.details["normalised_distances"] == pytest.approx([0.0, d1, 1.0])
        assert result.weights.tolist() == pytest.approx(expected)
        assert result.details["nearest_clean"] == {"1": 0, "2": 0}
        w = np.zeros(2)
        for e, c in zip(expected, CLIENTS, strict=True):
            w += e * c["w"].astype(np.float64)
        assert result.state["w"].tolist() == pytest.approx(w.tolist(), rel=1e-6)
        assert result.rule == "daagg"

    def test_reference_variant_hand_worked(self):
        # sum of per-tensor norms: d(1) = ||[2,2]|| + ||[1]|| = 2.828427 + 1 = 3.828427
        # d(2) = ||[4,6]|| + ||[2]|| = 7.211103 + 2 = 9.211103 -> D(1) = 0.415634
        result = aggregate_daagg(g(), readers(), N, [False, True, True], variant="reference")
        d = [0.0, math.sqrt(8) + 1, math.sqrt(52) + 2]
        assert result.details["distances"] == pytest.approx(d)
        raw = [10.0, 30.0 * math.exp(-d[1] / d[2]), 60.0 * math.exp(-1.0)]
        assert result.weights.tolist() == pytest.approx([r / sum(raw) for r in raw])

    def test_nearest_clean_client_is_used(self):
        # Client 2 noisy; clean 0 and 1. Paper: to client 0 sqrt(56), to client 1
        # ||[2,4,1]|| = sqrt(21) -> d = sqrt(21), D = 1; w ~ [10, 30, 60 / e]
        result = aggregate_daagg(g(), readers(), N, [False, False, True])
        assert result.details["distances"] == pytest.approx([0, 0, math.sqrt(21)])
        assert result.details["nearest_clean"] == {"2": 1}
        raw = [10.0, 30.0, 60.0 / math.e]
        assert result.weights.tolist() == pytest.approx([r / sum(raw) for r in raw])

    def test_no_noisy_client_gives_fedavg_weights(self):
        result = aggregate_daagg(g(), readers(), N, [False, False, False])
        assert result.rule == "daagg"
        assert result.fallback_reason is None
        assert result.weights.tolist() == pytest.approx([0.1, 0.3, 0.6])
        assert "no noisy client" in result.details["note"]

    @pytest.mark.parametrize(
        ("noisy", "states", "reason"),
        [
            (None, CLIENTS, "no noisy flags"),
            ([True, True, True], CLIENTS, "no clean client"),
            ([False, True, False], [CLIENTS[0], CLIENTS[0], CLIENTS[2]], "max distance is 0"),
        ],
    )
    def test_fallbacks(self, noisy, states, reason):
        result = aggregate_daagg(g(), readers(states), N, noisy)
        assert result.rule == "fedavg"
        assert result.requested_rule == "daagg"
        assert reason in present(result.fallback_reason)
        assert result.weights.tolist() == pytest.approx([0.1, 0.3, 0.6])
        assert not np.isnan(result.state["w"]).any()

    def test_two_passes_each_streamed(self):
        log: list[tuple[str, str]] = []
        clients = [RecordingReader(s, f"c{k}", log) for k, s in enumerate(CLIENTS)]
        aggregate_daagg(RecordingReader(GLOBAL, "g", log), clients, N, [False, True, False])
        assert reads_grouped_by_tensor(log, list(GLOBAL))
        # the distances' pass reads every client's 3 tensors and sums the clean ones; the
        # weighted pass then reads the noisy client's only
        assert len([e for e in log if e[0] != "g"]) == 9 + 3
        assert [t for c, t in log if c == "c0"] == list(GLOBAL)  # a clean client, read once


class TestFedNCLLayerwise:
    def test_hand_worked_with_penalty(self):
        # round_index 5 -> T = 6; m(noisy) = clip(50 * 6 / 60, 1, 50) = 5; client 2 noisy.
        # d_l^k = 1 + ||theta_G[l] - theta_k[l]||^2 with theta_G: w [1,2], b [0]:
        #   w: d = [1, 1 + 8 = 9, 1 + 52 = 53]; b: d = [1, 2, 5]
        # w-layer: n / (m d) = [10, 30/9, 60/(5*53)] = [10, 3.333333, 0.226415], sum 13.559748
        #   -> [0.737477, 0.245826, 0.016698]
        # b-layer: [10, 15, 60/25 = 2.4], sum 27.4 -> [0.364964, 0.547445, 0.087591]
        result = aggregate_fedncl_layerwise(g(), readers(), N, [False, False, True], round_index=5)
        w_layer = [10 / 13.559748, (30 / 9) / 13.559748, (60 / 265) / 13.559748]
        b_layer = [10 / 27.4, 15 / 27.4, 2.4 / 27.4]
        assert present(result.layer_weights)["w"] == pytest.approx(w_layer, rel=1e-6)
        assert present(result.layer_weights)["b"] == pytest.approx(b_layer)
        assert NBT not in present(result.layer_weights)
        assert result.weights.tolist() == pytest.approx(
            [(a + b) / 2 for a, b in zip(w_layer, b_layer, strict=True)], rel=1e-6
        )
        # new w = 0.737477*[1,2] + 0.245826*[3,4] + 0.016698*[5,8] = [1.558442, 2.591840]
        assert result.state["w"].tolist() == pytest.approx([1.558442, 2.591840], rel=1e-5)
        # new b = 0.547445 * 1 + 0.087591 * 2 = 0.722628
        assert result.state["b"].tolist() == pytest.approx([0.722628], rel=1e-5)
        # integer counter: largest n / m = [10, 30, 60 / 5 = 12] -> client 1
        assert result.state[NBT] == 20
        assert result.details["penalty"] == [1.0, 1.0, 5.0]
        assert result.details["T"] == 6

    @pytest.mark.parametrize(
        ("round_index", "expected"),
        [
            (0, 1.0),  # T = 1: 50 / 60 = 0.83 -> clipped up to 1
            (11, 10.0),  # T = 12: 50 * 12 / 60 = 10
            (59, 50.0),  # T = 60: 50
            (200, 50.0),  # clipped at tau
        ],
    )
    def test_penalty_schedule(self, round_index, expected):
        result = aggregate_fedncl_layerwise(
            g(), readers(), N, [True, False, False], round_index=round_index
        )
        assert result.details["penalty"] == [expected, 1.0, 1.0]

    def test_without_noisy_clients_weights_follow_distance(self):
        # b-layer without penalty: [10/1, 30/2, 60/5] = [10, 15, 12] / 37
        result = aggregate_fedncl_layerwise(g(), readers(), N, [False] * 3)
        assert present(result.layer_weights)["b"] == pytest.approx([10 / 37, 15 / 37, 12 / 37])

    def test_noisy_none_falls_back(self):
        result = aggregate_fedncl_layerwise(g(), readers(), N, None)
        assert result.rule == "fedavg"
        assert result.requested_rule == "fedncl_layerwise"
        assert result.layer_weights is None

    def test_state_without_float_tensors(self):
        gs = {"n": np.array(1)}
        cs = [{"n": np.array(4)}, {"n": np.array(5)}]
        result = aggregate_fedncl_layerwise(
            DictStateReader(gs), readers(cs), [1, 3], [False, False]
        )
        assert result.state["n"] == 5
        assert result.weights.tolist() == pytest.approx([0.25, 0.75])

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [({"round_index": -1}, "round_index"), ({"tau": 0.5}, "tau"), ({"t_k": 0}, "t_k")],
    )
    def test_bad_parameters(self, kwargs, match):
        with pytest.raises(InvalidParameterError, match=match):
            aggregate_fedncl_layerwise(g(), readers(), N, [False] * 3, **kwargs)


class TestCoordinatewise:
    VALUES = [1.0, 100.0, 3.0, 2.0, -50.0]

    def _states(self, values: list[float]) -> list[dict[str, np.ndarray]]:
        return [{"x": np.array([v, -v]), NBT: np.array(k)} for k, v in enumerate(values)]

    def _global(self) -> DictStateReader:
        return DictStateReader({"x": np.zeros(2), NBT: np.array(0)})

    def test_trimmed_mean(self):
        # K = 5, trim 0.2 -> floor(1.0) = 1 per side: sorted [-50, 1, 2, 3, 100] -> mean(1,2,3)
        # = 2; second coordinate is the negation -> -2
        result = aggregate_trimmed_mean(
            self._global(), readers(self._states(self.VALUES)), trim_fraction=0.2
        )
        assert result.state["x"].tolist() == pytest.approx([2.0, -2.0])
        assert result.details["trimmed_per_side"] == 1
        assert result.details["kept_per_coordinate"] == 3
        assert result.weights.tolist() == pytest.approx([0.2] * 5)
        assert result.state[NBT] == 0  # uniform weights: lowest index

    def test_trimmed_mean_small_fraction_trims_nothing(self):
        # floor(0.1 * 5) = 0: plain mean (1 + 100 + 3 + 2 - 50) / 5 = 11.2
        result = aggregate_trimmed_mean(self._global(), readers(self._states(self.VALUES)))
        assert result.state["x"].tolist() == pytest.approx([11.2, -11.2])
        assert result.details["trimmed_per_side"] == 0

    def test_median_odd_and_even(self):
        result = aggregate_median(self._global(), readers(self._states(self.VALUES)))
        assert result.state["x"].tolist() == pytest.approx([2.0, -2.0])
        # even K: [1, 100, 3, 2] -> (2 + 3) / 2
        even = aggregate_median(self._global(), readers(self._states(self.VALUES[:4])))
        assert even.state["x"].tolist() == pytest.approx([2.5, -2.5])
        assert even.weights.tolist() == pytest.approx([0.25] * 4)

    def test_trim_fraction_range(self):
        for bad in (-0.1, 0.5):
            with pytest.raises(InvalidParameterError, match="trim_fraction"):
                aggregate_trimmed_mean(
                    self._global(), readers(self._states([1.0])), trim_fraction=bad
                )


class TestReliabilityWeighted:
    def test_hand_worked(self):
        # w ~ n (1 - p) = [10 * 1, 30 * 0.5, 60 * 0] = [10, 15, 0] -> [0.4, 0.6, 0]
        # w: 0.4 * [1, 2] + 0.6 * [3, 4] = [2.2, 3.2]; integer counter from client 1
        result = aggregate_reliability_weighted(g(), readers(), N, [0.0, 0.5, 1.0])
        assert result.weights.tolist() == pytest.approx([0.4, 0.6, 0.0])
        assert result.state["w"].tolist() == pytest.approx([2.2, 3.2])
        assert result.state[NBT] == 20

    def test_fallbacks(self):
        none = aggregate_reliability_weighted(g(), readers(), N, None)
        assert none.rule == "fedavg"
        assert "no noisy probability" in present(none.fallback_reason)
        ones = aggregate_reliability_weighted(g(), readers(), N, [1.0, 1.0, 1.0])
        assert ones.rule == "fedavg"
        assert "probability 1" in present(ones.fallback_reason)

    def test_bad_probabilities(self):
        with pytest.raises(InvalidInputError, match="<= 1"):
            aggregate_reliability_weighted(g(), readers(), N, [0.0, 1.5, 0.0])
        with pytest.raises(InvalidInputError, match="length"):
            aggregate_reliability_weighted(g(), readers(), N, [0.0, 0.5])


class TestDispatcher:
    @pytest.mark.parametrize(
        ("rule", "direct"),
        [
            ("fedavg", lambda: aggregate_fedavg(g(), readers(), N)),
            (
                "daagg",
                lambda: aggregate_daagg(
                    g(), readers(), N, [False, True, False], variant="reference"
                ),
            ),
            (
                "fedncl_layerwise",
                lambda: aggregate_fedncl_layerwise(
                    g(), readers(), N, [False, True, False], round_index=3, tau=10.0, t_k=5
                ),
            ),
            ("trimmed_mean", lambda: aggregate_trimmed_mean(g(), readers(), trim_fraction=0.34)),
            ("median", lambda: aggregate_median(g(), readers())),
            (
                "reliability_weighted",
                lambda: aggregate_reliability_weighted(g(), readers(), N, [0.1, 0.2, 0.3]),
            ),
        ],
    )
    def test_dispatch_equals_direct_call(self, rule, direct):
        options: dict[str, dict[str, Any]] = {
            "daagg": {"variant": "reference"},
            "fedncl_layerwise": {"tau": 10.0, "t_k": 5},
            "trimmed_mean": {"trim_fraction": 0.34},
        }
        params = options.get(rule)
        result = aggregate(
            rule,
            g(),
            readers(),
            N,
            noisy=np.array([False, True, False]),
            noisy_probability=[0.1, 0.2, 0.3],
            params=params,
            round_index=3,
        )
        expected = direct()
        assert result.rule == expected.rule == rule
        assert result.weights.tolist() == pytest.approx(expected.weights.tolist())
        for name in GLOBAL:
            assert np.array_equal(result.state[name], expected.state[name])
        json.dumps(result.to_json(), allow_nan=False)

    @pytest.mark.parametrize("rule", AGGREGATION_RULES)
    def test_noisy_set_rules_are_the_ones_that_read_the_flags(self, rule):
        # the pipeline records the noisy set only for NOISY_SET_RULES: check that exactly these
        # rules give another model when client 2 is flagged than when nobody is (layer-wise:
        # tau 10, t_k 5, round 3 -> T = 4, penalty clip(10 * 4 / 5, 1, 10) = 8 on the flagged)
        params = {"tau": 10.0, "t_k": 5} if rule == "fedncl_layerwise" else None

        def run(noisy: list[bool]) -> AggregationResult:
            return aggregate(
                rule,
                g(),
                readers(),
                N,
                noisy=noisy,
                noisy_probability=[0.1, 0.2, 0.3],
                params=params,
                round_index=3,
            )

        nobody, flagged = run([False, False, False]), run([False, False, True])
        differs = not np.array_equal(nobody.state["w"], flagged.state["w"])
        assert differs == (rule in NOISY_SET_RULES)

    def test_unknown_rule_and_params(self):
        with pytest.raises(InvalidParameterError, match="rule"):
            aggregate("krum", g(), readers(), N)
        with pytest.raises(InvalidParameterError, match="'fedavg' takes no parameter 'tau'"):
            aggregate("fedavg", g(), readers(), N, params={"tau": 1.0})
        with pytest.raises(InvalidParameterError, match="variant"):
            aggregate(
                "daagg", g(), readers(), N, noisy=[True, False, False], params={"variant": "l1"}
            )


class TestValidation:
    @pytest.mark.parametrize(
        ("states", "match"),
        [
            ([dict(CLIENTS[0], extra=np.zeros(1))], r"updates\[0\]: unexpected tensor 'extra'"),
            ([{k: v for k, v in CLIENTS[0].items() if k != "b"}], r"missing tensor 'b'"),
            ([dict(CLIENTS[0], w=np.zeros(3, np.float32))], r"tensor 'w' has shape \(3,\)"),
            ([dict(CLIENTS[0], w=np.zeros(2, np.float64))], r"tensor 'w' has dtype float64"),
            ([dict(CLIENTS[0], b=np.array([np.nan]))], r"tensor 'b' contains NaN"),
        ],
    )
    def test_mismatched_updates(self, states, match):
        for rule in AGGREGATION_RULES:
            with pytest.raises(InvalidInputError, match=match):
                aggregate(rule, g(), readers(states), [1], noisy=[False], noisy_probability=[0.0])

    def test_global_state_checks(self):
        bad_global = DictStateReader(dict(GLOBAL, b=np.array([np.inf])))
        with pytest.raises(InvalidInputError, match="global_state: tensor 'b'"):
            aggregate_fedavg(bad_global, readers(), N)

    @pytest.mark.parametrize(
        ("num_samples", "match"),
        [([1, 2], "length 2"), ([1, 0, 2], "positive"), ([1, np.nan, 2], "NaN")],
    )
    def test_bad_num_samples(self, num_samples, match):
        with pytest.raises(InvalidInputError, match=match):
            aggregate("fedavg", g(), readers(), num_samples)

    def test_weights_must_stay_finite(self):
        # each count is finite but their sum overflows to inf
        with pytest.raises(InvalidInputError, match="weights must be finite"):
            aggregate_fedavg(g(), readers(), [1e308, 1e308, 1e308])

    def test_no_updates(self):
        with pytest.raises(InvalidInputError, match="at least one"):
            aggregate_fedavg(g(), [], [])

    def test_bad_noisy_flags(self):
        with pytest.raises(InvalidInputError, match="noisy: length"):
            aggregate_daagg(g(), readers(), N, [True, False])
        with pytest.raises(InvalidInputError, match="noisy: expected booleans"):
            aggregate_daagg(g(), readers(), N, [1, 0, 0])


class TestProperties:
    FLAGS = np.array([False, True, False, False, True])

    @staticmethod
    def _random_states(seed: int, n_clients: int) -> list[dict[str, np.ndarray]]:
        rng = np.random.default_rng(seed)
        return [
            {
                "conv": rng.normal(size=(2, 3)).astype(np.float32),
                NBT: np.array(int(rng.integers(100))),
                "fc": rng.normal(size=4),
            }
            for _ in range(n_clients)
        ]

    def _run_all(
        self,
        global_state: Mapping[str, np.ndarray],
        states: Sequence[Mapping[str, np.ndarray]],
        n: Any,
        flags: Any,
        probability: Any,
    ) -> dict[str, AggregationResult]:
        results: dict[str, AggregationResult] = {}
        for rule in AGGREGATION_RULES:
            results[rule] = aggregate(
                rule,
                DictStateReader(global_state),
                readers(states),
                n,
                noisy=flags,
                noisy_probability=probability,
                round_index=30,
            )
        return results

    def test_client_permutation_invariance(self):
        states = self._random_states(0, 5)
        global_state = self._random_states(1, 1)[0]
        n = np.array([10, 20, 30, 40, 55])
        p = np.array([0.1, 0.9, 0.2, 0.0, 0.7])
        perm = np.array([3, 0, 4, 2, 1])
        base = self._run_all(global_state, states, n, self.FLAGS, p)
        permuted = self._run_all(
            global_state, [states[i] for i in perm], n[perm], self.FLAGS[perm], p[perm]
        )
        for rule in AGGREGATION_RULES:
            for name in ("conv", "fc"):
                np.testing.assert_allclose(
                    permuted[rule].state[name], base[rule].state[name], rtol=1e-5, atol=1e-6
                )
            assert permuted[rule].weights == pytest.approx(base[rule].weights[perm])

    def test_all_equal_updates_give_that_update(self):
        one = self._random_states(2, 1)[0]
        states = [one] * 5
        results = self._run_all(
            self._random_states(3, 1)[0], states, [1, 2, 3, 4, 5], self.FLAGS, [0.5] * 5
        )
        for rule, result in results.items():
            for name in ("conv", "fc"):
                np.testing.assert_allclose(result.state[name], one[name], rtol=1e-6, err_msg=rule)
            assert not np.isnan(result.weights).any()

    def test_single_client(self):
        one = self._random_states(4, 1)[0]
        results = self._run_all(self._random_states(5, 1)[0], [one], [7], [True], [0.3])
        for rule, result in results.items():
            for name in ("conv", "fc"):
                np.testing.assert_allclose(result.state[name], one[name], rtol=1e-6, err_msg=rule)
            assert result.state[NBT] == one[NBT]
            assert result.weights.tolist() == pytest.approx([1.0])

    def test_integer_tensors_never_averaged(self):
        states = self._random_states(6, 5)
        results = self._run_all(
            self._random_states(7, 1)[0], states, [1, 2, 3, 4, 5], self.FLAGS, [0.1] * 5
        )
        counters = {int(s[NBT]) for s in states}
        for result in results.values():
            assert int(result.state[NBT]) in counters
            assert result.state[NBT].dtype == states[0][NBT].dtype

    def test_inputs_not_modified(self):
        states = self._random_states(8, 5)
        snapshot = [{k: v.copy() for k, v in s.items()} for s in states]
        self._run_all(self._random_states(9, 1)[0], states, [1] * 5, self.FLAGS, [0.2] * 5)
        for before, after in zip(snapshot, states, strict=True):
            for name in before:
                assert np.array_equal(before[name], after[name])


def test_the_registry_names_each_rule_once_with_what_it_reads() -> None:
    from service.audit.aggregation import RULES
    from service.audit.audit_config import AuditConfig
    from service.audit.pipeline import _aggregation_params

    # the six rules of docs/algorithms.md, each once (AGGREGATION_RULES is read from RULES)
    assert sorted(RULES) == sorted(
        ["fedavg", "daagg", "fedncl_layerwise", "trimmed_mean", "median", "reliability_weighted"]
    )
    # the two rules of the papers that read the primary detector's noisy set
    assert set(NOISY_SET_RULES) == {"daagg", "fedncl_layerwise"}
    # every parameter the audit configuration hands a rule is one the rule takes
    for name in AGGREGATION_RULES:
        primary = "fednoro" if name == "reliability_weighted" else "evidence"
        config = AuditConfig(aggregation=name, primary_detector=primary)
        given = set(_aggregation_params(config))
        assert given <= RULES[name].params, (name, given - RULES[name].params)
    assert RULES["trimmed_mean"].params == {"trim_fraction"}
