"""Fed-NCL: divergence, reliability score, sigma rule and persistence (Fed-NCL, Tam et al.,
TNNLS; docs/algorithms.md, Fed-NCL)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.base import clone

from service.audit import (
    DictStateReader,
    FedNCLDetector,
    InvalidInputError,
    InvalidParameterError,
    correction_candidates,
    fedncl_divergence,
    fedncl_divergences,
)
from tests.audit._readers import RecordingReader, present, reads_grouped_by_tensor

GLOBAL = {
    "w": np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
    "b": np.array([0.5]),
    "n": np.array(5, dtype=np.int64),
}
CLIENT = {
    "w": np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32),  # diff 2 in one entry
    "b": np.array([3.5]),  # diff 3
    "n": np.array(9, dtype=np.int64),  # integer: ignored
}


class TestDivergence:
    def test_paper_variant(self):
        # squared L2 over every float entry: 2^2 + 3^2 = 13
        value = fedncl_divergence(DictStateReader(GLOBAL), DictStateReader(CLIENT))
        assert value == pytest.approx(13.0)

    def test_reference_variant(self):
        # per float tensor (L2 norm + 1): w: 2 + 1 = 3, b: 3 + 1 = 4 -> 7
        value = fedncl_divergence(
            DictStateReader(GLOBAL), DictStateReader(CLIENT), variant="reference"
        )
        assert value == pytest.approx(7.0)

    def test_batched_matches_and_identical_client_is_zero(self):
        states = [DictStateReader(CLIENT), DictStateReader(GLOBAL)]
        paper = fedncl_divergences(DictStateReader(GLOBAL), states)
        assert paper.tolist() == pytest.approx([13.0, 0.0])
        # identical client, reference: (0 + 1) + (0 + 1) = 2 (two float tensors)
        reference = fedncl_divergences(DictStateReader(GLOBAL), states, "reference")
        assert reference.tolist() == pytest.approx([7.0, 2.0])

    def test_streams_tensor_by_tensor_reading_each_once(self):
        log: list[tuple[str, str]] = []
        global_state = RecordingReader(GLOBAL, "g", log)
        clients = [RecordingReader(CLIENT, f"c{k}", log) for k in range(3)]
        fedncl_divergences(global_state, clients)
        assert sorted(log) == sorted(
            [(label, name) for label in ("g", "c0", "c1", "c2") for name in GLOBAL]
        )
        assert reads_grouped_by_tensor(log, list(GLOBAL))

    def test_mismatched_states_raise(self):
        bad = dict(CLIENT, w=np.zeros((2, 3), dtype=np.float32))
        with pytest.raises(InvalidInputError, match=r"client_states\[0\]: tensor 'w' has shape"):
            fedncl_divergences(DictStateReader(GLOBAL), [DictStateReader(bad)])
        with pytest.raises(InvalidParameterError, match="variant"):
            fedncl_divergences(DictStateReader(GLOBAL), [], "l1")


class TestFedNCLRule:
    def test_one_sided_sigma_rule(self):
        # sum mode: q = e * (loss * n) / n = e * loss = [0.5, 0.5, 0.5, 0.5, 3.0]
        # mean = 5 / 5 = 1.0, population var = (4 * 0.25 + 2.0^2) / 5 = 1.0, std = 1.0
        # flag q - mean > 1.0: only client 4 (2.0 > 1.0)
        detector = FedNCLDetector().fit([1, 1, 1, 1, 6], [0.5] * 5, [10, 20, 30, 40, 50])
        result = detector.result_
        assert present(detector.scores_).tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5, 3.0])
        assert result.flags == [False, False, False, False, True]
        assert result.summary.mean == pytest.approx(1.0)
        assert result.summary.std == pytest.approx(1.0)
        assert detector.threshold_ == pytest.approx(2.0)
        assert present(result.verdicts[4]).evidence.to_json() == pytest.approx(
            {"divergence": 6.0, "data_quality": 25.0, "deviation": 2.0}
        )

    def test_two_sided_flags_low_scores_too(self):
        # q = [0, 2, 2, 2, 2, 4] (e = q, loss 1): mean 2, var (4 + 4) / 6 = 1.3333,
        # std 1.1547; one-sided flags only 4; two-sided |dev| = 2 > 1.1547 flags 0 too.
        args = ([0, 2, 2, 2, 2, 4], [1.0] * 6, [5] * 6)
        assert FedNCLDetector().fit(*args).result_.flags == [False] * 5 + [True]
        two = FedNCLDetector(two_sided=True).fit(*args).result_
        assert two.flags == [True, False, False, False, False, True]
        assert two.summary.lower_threshold == pytest.approx(2 - 1.1547005)

    def test_population_std_is_used(self):
        # q = [1, 1, 1, 3]: mean 1.5, population std sqrt(3 / 4) = 0.8660,
        # sample std sqrt(3 / 3) = 1. With beta = 1.6: 1.6 * 0.866 = 1.386 < 1.5 -> flagged
        # (with the sample std 1.6 > 1.5 would not be).
        result = FedNCLDetector(beta=1.6).fit([1, 1, 1, 3], [1.0] * 4, [1] * 4).result_
        assert result.flags == [False, False, False, True]
        assert result.summary.std == pytest.approx(np.sqrt(0.75))
        assert result.summary.std_ddof == 0

    def test_mean_loss_mode(self):
        # mean mode: q = e * loss / n = [2/10, 2/20, 2/40] = [0.2, 0.1, 0.05]
        # mean 0.116667, deviations 0.083333, -0.016667, -0.066667,
        # var (0.0069444 + 0.0002778 + 0.0044444) / 3 = 0.0038889, std 0.062361
        # one-sided: 0.083333 > 0.062361 -> client 0 only
        args = ([2, 2, 2], [1.0, 1.0, 1.0], [10, 20, 40])
        mean_mode = FedNCLDetector(loss_mode="mean").fit(*args)
        assert present(mean_mode.scores_).tolist() == pytest.approx([0.2, 0.1, 0.05])
        assert mean_mode.result_.flags == [True, False, False]
        assert mean_mode.result_.summary.std == pytest.approx(0.062361, abs=1e-6)
        # sum mode: q = e * loss = [2, 2, 2], all equal -> nobody
        assert FedNCLDetector().fit(*args).result_.flags == [False, False, False]

    def test_beta_zero_flags_everything_above_the_mean(self):
        result = FedNCLDetector(beta=0.0).fit([1, 2, 3, 4], [1.0] * 4, [1] * 4).result_
        assert result.flags == [False, False, True, True]

    def test_all_equal_scores_flag_nobody_without_nan(self):
        for two_sided in (False, True):
            result = FedNCLDetector(two_sided=two_sided).fit([0.1] * 3, [0.3] * 3, [7] * 3)
            assert result.result_.flags == [False] * 3
            assert result.result_.summary.std == 0.0
            json.dumps(result.result_.to_json(), allow_nan=False)
        zero = FedNCLDetector().fit([0.0] * 4, [0.0] * 4, [1] * 4).result_
        assert zero.flags == [False] * 4

    def test_permutation_invariance(self):
        e = np.array([1.0, 5.0, 1.2, 0.9, 7.0, 1.1])
        loss = np.array([0.4, 0.9, 0.5, 0.3, 1.2, 0.45])
        n = np.array([10, 30, 20, 10, 50, 40])
        perm = np.array([3, 5, 0, 4, 1, 2])
        base = FedNCLDetector().fit(e, loss, n)
        permuted = FedNCLDetector().fit(e[perm], loss[perm], n[perm])
        assert present(permuted.labels_).tolist() == present(base.labels_)[perm].tolist()
        assert present(permuted.scores_) == pytest.approx(present(base.scores_)[perm])

    def test_huge_scores_do_not_overflow(self):
        result = FedNCLDetector().fit([1e150, 1e150, 1e150, 4e150], [1e150] * 4, [1] * 4)
        assert result.result_.flags == [False, False, False, True]
        json.dumps(result.result_.to_json(), allow_nan=False)

    def test_overflowing_scores_are_undetermined(self):
        result = FedNCLDetector().fit([1e300] * 3, [1e300] * 3, [1] * 3).result_
        assert result.status == "undetermined"
        assert result.reason == "reliability scores overflow"

    def test_too_few_clients(self):
        detector = FedNCLDetector().fit([1.0, 2.0], [0.5, 0.5], [10, 10])
        assert detector.result_.status == "undetermined"
        assert detector.result_.flags == [None, None]
        assert detector.labels_ is None
        assert detector.threshold_ is None
        assert FedNCLDetector().fit([], [], []).result_.verdicts == []
        single = FedNCLDetector(min_clients=2).fit([1.0], [0.5], [3]).result_
        assert single.status == "undetermined"

    @pytest.mark.parametrize(
        ("params", "match"),
        [
            ({"beta": -1}, "beta"),
            ({"beta": "1"}, "beta"),
            ({"two_sided": "yes"}, "two_sided"),
            ({"min_clients": 1}, "min_clients"),
            ({"loss_mode": "median"}, "loss_mode"),
        ],
    )
    def test_bad_parameters(self, params, match):
        with pytest.raises(InvalidParameterError, match=match):
            FedNCLDetector(**params).fit([1, 2, 3], [1, 1, 1], [1, 1, 1])

    @pytest.mark.parametrize(
        ("args", "match"),
        [
            (([1, 2, 3], [1, 1], [1, 1, 1]), "lengths"),
            (([1, -2, 3], [1, 1, 1], [1, 1, 1]), "divergence: values must be >= 0"),
            (([1, 2, 3], [1, np.nan, 1], [1, 1, 1]), "train_loss: contains NaN"),
            (([1, 2, 3], [1, 1, 1], [1, 0, 1]), "num_samples: values must be >= 1"),
            (([[1, 2, 3]], [1, 1, 1], [1, 1, 1]), "divergence: expected a 1-D"),
        ],
    )
    def test_bad_inputs(self, args, match):
        with pytest.raises(InvalidInputError, match=match):
            FedNCLDetector().fit(*args)

    def test_estimator_contract(self):
        detector = FedNCLDetector(beta=0.6, two_sided=True)
        assert detector.get_params() == {
            "beta": 0.6,
            "two_sided": True,
            "min_clients": 3,
            "loss_mode": "sum",
        }
        assert clone(detector).get_params() == detector.get_params()
        assert detector.fit([1, 2, 3], [1, 1, 1], [1, 1, 1]) is detector
        assert detector.n_clients_seen_ == 3


class TestCorrectionCandidates:
    def test_more_than_alpha_t_corr(self):
        # threshold 0.6 * 60 = 36: strictly more than 36 rounds
        result = correction_candidates([0, 36, 37, 60], 60)
        assert result.tolist() == [False, False, True, True]
        # the reference's alpha 0.5: threshold 30
        assert correction_candidates([30, 31], 60, alpha=0.5).tolist() == [False, True]

    def test_bad_arguments(self):
        with pytest.raises(InvalidInputError, match="exceeds t_corr"):
            correction_candidates([61], 60)
        with pytest.raises(InvalidInputError, match="flag_counts"):
            correction_candidates([-1], 60)
        with pytest.raises(InvalidParameterError, match="t_corr"):
            correction_candidates([0], 0)
        with pytest.raises(InvalidParameterError, match="alpha"):
            correction_candidates([0], 10, alpha=1.5)
