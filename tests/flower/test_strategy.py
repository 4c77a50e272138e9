"""FedAuditStrategy with real flwr objects: Message, Metadata, RecordDict, ArrayRecord,
MetricRecord, ConfigRecord, and FedAvg's aggregate_train (the wrapped strategy)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fedaudit_flower import (  # noqa: E402
    SIGNALS_KEY,
    FedAuditStrategy,
    WireSignals,
    encode_signals,
)
from service.audit import AggregationSettings, AuditConfig  # noqa: E402

CLEAN_LOSS = [0.30, 0.32, 0.28, 0.31, 0.29]
"""Per-class loss (both classes) of the five clean sites; the noisy site has 2.0."""

NOISY_NODE = 105
# DaAgg on this round's flags (not the status after them): one flag already down-weights a site.
ROUND_FLAGS = AuditConfig(
    aggregation="daagg", aggregation_settings=AggregationSettings(flags="round")
)


def reply(
    node_id: int, w: float, loss: float | None, *, signals: bool = True, spreads: bool = True
) -> Message:
    """A training reply as the ServerApp receives it: model, metrics, fedaudit signals."""
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.full(2, w, dtype=np.float32))}),
            "metrics": MetricRecord({"num-examples": 100, "train_loss": 0.5}),
        }
    )
    if signals:
        content[SIGNALS_KEY] = encode_signals(
            WireSignals(
                num_samples=100,
                class_counts=[50, 50],
                per_class_loss=None if loss is None else [loss, loss],
                per_class_loss_sd=None if loss is None or not spreads else [0.5, 0.5],
            )
        )
    metadata = Metadata(
        run_id=1,
        message_id=f"reply-{node_id}",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id=f"ins-{node_id}",
        group_id="1",
        created_at=time.time(),
        ttl=600.0,
        message_type=MessageType.TRAIN,
    )
    # The ServerApp receives replies built by the SuperLink with their metadata. The public
    # constructors need a running app (TaskIdentity.run_id), so the tests give the metadata,
    # which Message accepts but does not declare in its overloads.
    return Message(content=content, metadata=metadata)  # type: ignore[call-overload]


def federation() -> list[Message]:
    """Five clean sites (w = 1) and one noisy site (node 105: w = 7, loss 2.0 on both classes)."""
    clean = [reply(100 + k, 1.0, loss) for k, loss in enumerate(CLEAN_LOSS)]
    return [*clean, reply(NOISY_NODE, 7.0, 2.0)]


def w(arrays: ArrayRecord | None) -> np.ndarray:
    """The aggregated tensor "w" as float64."""
    assert arrays is not None
    return np.asarray(arrays["w"].numpy(), dtype=np.float64)


def strategy(tmp_path, **kwargs) -> FedAuditStrategy:
    s = FedAuditStrategy(FedAvg(), report_path=tmp_path / "audit.json", **kwargs)
    s.set_global_arrays(ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))}))
    return s


def test_the_noisy_site_is_flagged_then_down_weighted_by_daagg(tmp_path):
    s = strategy(tmp_path)
    # Round 1: the evidence flags node 105; one flag makes it "suspect", not "noisy" (2 flags
    # in the last 3 decided rounds), so DaAgg has no noisy site and weighs like FedAvg: 1/6 each.
    arrays, metrics = s.aggregate_train(1, federation())
    assert metrics["fedaudit.decided"] == 1
    assert metrics["fedaudit.applied"] == 1
    assert metrics["fedaudit.node_ids"] == [100, 101, 102, 103, 104, 105]
    assert metrics["fedaudit.flags"] == [0, 0, 0, 0, 0, 1]
    assert metrics["fedaudit.status"] == [0, 0, 0, 0, 0, 1]  # suspect
    assert metrics["fedaudit.weights"] == pytest.approx([1 / 6] * 6)
    # (5 * 1 + 7) / 6 = 2
    np.testing.assert_allclose(w(arrays), [2.0, 2.0], rtol=1e-6)
    # FedAvg's own metrics are kept
    assert metrics["train_loss"] == pytest.approx(0.5)
    assert s.statuses[str(NOISY_NODE)] == "suspect"

    # Round 2: flagged again -> "noisy"; DaAgg: d = 0 for the clean sites, D = 1 for the only
    # noisy one, so w_k is proportional to n_k exp(-D_k): 1 for the clean, 1/e for node 105.
    arrays, metrics = s.aggregate_train(2, federation())
    assert metrics["fedaudit.status"] == [0, 0, 0, 0, 0, 2]
    assert metrics["fedaudit.num_noisy"] == 1
    total = 5 + math.exp(-1)
    assert metrics["fedaudit.weights"] == pytest.approx([1 / total] * 5 + [math.exp(-1) / total])
    # (5 * 1 + 7 / e) / (5 + 1 / e) = 1.41121...; FedAvg would give 2
    expected = (5 + 7 * math.exp(-1)) / total
    assert expected == pytest.approx(1.41121, abs=1e-5)
    np.testing.assert_allclose(w(arrays), [expected, expected], rtol=1e-6)
    assert arrays["w"].numpy().dtype == np.float32

    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["format"] == "fedaudit.flower-report/1"
    assert report["wrapped_strategy"] == "FedAvg"
    assert [r["applied"] for r in report["rounds"]] == ["audit", "audit"]
    last = report["rounds"][-1]
    assert last["rule"] == "daagg"
    assert last["detector_status"] == "ok"
    noisy = last["clients"][-1]
    assert (noisy["node_id"], noisy["flag"], noisy["status_before"], noisy["status"]) == (
        NOISY_NODE,
        True,
        "suspect",
        "noisy",
    )
    assert noisy["verdict"]["evidence"]["p_value"] < 0.01
    assert report["statuses"][str(NOISY_NODE)] == {"status": "noisy", "recent_flags": [True, True]}
    assert report["statuses"]["100"] == {"status": "trusted", "recent_flags": [False, False]}


def test_round_flags_down_weight_at_the_first_flag(tmp_path):
    s = strategy(tmp_path, audit_config=ROUND_FLAGS)
    arrays, metrics = s.aggregate_train(1, federation())
    total = 5 + math.exp(-1)
    assert metrics["fedaudit.weights"][-1] == pytest.approx(math.exp(-1) / total)
    np.testing.assert_allclose(w(arrays), [(5 + 7 * math.exp(-1)) / total] * 2, rtol=1e-6)


def test_undetermined_audit_keeps_the_wrapped_strategys_aggregate(tmp_path):
    # Three sites: the calibrated evidence needs five (evidence_min_clients); fewer sites get
    # the "worse than the label prior" test, which needs the per-class spreads. Without them
    # the audit stays undetermined.
    replies = [
        reply(100 + k, w, loss, spreads=False)
        for k, (w, loss) in enumerate([(1.0, 0.3), (1.0, 0.3), (4.0, 2.0)])
    ]
    s = strategy(tmp_path)
    arrays, metrics = s.aggregate_train(1, replies)
    fedavg_arrays, _ = FedAvg().aggregate_train(1, replies)
    # FedAvg's (1 + 1 + 4) / 3 = 2, returned as FedAvg computed it
    np.testing.assert_array_equal(arrays["w"].numpy(), fedavg_arrays["w"].numpy())
    np.testing.assert_allclose(w(arrays), [2.0, 2.0])
    assert metrics["fedaudit.decided"] == 0
    assert metrics["fedaudit.applied"] == 0
    assert metrics["fedaudit.flags"] == [-1, -1, -1]
    assert metrics["fedaudit.status"] == [0, 0, 0]
    entry = s.rounds[0]
    assert entry["applied"] == "wrapped"
    assert entry["detector_status"] == "undetermined"
    assert "primary detector 'evidence' undetermined" in entry["reason"]
    assert "wrapped strategy's aggregate is kept" in entry["reason"]
    # an undetermined round changes no status
    assert s.statuses == {"100": "trusted", "101": "trusted", "102": "trusted"}


def test_a_reply_without_signals_is_not_audited(tmp_path):
    replies = [*federation()[:5], reply(NOISY_NODE, 7.0, None, signals=False)]
    s = strategy(tmp_path)
    arrays, metrics = s.aggregate_train(1, replies)
    np.testing.assert_allclose(w(arrays), [2.0, 2.0])  # FedAvg
    assert metrics["fedaudit.decided"] == 0
    assert metrics is not None
    assert "fedaudit.flags" not in metrics
    assert s.rounds[0]["audited"] is False
    assert f"node {NOISY_NODE} sent no 'fedaudit.signals' ConfigRecord" in s.rounds[0]["reason"]
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["rounds"][0]["applied"] == "wrapped"


def test_without_a_global_model_the_round_is_not_audited():
    s = FedAuditStrategy()
    arrays, metrics = s.aggregate_train(1, federation())
    np.testing.assert_allclose(w(arrays), [2.0, 2.0])
    assert metrics["fedaudit.decided"] == 0
    assert "configure_train was not called" in s.rounds[0]["reason"]


def test_a_reply_with_an_error_is_left_out(tmp_path):
    from flwr.app import Error

    ok = federation()
    failed = Message(  # type: ignore[call-overload]
        error=Error(code=0, reason="boom"), metadata=ok[0].metadata
    )
    s = strategy(tmp_path)
    _, metrics = s.aggregate_train(1, [*ok[1:], failed, reply(106, 1.0, 0.3)])
    assert metrics["fedaudit.node_ids"] == [101, 102, 103, 104, 105, 106]
    assert metrics["fedaudit.flags"] == [0, 0, 0, 0, 1, 0]


def test_the_signals_record_round_trips_none_as_nan():
    from fedaudit_flower import decode_signals

    signals = WireSignals(
        num_samples=3,
        class_counts=[2, 0, 1],
        per_class_loss=[0.5, None, 1.5],
        per_class_loss_sd=[0.1, None, 0.0],
        per_class_errors=[1, None, 0],
        per_class_confident_errors=[1, None, 0],
        train_loss=0.7,
        train_accuracy=2 / 3,
        probe_softmax=[[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]],
    )
    record = encode_signals(signals)
    assert isinstance(record, ConfigRecord)
    assert record["per_class_errors"] == [1, -1, 0]
    assert record["per_class_confident_errors"] == [1, -1, 0]
    assert record["probe_softmax"] == [0.25, 0.25, 0.5, 1.0, 0.0, 0.0]
    assert record["probe_softmax_shape"] == [2, 3]
    assert math.isnan(float(record["per_class_loss"][1]))
    assert decode_signals(record) == signals


def test_three_sites_with_spreads_get_the_small_federation_verdict(tmp_path):
    # Two to four sites: the evidence asks whether the global model does worse than the label
    # prior (H = ln 2 = 0.693 here) on a site's labels. Node 102 loses 2.0 nats, z = (2.0 -
    # ln 2) / (0.5 / sqrt(100)) = 26; the other two lose 0.3, far below H.
    replies = [reply(100, 1.0, 0.3), reply(101, 1.0, 0.3), reply(102, 4.0, 2.0)]
    s = strategy(tmp_path, audit_config=ROUND_FLAGS)
    arrays, metrics = s.aggregate_train(1, replies)
    assert metrics["fedaudit.decided"] == 1
    assert metrics["fedaudit.flags"] == [0, 0, 1]
    # DaAgg: w proportional to 1, 1, 1/e;
    # (1 + 1 + 4 / e) / (2 + 1 / e) = 3.47152 / 2.36788 = 1.46609 (FedAvg: 2)
    expected = (2 + 4 * math.exp(-1)) / (2 + math.exp(-1))
    assert expected == pytest.approx(1.46609, abs=1e-5)
    np.testing.assert_allclose(w(arrays), [expected, expected], rtol=1e-6)
