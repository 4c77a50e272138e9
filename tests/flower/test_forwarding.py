"""FedAuditStrategy forwarding to a real coordinator (uvicorn on a loopback port), with real flwr
objects (Message, ArrayRecord, ConfigRecord, MetricRecord) and FedAvg as the wrapped strategy.

The forwarding mode's flags, statuses, weights and models equal the in-process mode's on the same
replies (both run ``service.audit.run_audit`` on the same inputs); the coordinator's own report
lists the Flower nodes as its sites."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from client_sdk import (  # noqa: E402
    AdminClient,
    AuthenticationError,
    SignalPolicy,
    UnprocessableEntityError,
)
from fedaudit_flower import (  # noqa: E402
    SIGNALS_KEY,
    CoordinatorConnection,
    FedAuditStrategy,
    WireSignals,
    encode_signals,
)
from fedaudit_flower.auditing import array_record  # noqa: E402
from fedaudit_flower.coordinator import implied_input_shape  # noqa: E402
from fedaudit_sim.coordinator_process import CoordinatorProcess  # noqa: E402

pytestmark = pytest.mark.slow

NODES = (100, 101, 102, 103, 104, 105)
NOISY_NODE = 105
CLEAN_LOSS = {100: 0.30, 101: 0.32, 102: 0.28, 103: 0.31, 104: 0.29, 106: 0.30}


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(tmp_path_factory.mktemp("flower-coordinator")) as process:
        yield process


@pytest.fixture
def closing() -> Iterator[ExitStack]:
    """Strategies registered here close their HTTP clients at the end of the test."""
    with ExitStack() as stack:
        yield stack


def connection(server: CoordinatorProcess, name: str, **kwargs: Any) -> CoordinatorConnection:
    return CoordinatorConnection(
        server.url, server.admin_token, federation_name=name, poll_interval_s=0.05, **kwargs
    )


def reply(
    node_id: int,
    server_round: int,
    *,
    signals: bool = True,
    spreads: bool = True,
    train_loss: float | None = 0.5,
) -> Message:
    """Node ``node_id``'s training reply: the noisy node sends w = 7 and loses 2.0 on both
    classes, the clean ones w = 1 (a little different each round) and about 0.3."""
    noisy = node_id == NOISY_NODE
    value = 7.0 if noisy else 1.0 + 0.01 * server_round
    loss = 2.0 if noisy else CLEAN_LOSS[node_id]
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.full(2, value, dtype=np.float32))}),
            "metrics": MetricRecord({"num-examples": 100, "train_loss": 0.5}),
        }
    )
    if signals:
        content[SIGNALS_KEY] = encode_signals(
            WireSignals(
                num_samples=100,
                class_counts=[50, 50],
                per_class_loss=[loss, loss],
                per_class_loss_sd=[0.5, 0.5] if spreads else None,
                train_loss=train_loss,
            )
        )
    metadata = Metadata(
        run_id=1,
        message_id=f"reply-{node_id}-{server_round}",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id=f"ins-{node_id}-{server_round}",
        group_id=str(server_round),
        created_at=time.time(),
        ttl=600.0,
        message_type=MessageType.TRAIN,
    )
    # As in test_strategy: the ServerApp receives replies with their metadata.
    return Message(content=content, metadata=metadata)  # type: ignore[call-overload]


def w(arrays: ArrayRecord | None) -> np.ndarray:
    return np.asarray(model(arrays)["w"].numpy())


def model(arrays: ArrayRecord | None) -> ArrayRecord:
    """The round's model (every round here returns one)."""
    assert arrays is not None
    return arrays


INITIAL = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
COMPARED = ("decided", "applied", "node_ids", "flags", "status", "num_flagged", "num_noisy")


def test_forwarding_gives_the_in_process_audit(
    coordinator: CoordinatorProcess, tmp_path: Path, closing: ExitStack
):
    in_process = FedAuditStrategy(FedAvg(), report_path=tmp_path / "in-process.json")
    forwarding = FedAuditStrategy(
        FedAvg(),
        report_path=tmp_path / "forwarding.json",
        coordinator=connection(coordinator, "same-audit", rounds=3),
    )
    closing.callback(forwarding.close)
    models = {"in_process": INITIAL, "forwarding": INITIAL}
    for server_round in (1, 2, 3):
        replies = [reply(node, server_round) for node in NODES]
        results = {}
        for name, strategy in (("in_process", in_process), ("forwarding", forwarding)):
            strategy.set_global_arrays(models[name])  # what configure_train does
            results[name] = strategy.aggregate_train(server_round, replies)
            models[name] = model(results[name][0])
        (a_in, m_in), (a_fw, m_fw) = results["in_process"], results["forwarding"]
        for key in COMPARED:
            assert m_fw[f"fedaudit.{key}"] == m_in[f"fedaudit.{key}"], (server_round, key)
        assert m_fw["fedaudit.weights"] == pytest.approx(m_in["fedaudit.weights"], rel=1e-12)
        assert m_fw["fedaudit.scores"] == pytest.approx(m_in["fedaudit.scores"], rel=1e-12)
        # every round is decided: the audit's aggregate, computed by the same code
        np.testing.assert_array_equal(w(a_fw), w(a_in))
        assert a_fw["w"].numpy().dtype == np.float32
        assert m_fw["train_loss"] == pytest.approx(0.5)  # FedAvg's own metrics are kept
    # round 1 suspect, round 2 noisy (DaAgg: 1/e of a clean site's weight), round 3 noisy
    assert m_fw["fedaudit.status"] == [0, 0, 0, 0, 0, 2]
    total = 5 + math.exp(-1)
    assert m_fw["fedaudit.weights"] == pytest.approx([1 / total] * 5 + [math.exp(-1) / total])
    assert forwarding.statuses == in_process.statuses

    report = json.loads((tmp_path / "forwarding.json").read_text())
    same = json.loads((tmp_path / "in-process.json").read_text())
    assert report["statuses"] == same["statuses"]
    for entry, twin in zip(report["rounds"], same["rounds"], strict=True):
        assert entry["clients"] == twin["clients"]
        assert entry["coordinator"]["global_model_matches"] is True
        assert entry["coordinator"]["left_out"] == []
        assert entry["coordinator"]["state_reason"] == "complete"
    federation_id = report["coordinator"]["federation_id"]
    assert sorted(report["coordinator"]["clients"]) == [str(n) for n in NODES]

    # the coordinator's report lists the six nodes, node 105 noisy; its federation finished
    with AdminClient(coordinator.url, coordinator.admin_token) as admin:
        sites = admin.get_json(f"/federations/{federation_id}/report")
        assert admin.get_federation(federation_id).status == "finished"
    status = {row["name"]: row["status"] for row in sites["clients"]}
    assert status == {
        f"flower-node-{node:020d}": "noisy" if node == NOISY_NODE else "trusted" for node in NODES
    }


POLICY = SignalPolicy(min_class_count=5, count_bucket=10)


def private_reply(node_id: int, server_round: int) -> Message:
    """A reply under :data:`POLICY`: counts rounded up to 10, the third class (3 samples)
    suppressed. Node 105 loses 2.0 on its classes; node 104 loses what the others lose but makes
    30 errors in each class, which only its error counts show (and a bucket leaves them out)."""
    message = reply(node_id, server_round)
    # a model with one output per class (the coordinator checks that the model fits the task)
    value = 7.0 if node_id == NOISY_NODE else 1.0 + 0.01 * server_round
    message.content["arrays"] = ArrayRecord({"w": Array(np.full(3, value, dtype=np.float32))})
    loss = 2.0 if node_id == NOISY_NODE else CLEAN_LOSS[node_id]
    message.content[SIGNALS_KEY] = encode_signals(
        WireSignals(
            num_samples=100,
            class_counts=[50, 40, None],
            per_class_loss=[loss, loss, None],
            per_class_loss_sd=[0.5, 0.5, None],
            per_class_errors=[30, 30, None] if node_id == 104 else [5, 4, None],
            train_loss=0.5,
        )
    )
    return message


def test_forwarding_carries_the_privacy_policy(
    coordinator: CoordinatorProcess, tmp_path: Path, closing: ExitStack
):
    in_process = FedAuditStrategy(FedAvg(), privacy=POLICY)
    forwarding = FedAuditStrategy(
        FedAvg(), privacy=POLICY, coordinator=connection(coordinator, "private", rounds=2)
    )
    closing.callback(forwarding.close)
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    models = {"in_process": initial, "forwarding": initial}
    for server_round in (1, 2):
        replies = [private_reply(node, server_round) for node in NODES]
        results = {}
        for name, strategy in (("in_process", in_process), ("forwarding", forwarding)):
            strategy.set_global_arrays(models[name])
            results[name] = strategy.aggregate_train(server_round, replies)
            models[name] = model(results[name][0])
        (_, m_in), (_, m_fw) = results["in_process"], results["forwarding"]
        for key in COMPARED:
            assert m_fw[f"fedaudit.{key}"] == m_in[f"fedaudit.{key}"], (server_round, key)
        assert m_fw["fedaudit.scores"] == pytest.approx(m_in["fedaudit.scores"], rel=1e-12)
        # the losses flag node 105; node 104's error counts are left out on both sides
        assert m_fw["fedaudit.flags"] == [0, 0, 0, 0, 0, 1]
    # the coordinator's federation has the policy: it accepted the suppressed counts
    federation_id = forwarding.report()["coordinator"]["federation_id"]
    with AdminClient(coordinator.url, coordinator.admin_token) as admin:
        privacy = admin.get_federation(federation_id).config["privacy"]
    assert SignalPolicy.model_validate(privacy) == POLICY


GAUSSIAN = SignalPolicy(dp_noise_multiplier=1.0, dp_clip_loss=5.0, dp_delta=1e-5)


def gaussian_reply(node_id: int, server_round: int) -> Message:
    """A reply under :data:`GAUSSIAN` (no spreads, no error counts): the clean nodes hold
    500 + 500 samples (noise sd 5 / 500 on a class mean), node 104 10 + 10 (noise sd 0.5) and
    means 0.7 and 0.6 above the others' (what the noise explains), node 105 losses 2.0."""
    message = reply(node_id, server_round)
    small = node_id == 104
    n = 10 if small else 500
    loss: list[float | None] = (
        [1.0, 0.9] if small else [2.0, 2.0] if node_id == NOISY_NODE else [0.30, 0.31]
    )
    message.content[SIGNALS_KEY] = encode_signals(
        WireSignals(num_samples=2 * n, class_counts=[n, n], per_class_loss=loss, train_loss=0.5)
    )
    return message


def test_forwarding_carries_the_gaussian_mechanism(
    coordinator: CoordinatorProcess, closing: ExitStack
):
    # the coordinator's process runs in this environment: it accounts with dp-accounting
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    in_process = FedAuditStrategy(FedAvg(), privacy=GAUSSIAN)
    forwarding = FedAuditStrategy(
        FedAvg(), privacy=GAUSSIAN, coordinator=connection(coordinator, "gaussian", rounds=1)
    )
    closing.callback(forwarding.close)
    replies = [gaussian_reply(node, 1) for node in NODES]
    results = {}
    for name, strategy in (("in_process", in_process), ("forwarding", forwarding)):
        strategy.set_global_arrays(INITIAL)
        results[name] = strategy.aggregate_train(1, replies)[1]
    m_in, m_fw = results["in_process"], results["forwarding"]
    for key in COMPARED:
        assert m_fw[f"fedaudit.{key}"] == m_in[f"fedaudit.{key}"], key
    assert m_fw["fedaudit.scores"] == pytest.approx(m_in["fedaudit.scores"], rel=1e-9)
    # both count the noise as sampling error: the small clean node 104 is not flagged
    assert m_fw["fedaudit.flags"] == [0, 0, 0, 0, 0, 1]
    assert forwarding.rounds[-1]["audit"] is not None


def test_late_and_missing_nodes_and_an_undecided_round(
    coordinator: CoordinatorProcess, tmp_path: Path, closing: ExitStack
):
    s = FedAuditStrategy(
        FedAvg(),
        report_path=tmp_path / "report.json",
        coordinator=connection(coordinator, "comings-and-goings", rounds=10),
    )
    closing.callback(s.close)
    s.set_global_arrays(INITIAL)
    arrays, metrics = s.aggregate_train(1, [reply(node, 1) for node in NODES])
    assert metrics["fedaudit.node_ids"] == list(NODES)

    # Round 2: node 103 does not reply, node 106 appears. 106 joins now and is audited from
    # round 3 (the coordinator's round 1 opened without it); the round closes without 103.
    s.set_global_arrays(model(arrays))
    replies = [reply(node, 2) for node in (100, 101, 102, 104, 105, 106)]
    arrays, metrics = s.aggregate_train(2, replies)
    assert metrics["fedaudit.node_ids"] == [100, 101, 102, 104, 105]
    assert metrics["fedaudit.decided"] == 1
    assert metrics["fedaudit.status"] == [0, 0, 0, 0, 2]
    entry = s.rounds[-1]
    assert [row["node_id"] for row in entry["coordinator"]["left_out"]] == [106]
    assert entry["coordinator"]["state_reason"] == (
        "closed by the admin: Flower round 2: node(s) [103] did not reply"
    )

    # Round 3: all seven, 106 included
    s.set_global_arrays(model(arrays))
    arrays, metrics = s.aggregate_train(3, [reply(n, 3) for n in (*NODES, 106)])
    assert metrics["fedaudit.node_ids"] == [*NODES, 106]
    assert metrics["fedaudit.flags"] == [0, 0, 0, 0, 0, 1, 0]

    # Round 4: three nodes without spreads: the evidence cannot decide. The round's model is the
    # coordinator's aggregate: the audit's rule has no noisy set without a decision and falls
    # back to FedAvg (sample-weighted, capped at 4 / K), here 1/3 each.
    s.set_global_arrays(model(arrays))
    replies = [reply(n, 4, spreads=False) for n in (100, 101, NOISY_NODE)]
    arrays, metrics = s.aggregate_train(4, replies)
    assert (metrics["fedaudit.decided"], metrics["fedaudit.applied"]) == (0, 1)
    assert metrics["fedaudit.flags"] == [-1, -1, -1]
    assert metrics["fedaudit.weights"] == pytest.approx([1 / 3] * 3)
    np.testing.assert_allclose(w(arrays), [(1.04 * 2 + 7.0) / 3] * 2, rtol=1e-6)
    entry = s.rounds[-1]
    assert entry["applied"] == "coordinator"
    assert "the coordinator's aggregate is used" in entry["reason"]
    assert entry["audit"]["aggregation"]["fallback_reason"].startswith(
        "primary detector 'evidence' undetermined"
    )
    assert s.statuses[str(NOISY_NODE)] == "noisy"  # an undecided round changes no status

    # Round 5: a reply without signals: not forwarded, FedAvg's aggregate kept; the
    # coordinator's round stays open
    s.set_global_arrays(model(arrays))
    replies = [reply(n, 5) for n in NODES[:5]] + [reply(NOISY_NODE, 5, signals=False)]
    kept, metrics = s.aggregate_train(5, replies)
    assert metrics["fedaudit.decided"] == 0
    assert s.rounds[-1]["audited"] is False
    assert "sent no 'fedaudit.signals' ConfigRecord" in s.rounds[-1]["reason"]
    np.testing.assert_allclose(w(kept), [(5 * 1.05 + 7.0) / 6] * 2, rtol=1e-6)
    # Round 6 goes to that open round, audited against the coordinator's model: the entry says
    # the Flower global model (FedAvg's of round 5) is not the one the coordinator audited
    s.set_global_arrays(model(kept))
    _, metrics = s.aggregate_train(6, [reply(n, 6) for n in NODES])
    assert metrics["fedaudit.decided"] == 1
    assert s.rounds[-1]["coordinator"]["round_index"] == 4
    assert s.rounds[-1]["coordinator"]["global_model_matches"] is False


def test_a_refusal_is_the_sdks_typed_error(coordinator: CoordinatorProcess, closing: ExitStack):
    # The coordinator requires every site's training loss; this reply has none.
    s = FedAuditStrategy(FedAvg(), coordinator=connection(coordinator, "refused"))
    closing.callback(s.close)
    s.set_global_arrays(INITIAL)
    replies = [reply(node, 1, train_loss=None) for node in NODES]
    with pytest.raises(UnprocessableEntityError) as refused:
        s.aggregate_train(1, replies)
    assert "train_loss" in str(refused.value)
    assert "the update of node 100 (Flower round 1, coordinator round 0)" in str(
        refused.value.__notes__
    )

    wrong = CoordinatorConnection(coordinator.url, "not-the-admin-token", sdk_options={})
    s = FedAuditStrategy(FedAvg(), coordinator=wrong)
    closing.callback(s.close)
    s.set_global_arrays(INITIAL)
    with pytest.raises(AuthenticationError):
        s.aggregate_train(1, [reply(node, 1) for node in NODES])


def test_the_connection_checks_its_values():
    with pytest.raises(ValueError, match="rounds"):
        CoordinatorConnection("http://127.0.0.1:1", "token", rounds=0)
    with pytest.raises(ValueError, match="admin_token"):
        CoordinatorConnection("http://127.0.0.1:1", "")
    assert "token" not in repr(CoordinatorConnection("http://127.0.0.1:1", "secret-token"))
    with pytest.raises(TypeError, match="coordinator"):
        FedAuditStrategy(coordinator="http://127.0.0.1:1")  # type: ignore[arg-type]


def test_the_implied_input_shape_is_the_first_weights() -> None:
    # a linear layer first ([out, in]; its bias and a counter skipped): (in,)
    linear = array_record(
        {
            "counter": np.array([3], dtype=np.int64),
            "0.weight": np.zeros((32, 64), dtype=np.float32),
            "0.bias": np.zeros(32, dtype=np.float32),
        }
    )
    assert implied_input_shape(linear) == (64,)
    # a convolution first ([out, in, kh, kw]): (in, kh, kw)
    conv = array_record({"conv.weight": np.zeros((16, 3, 5, 5), dtype=np.float32)})
    assert implied_input_shape(conv) == (3, 5, 5)
    # only vectors: (1,)
    assert implied_input_shape(array_record({"b": np.zeros(4, dtype=np.float32)})) == (1,)
