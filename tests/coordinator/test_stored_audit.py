"""The typed reader of a stored audit result (``service.coordinator.stored_audit``), on literal
stored payloads: an audit stored by an older version lacks the fields added since, and a stored
null reads as the reports always read it."""

from __future__ import annotations

import pytest

from service.audit import DETECTORS
from service.audit_records.detection_summaries import EvidenceSummary, FedNoRoSummary
from service.audit_records.stored_record import StoredRecord
from service.coordinator.stored_audit import (
    FlagEntry,
    StoredDetection,
    client_audit_in,
    read_audit,
    read_neighbors,
)

RESULT = {
    "client_ids": ["a", "b"],
    "primary": "fednoro",
    "primary_flags": [True, None],
    "detections": {
        "fednoro": {
            "method": "fednoro",
            "status": "ok",
            "reason": None,
            "verdicts": [
                {"score": 2.5, "flag": True, "evidence": {"noisy_classes": [1]}},
                None,
            ],
            "summary": {"guard": "separation guard passed", "ashman_d": 3.1},
        },
        "fedncl": {"method": "fedncl", "status": "undetermined", "reason": "too few sites"},
    },
    "aggregation": {"rule": "fednoro", "weights": [0.25, 0.75], "fallback_reason": None},
    "neighbors": {"a": [{"client_id": "b", "weight": 1.0}]},
    "self_weights": {"a": 0.5},
    "centroids": None,
}


def test_an_older_audit_reads_with_the_defaults() -> None:
    audit = read_audit(RESULT)  # no round_index, in_warmup, clients, privacy
    assert audit.positions == {"a": 0, "b": 1}
    assert audit.in_warmup is None
    assert audit.clients == []
    assert audit.primary_flag_at(0) is True
    assert audit.primary_flag_at(1) is None
    assert audit.primary_flag_at(2) is None
    assert audit.primary_flag_at(None) is None
    detection = audit.primary_detection
    assert (detection.status, detection.reason) == ("ok", None)
    assert detection.guard == "separation guard passed"
    assert audit.detections["fedncl"].summary is None
    assert audit.aggregation.rule == "fednoro"


def test_nulls_and_missing_keys_read_as_none() -> None:
    empty = read_audit({"primary": "evidence", "detections": None, "aggregation": None})
    assert empty.primary_detection == StoredDetection()
    assert empty.primary_detection.guard is None
    assert empty.aggregation.fallback_reason is None
    assert empty.client_ids == []
    assert read_audit(None).primary is None
    assert read_neighbors({"neighbors": None}).neighbors == {}


def test_each_summary_reads_as_its_detectors_record() -> None:
    # the same keys under two detectors: each is read by its own detector's record only
    shared = {"guard": "separation guard passed", "majority_suspected": True}
    audit = read_audit(
        {
            "primary": "evidence",
            "detections": {
                "evidence": {"summary": {**shared, "disagreeing_classes": [2, 5]}},
                "fednoro": {"summary": dict(shared)},
                "newdetector": {"summary": {"anything": 1}},
                "fedncl": {"summary": None},
            },
        }
    )
    evidence, fednoro = audit.detections["evidence"], audit.detections["fednoro"]
    assert type(evidence.summary) is EvidenceSummary
    assert type(fednoro.summary) is FedNoRoSummary
    assert (evidence.majority_suspected, evidence.guard) == (True, None)
    assert evidence.disagreeing_classes == [2, 5]
    assert (fednoro.majority_suspected, fednoro.guard) == (False, "separation guard passed")
    assert fednoro.disagreeing_classes == []
    unknown = audit.detections["newdetector"].summary
    assert type(unknown) is StoredRecord
    assert unknown.model_dump() == {"anything": 1}
    assert audit.detections["fedncl"].summary is None


@pytest.mark.parametrize("summary", [{"majority_suspected": False}, {}, None])
def test_majority_is_suspected_only_where_the_evidence_summary_says_so(
    summary: dict | None,
) -> None:
    detection = read_audit({"detections": {"evidence": {"summary": summary}}}).detections
    assert detection["evidence"].majority_suspected is False


def test_a_wrongly_typed_stored_summary_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        read_audit({"detections": {"evidence": {"summary": {"disagreeing_classes": "2"}}}})


def test_one_client_of_a_loaded_result() -> None:
    first = client_audit_in(RESULT, 0, "a")
    assert first.primary == "fednoro"
    assert (first.primary_flag, first.weight) == (True, 0.25)
    assert first.neighbors == [{"client_id": "b", "weight": 1.0}]
    assert first.epsilon_round is None  # no privacy budget stored
    verdict = first.detectors["fednoro"]
    assert (verdict.status, verdict.score, verdict.flag) == ("ok", 2.5, True)
    assert verdict.noisy_classes == (1,)
    assert first.detectors["fedncl"].status == "undetermined"
    assert set(first.detectors) == {"fednoro", "fedncl"}  # the others did not run

    second = client_audit_in(RESULT, 1, "b")  # no verdict, no neighbors
    assert second.detectors["fednoro"].score is None
    assert second.detectors["fednoro"].noisy_classes == ()
    assert second.neighbors is None


def test_the_neighbors_handed_to_the_next_round() -> None:
    stored = read_neighbors(RESULT)
    assert stored.neighbors == {"a": [{"client_id": "b", "weight": 1.0}]}
    assert stored.self_weights == {"a": 0.5}


def test_the_flag_history_names_every_detector() -> None:
    # each detector's flag is stored under its name (service.coordinator.audits._flags_of)
    assert set(DETECTORS) <= FlagEntry.__optional_keys__


def test_the_classes_named_for_a_noisy_sites_distillation() -> None:
    # FedNoRo's kd_scope "classes" distils a noisy site's samples of the classes the primary
    # detector names there: a's [1]; b has no verdict; c is not in the audit; a detector
    # that names no class (fedncl as primary) gives nothing.
    import uuid
    from types import SimpleNamespace
    from typing import Any, cast

    from service.coordinator.audits import noisy_classes_named

    a, b, c = (uuid.UUID(int=n) for n in (1, 2, 3))
    result: dict[str, Any] = {**RESULT, "client_ids": [str(a), str(b)]}
    audit = cast(Any, SimpleNamespace(result=result))
    assert noisy_classes_named(audit, [a, b, c]) == {a: [1]}
    assert noisy_classes_named(audit, []) == {}
    assert noisy_classes_named(None, [a]) == {}
    as_fedncl = cast(Any, SimpleNamespace(result={**result, "primary": "fedncl"}))
    assert noisy_classes_named(as_fedncl, [a, b]) == {}


def test_the_classes_a_noisy_site_distils_spare_those_it_holds_unless_named() -> None:
    # Four sites, 3 classes. a (noisy; the audit names class 1 at it) declares 30 of the 40
    # samples of class 0 (75 %, above max(0.25, 2 / 4) = 0.5), 10 of class 1's 40 (25 %) and
    # 10 of class 2's 40: it keeps class 0 (held, not named) and distils 1 and 2. Had the audit
    # named class 0 too, it would distil all three. b is noisy but not named by the audit: no
    # list (it distils every class). A declared count may be null (coarsened by the privacy
    # policy: at least 1, fewer than its minimum): read as 0. Another recipe or kd_scope
    # "site": nothing listed.
    import uuid
    from types import SimpleNamespace
    from typing import Any, cast

    from service.coordinator.audits import distil_classes

    a, b, c, d = (uuid.UUID(int=n) for n in (1, 2, 3, 4))
    result: dict[str, Any] = {**RESULT, "client_ids": [str(a), str(b)]}
    audit = cast(Any, SimpleNamespace(result=result))
    sites = [
        SimpleNamespace(id=a, class_counts=[30, 10, 10]),
        SimpleNamespace(id=b, class_counts=[5, 10, None]),
        SimpleNamespace(id=c, class_counts=[5, 10, 15]),
        SimpleNamespace(id=d, class_counts=[0, 10, 15]),
    ]
    selected = cast(Any, sites)
    fed = cast(Any, SimpleNamespace(config={"recipe": "fednoro", "hyperparameters": {}}))
    fed.num_classes = 3
    assert distil_classes(audit, selected, {a, b}, fed) == {a: [1, 2]}
    both = {**result, "detections": {**result["detections"]}}
    both["detections"]["fednoro"] = {
        **result["detections"]["fednoro"],
        "verdicts": [{"score": 2.5, "flag": True, "evidence": {"noisy_classes": [0, 1]}}, None],
    }
    assert distil_classes(cast(Any, SimpleNamespace(result=both)), selected, {a}, fed) == {
        a: [0, 1, 2]
    }
    assert distil_classes(None, selected, {a}, fed) == {}
    for config in (
        {"recipe": "fedavg", "hyperparameters": {}},
        {"recipe": "fednoro", "hyperparameters": {"kd_scope": "site"}},
    ):
        other = cast(Any, SimpleNamespace(config=config, num_classes=3))
        assert distil_classes(audit, selected, {a, b}, other) == {}
