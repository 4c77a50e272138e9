"""The detectors' typed evidence and summaries (service.audit.verdict_types): which record each
detector gives, with values checked by hand, and the JSON each record writes (an absent field has
no key, a None field is a null, as the API's stored-audit models read them)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import EvidenceDetector, FedNCLDetector, FedNoRoDetector, expertise_detection
from service.audit.detection import ClientVerdict, DetectionResult
from service.audit.verdict_types import (
    ABSENT,
    EmptySummary,
    EvidenceSummary,
    EvidenceVerdictEvidence,
    ExpertiseSummary,
    ExpertiseVerdictEvidence,
    FedNCLSummary,
    FedNoRoSummary,
    FedNoRoVerdictEvidence,
    GroupMeans,
    or_none,
)
from tests.audit._readers import present


def test_an_absent_field_has_no_key_and_none_is_null() -> None:
    evidence = EvidenceVerdictEvidence(p_value=0.5, site_z=None, noisy_classes=[])
    assert evidence.to_json() == {"p_value": 0.5, "site_z": None, "noisy_classes": []}
    assert EvidenceSummary().to_json() == {}
    assert EmptySummary().to_json() == {}
    assert not ABSENT
    assert repr(ABSENT) == "ABSENT"


def test_or_none_reads_an_absent_field_as_none() -> None:
    summary = EvidenceSummary(mode="consensus", reason=None)
    assert or_none(summary.mode) == "consensus"
    assert or_none(summary.reason) is None
    assert or_none(summary.q) is None
    assert or_none(EvidenceSummary(flagged=0).flagged) == 0


def test_numpy_values_become_plain_json_and_nan_is_refused() -> None:
    summary = FedNoRoSummary(
        n_fits=np.int64(9),  # type: ignore[arg-type]
        group_mean_loss=GroupMeans(noisy=np.float64(1.5), clean=None),
    )
    out = summary.to_json()
    assert out == {"n_fits": 9, "group_mean_loss": {"noisy": 1.5, "clean": None}}
    assert type(out["n_fits"]) is int
    assert type(out["group_mean_loss"]["noisy"]) is float
    with pytest.raises(ValueError, match=r"\$\.summary\.std"):
        FedNCLSummary(std=math.nan).to_json("$.summary")


def test_a_verdict_and_a_result_write_their_records() -> None:
    verdict = ClientVerdict(0.25, None, ExpertiseVerdictEvidence(train_accuracy=0.9))
    result = DetectionResult("expertise", "ok", None, [verdict, None], ExpertiseSummary(note="n"))
    assert result.to_json() == {
        "method": "expertise",
        "status": "ok",
        "reason": None,
        "verdicts": [
            {"score": 0.25, "probability": None, "flag": None, "evidence": {"train_accuracy": 0.9}},
            None,
        ],
        "summary": {"note": "n"},
    }


def test_fedncl_gives_its_terms_by_hand() -> None:
    # q = e * h / n with h = loss * n (loss_mode "sum"): q = e * loss = [1, 1, 1, 4], whose mean
    # is 1.75 and standard deviation sqrt(27 / 16): site 3 stands (4 - 1.75) / 1.299 = sqrt(3) off
    detector = FedNCLDetector(beta=1.0).fit([1.0, 1.0, 1.0, 2.0], [1.0, 1.0, 1.0, 2.0], [10] * 4)
    result = detector.result_
    assert isinstance(result.summary, FedNCLSummary)
    assert result.summary.mean == pytest.approx(1.75)
    assert result.summary.lower_threshold is None
    last = present(result.verdicts[3])
    assert (last.evidence.divergence, last.evidence.data_quality) == (2.0, 20.0)
    assert last.evidence.deviation == pytest.approx(math.sqrt(3))
    assert last.flag is True


def test_fedncl_below_min_clients_says_nothing_of_the_round() -> None:
    result = FedNCLDetector().fit([1.0, 2.0], [1.0, 1.0], [10, 10]).result_
    assert result.status == "undetermined"
    assert result.summary == FedNCLSummary()
    assert result.to_json()["summary"] == {}


def test_expertise_gives_the_accuracies() -> None:
    result = expertise_detection([0.5, 0.75, 1.0])
    assert [present(v).evidence for v in result.verdicts] == [
        ExpertiseVerdictEvidence(0.5),
        ExpertiseVerdictEvidence(0.75),
        ExpertiseVerdictEvidence(1.0),
    ]
    assert (result.summary.min_accuracy, result.summary.max_accuracy) == (0.5, 1.0)
    assert expertise_detection([]).summary == ExpertiseSummary()


def test_fednoro_gives_its_record_and_only_the_columns_when_no_column_informs() -> None:
    loss = [[0.2, 0.3], [0.21, 0.3], [0.19, 0.3], [2.5, 0.3], [0.2, 0.3], [0.22, 0.3]]
    counts = [[10, 10]] * 6
    result = FedNoRoDetector(require_separation=False).fit(loss, counts).result_
    first = present(result.verdicts[0]).evidence
    assert isinstance(first, FedNoRoVerdictEvidence)
    assert first.normalised_loss[1] is None  # the constant class was dropped
    assert first.mean_loss == pytest.approx(0.25)
    assert result.summary.columns_dropped_constant == [1]
    constant = FedNoRoDetector().fit([[0.3, 0.3]] * 5, [[10, 10]] * 5).result_
    assert constant.status == "undetermined"
    assert constant.summary.to_json() == {
        "columns_used": [],
        "columns_dropped_missing": [],
        "columns_dropped_constant": [0, 1],
    }


def test_a_small_federation_answers_with_its_own_fields() -> None:
    # two sites with spreads: the small-federation test (worse than the label prior)
    loss, counts, sd = [[0.2, 0.3], [2.0, 2.5]], [[50, 50], [50, 50]], [[0.1, 0.1], [0.1, 0.1]]
    result = EvidenceDetector().fit(loss, counts, sd)
    evidence = present(result.verdicts[1]).evidence
    assert evidence.prior_loss == pytest.approx(math.log(2))
    assert evidence.mean_loss == pytest.approx(2.25)
    assert evidence.site_z is ABSENT
    assert set(evidence.to_json()) == {
        "p_value",
        "q_value",
        "mean_loss",
        "prior_loss",
        "loss_over_prior",
        "noisy_classes",
        "significant",
    }
    assert result.summary.mode == "small federation: worse than the label prior"
    too_few = EvidenceDetector().fit([[0.2, 0.3]], [[50, 50]])
    assert too_few.summary.to_json() == {"verdict": "undetermined", "q": 0.01}
