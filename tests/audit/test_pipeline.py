"""run_audit, AuditConfig and AuditOutcome (the coordinator's entry point)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from service.audit import (
    AGGREGATION_RULES,
    AggregationSettings,
    AuditConfig,
    ClientRoundData,
    DictStateReader,
    FedNCLSettings,
    FedNoRoSettings,
    FedRNSettings,
    InvalidInputError,
    InvalidParameterError,
    StatusHistory,
    run_audit,
)
from tests.audit._readers import RecordingReader, present

N_CLASSES = 4
NOISY = (0, 1, 2)


def make_federation(
    n_clients: int = 10, seed: int = 0, *, with_centroids: bool = True
) -> tuple[DictStateReader, list[ClientRoundData]]:
    """Clients 0-2 are noisy: high per-class loss, far-off models, low accuracy."""
    rng = np.random.default_rng(seed)
    global_tensors: dict[str, np.ndarray] = {
        "w": rng.normal(size=(3, 2)).astype(np.float32),
        "b": np.zeros(2, dtype=np.float32),
        "n": np.array(5, dtype=np.int64),
    }
    clients: list[ClientRoundData] = []
    for k in range(n_clients):
        noisy = k in NOISY
        tensors: dict[str, np.ndarray] = {
            "w": (
                global_tensors["w"] + rng.normal(scale=2.0 if noisy else 0.1, size=(3, 2))
            ).astype(np.float32),
            "b": rng.normal(scale=0.1, size=2).astype(np.float32),
            "n": np.array(5 + k, dtype=np.int64),
        }
        clients.append(
            ClientRoundData(
                client_id=f"c{k}",
                num_samples=100 + k,
                class_counts=[25] * N_CLASSES,
                per_class_loss=rng.normal(0.5, 0.02, N_CLASSES) + (1.5 if noisy else 0.0),
                train_loss=0.5 + (1.0 if noisy else 0.0),
                train_accuracy=0.5 if noisy else 0.9,
                probe_softmax=rng.dirichlet(np.ones(N_CLASSES), size=2),
                centroids=rng.normal(size=(N_CLASSES, 3)) if with_centroids else None,
                state=DictStateReader(tensors),
            )
        )
    return DictStateReader(global_tensors), clients


def flagged_before(n_clients: int = 10) -> list[StatusHistory]:
    """Clients 0-2 were flagged in the previous round: a second flag makes them noisy."""
    return [
        StatusHistory(status="suspect" if k in NOISY else "trusted", flags=[k in NOISY])
        for k in range(n_clients)
    ]


class TestRunAudit:
    def test_full_audit(self):
        global_state, clients = make_federation()
        outcome = run_audit(global_state, clients, AuditConfig(), round_index=3)
        assert set(outcome.detections) == {"fednoro", "fedncl", "expertise", "evidence"}
        # the calibrated evidence is the primary detector by default
        assert outcome.primary == "evidence"
        assert outcome.primary_flags == [k in NOISY for k in range(10)]
        assert outcome.detections["fedncl"].status == "ok"
        # expertise: accuracies 0.5 / 0.9 -> 0 / 1
        assert outcome.expertise == [0.0] * 3 + [1.0] * 7
        assert outcome.client_ids == [f"c{k}" for k in range(10)]
        assert set(present(outcome.neighbors)) == set(outcome.client_ids)
        for cid, neighbors in present(outcome.neighbors).items():
            assert len(neighbors) == 2
            assert cid not in [n["client_id"] for n in neighbors]
            total = present(outcome.self_weights)[cid] + sum(n["weight"] for n in neighbors)
            assert total == pytest.approx(1.0)
        assert outcome.aggregation.rule == "fedavg"
        assert outcome.aggregation.weights.sum() == pytest.approx(1.0)
        assert present(outcome.centroids).shape == (N_CLASSES, 3)
        assert present(outcome.centroid_weights).shape == (10, N_CLASSES)

    def test_outcome_json_has_no_state_and_no_nan(self):
        global_state, clients = make_federation()
        outcome = run_audit(global_state, clients, AuditConfig(aggregation="daagg"), round_index=0)
        text = json.dumps(outcome.to_json(), allow_nan=False)
        decoded = json.loads(text)
        assert "state" not in decoded["aggregation"]
        assert decoded["aggregation"]["rule"] == "daagg"
        assert decoded["detections"]["fednoro"]["verdicts"][0]["flag"] is True
        assert decoded["neighbors"]["c3"][0].keys() == {"client_id", "weight"}

    @pytest.mark.parametrize("rule", AGGREGATION_RULES)
    def test_every_rule_runs_with_flags(self, rule):
        global_state, clients = make_federation()
        outcome = run_audit(
            global_state,
            clients,
            # reliability weighting reads FedNoRo's probabilities: FedNoRo must be primary
            AuditConfig(
                aggregation=rule,
                primary_detector="fednoro" if rule == "reliability_weighted" else "evidence",
            ),
            round_index=40,
            status_history=flagged_before(),
        )
        assert outcome.aggregation.rule == rule
        assert outcome.aggregation.fallback_reason is None
        for name in ("w", "b", "n"):
            assert outcome.aggregation.state[name].dtype == global_state.get(name).dtype
        if rule in ("daagg", "fedncl_layerwise", "reliability_weighted"):
            # the noisy clients get less than FedAvg would give them
            fedavg = np.arange(100, 110) / np.arange(100, 110).sum()
            assert (outcome.aggregation.weights[:3] < fedavg[:3]).all()
        if rule in ("daagg", "fedncl_layerwise"):
            assert outcome.aggregation_flags == [k in NOISY for k in range(10)]
        else:
            assert outcome.aggregation_flags is None

    def test_reliability_weighting_reads_the_probability_not_the_graded_score(self):
        global_state, clients = make_federation()
        outcome = run_audit(
            global_state,
            clients,
            AuditConfig(aggregation="reliability_weighted", primary_detector="fednoro"),
            round_index=5,
        )
        fednoro = outcome.detections["fednoro"]
        scores = np.asarray(fednoro.scores, dtype=np.float64)
        probability = np.asarray(fednoro.probabilities, dtype=np.float64)
        # the score is the class-standardised excess: below 0 for the clean clients, so it
        # could not serve as a probability
        assert (scores[3:] < 0).all()
        assert (scores[:3] > 0).all()
        assert ((probability >= 0) & (probability <= 1)).all()
        n = np.arange(100, 110)
        expected = n * (1 - probability) / (n * (1 - probability)).sum()
        np.testing.assert_allclose(outcome.aggregation.weights, expected, rtol=1e-12)

    def test_config_reaches_the_rules(self):
        global_state, clients = make_federation()
        config = AuditConfig(
            aggregation="fedncl_layerwise", fedncl=FedNCLSettings(tau=4.0, t_corr=10)
        )
        history = flagged_before()
        outcome = run_audit(global_state, clients, config, round_index=1, status_history=history)
        # t_k defaults to t_corr = 10; T = 2: clip(4 * 2 / 10 = 0.8, 1, 4) = 1
        assert outcome.aggregation.details["penalty"][:3] == [1.0, 1.0, 1.0]
        outcome = run_audit(
            global_state,
            clients,
            dataclasses.replace(config, fedncl=dataclasses.replace(config.fedncl, t_k=2)),
            round_index=1,
            status_history=history,
        )
        # t_k = 2 overrides t_corr: clip(4 * 2 / 2, 1, 4) = 4
        assert outcome.aggregation.details["penalty"][:3] == [4.0, 4.0, 4.0]
        trimmed = run_audit(
            global_state,
            clients,
            AuditConfig(
                aggregation="trimmed_mean",
                aggregation_settings=AggregationSettings(trim_fraction=0.2),
            ),
            round_index=0,
        )
        assert trimmed.aggregation.details["trimmed_per_side"] == 2
        daagg = run_audit(
            global_state,
            clients,
            AuditConfig(
                aggregation="daagg",
                aggregation_settings=AggregationSettings(daagg_variant="reference"),
            ),
            round_index=0,
        )
        assert daagg.aggregation.details["variant"] == "reference"

    def test_undetermined_primary_falls_back_to_fedavg(self):
        global_state, clients = make_federation(n_clients=3)
        outcome = run_audit(global_state, clients, AuditConfig(aggregation="daagg"), round_index=0)
        assert outcome.detections["evidence"].status == "undetermined"
        assert outcome.primary_flags == [None, None, None]
        assert outcome.aggregation.rule == "fedavg"
        assert outcome.aggregation.requested_rule == "daagg"
        assert present(outcome.aggregation.fallback_reason).startswith(
            "primary detector 'evidence' undetermined (3 sites reported"
        )
        json.dumps(outcome.to_json(), allow_nan=False)

    def test_fedncl_primary(self):
        global_state, clients = make_federation()
        config = AuditConfig(
            detectors=("fedncl",), primary_detector="fedncl", aggregation="fedncl_layerwise"
        )
        outcome = run_audit(global_state, clients, config, round_index=10)
        assert list(outcome.detections) == ["fedncl"]
        flags = outcome.primary_flags
        assert all(isinstance(f, bool) for f in flags)
        assert outcome.expertise is None
        assert outcome.aggregation.rule == "fedncl_layerwise"

    def test_present_detectors_run_beside_a_fedncl_primary(self):
        global_state, clients = make_federation()
        config = AuditConfig(primary_detector="fedncl")
        outcome = run_audit(global_state, clients, config, round_index=0)
        assert list(outcome.detections) == ["fednoro", "fedncl", "expertise", "evidence"]
        assert outcome.primary == "fedncl"
        assert outcome.primary_flags == outcome.detections["fedncl"].flags
        without_losses = [dataclasses.replace(c, per_class_loss=None) for c in clients]
        outcome = run_audit(global_state, without_losses, config, round_index=0)
        assert list(outcome.detections) == ["fedncl", "expertise"]

    def test_fedncl_too_few_clients_reads_no_state(self):
        log: list[tuple[str, str]] = []
        global_state, clients = make_federation(n_clients=2)
        recorded = [
            dataclasses.replace(
                c,
                state=RecordingReader(
                    {n: c.state.get(n) for n in c.state.keys()}, c.client_id, log
                ),
            )
            for c in clients
        ]
        config = AuditConfig(detectors=("fedncl",), primary_detector="fedncl")
        outcome = run_audit(global_state, recorded, config, round_index=0)
        assert outcome.detections["fedncl"].status == "undetermined"
        # only the aggregation read the states: one read per client tensor
        assert len(log) == 2 * 3

    def test_missing_inputs_make_a_detector_undetermined(self):
        global_state, clients = make_federation()
        clients[2] = dataclasses.replace(clients[2], per_class_loss=None, train_accuracy=None)
        outcome = run_audit(global_state, clients, AuditConfig(aggregation="daagg"), round_index=0)
        fednoro = outcome.detections["fednoro"]
        assert fednoro.status == "undetermined"
        assert fednoro.reason == "no per_class_loss from client(s) ['c2']"
        assert outcome.detections["expertise"].status == "undetermined"
        assert outcome.expertise is None
        assert outcome.neighbors is None
        assert outcome.self_weights is None
        assert outcome.aggregation.rule == "fedavg"
        assert "no per_class_loss" in present(outcome.aggregation.fallback_reason)

    def test_absent_detectors_are_skipped_but_primary_reported(self):
        global_state, clients = make_federation(with_centroids=False)
        clients = [
            dataclasses.replace(c, per_class_loss=None, train_loss=None, train_accuracy=None)
            for c in clients
        ]
        outcome = run_audit(global_state, clients, AuditConfig(), round_index=0)
        assert list(outcome.detections) == ["evidence"]
        assert outcome.detections["evidence"].status == "undetermined"
        assert outcome.centroids is None
        assert outcome.centroid_weights is None
        explicit = run_audit(
            global_state,
            clients,
            AuditConfig(detectors=("fednoro", "fedncl", "expertise"), primary_detector="fednoro"),
            round_index=0,
        )
        assert present(explicit.detections["fedncl"].reason).startswith("no train_loss")
        assert present(explicit.detections["expertise"].reason).startswith("no train_accuracy")

    def test_degenerate_federation_never_raises(self):
        # identical clients: every per-class column constant, every q equal
        global_tensors = {"w": np.ones(3, dtype=np.float32)}
        clients = [
            ClientRoundData(
                client_id=f"c{k}",
                num_samples=10,
                class_counts=[5, 5],
                per_class_loss=[0.3, 0.3],
                train_loss=0.2,
                train_accuracy=0.7,
                probe_softmax=[[0.5, 0.5]],
                state=DictStateReader(global_tensors),
            )
            for k in range(5)
        ]
        outcome = run_audit(
            DictStateReader(global_tensors),
            clients,
            AuditConfig(aggregation="daagg"),
            round_index=2,
        )
        # FedNoRo's mixture has nothing to split; the evidence sees five equal sites and flags
        # none of them, so DaAgg runs with an empty noisy set (every weight its FedAvg share)
        assert outcome.detections["fednoro"].status == "undetermined"
        assert outcome.detections["evidence"].flags == [False] * 5
        assert outcome.detections["fedncl"].flags == [False] * 5
        assert outcome.aggregation.rule == "daagg"
        np.testing.assert_allclose(outcome.aggregation.weights, [0.2] * 5)
        assert outcome.expertise == [1.0] * 5
        assert present(outcome.self_weights) == pytest.approx({f"c{k}": 1 / 3 for k in range(5)})
        np.testing.assert_allclose(outcome.aggregation.state["w"], np.ones(3))
        json.dumps(outcome.to_json(), allow_nan=False)

    def test_single_client(self):
        global_state, clients = make_federation(n_clients=1)
        outcome = run_audit(global_state, clients, AuditConfig(), round_index=0)
        assert outcome.primary_flags == [None]
        assert outcome.neighbors == {"c0": []}
        assert outcome.self_weights == {"c0": 1.0}
        np.testing.assert_array_equal(outcome.aggregation.state["w"], clients[0].state.get("w"))

    def test_neighbor_candidates(self):
        # A and B report this round; the candidates are B (with a stale accuracy that must
        # be ignored) and C (stored from an earlier round). A is a target only.
        # Pool: [B, C] + target-only A; accuracies A 0.9, B 0.5, C 0.7 -> Exp over {A, B, C}
        # = A 1, B 0, C 0.5. A's sims: B cos 0.707 -> 1, C 0 -> 0:
        #   R(A,B) = 0.6*0 + 0.4*1 = 0.4 > R(A,C) = 0.6*0.5 = 0.3 -> A's neighbor is B.
        # (With B's stale 0.1: Exp B 0, C 0.75, R(A,C) = 0.45 would win.)
        def client(cid: str, probe: list[float], acc: float) -> ClientRoundData:
            return ClientRoundData(
                client_id=cid,
                num_samples=10,
                class_counts=[5, 5],
                train_accuracy=acc,
                probe_softmax=[probe],
                state=DictStateReader({"w": np.zeros(1)}),
            )

        a, b, c = (
            client("A", [1.0, 0.0], 0.9),
            client("B", [0.5, 0.5], 0.5),
            client("C", [0.0, 1.0], 0.7),
        )
        stale_b = dataclasses.replace(b, train_accuracy=0.1)
        no_probe = dataclasses.replace(c, client_id="D", probe_softmax=None)
        config = AuditConfig(fedrn=FedRNSettings(k=1, chunk_size=1))
        outcome = run_audit(
            DictStateReader({"w": np.zeros(1)}),
            [a, b],
            config,
            round_index=0,
            neighbor_candidates=[stale_b, c, no_probe],
        )
        assert present(outcome.neighbors)["A"] == [
            {"client_id": "B", "weight": pytest.approx(0.4 / 1.4)}
        ]
        assert present(outcome.self_weights)["A"] == pytest.approx(1.0 / 1.4)
        # B's only candidate besides itself is C
        assert [n["client_id"] for n in present(outcome.neighbors)["B"]] == ["C"]

    def test_previous_centroids_are_used(self):
        global_state, clients = make_federation()
        previous = np.ones((N_CLASSES, 3))
        first = run_audit(global_state, clients, AuditConfig(), round_index=0)
        second = run_audit(
            global_state, clients, AuditConfig(), round_index=1, previous_centroids=previous
        )
        # first round: plain mean over the clients holding each class (all hold all)
        local = np.array([np.asarray(c.centroids, dtype=np.float64) for c in clients])
        np.testing.assert_allclose(present(first.centroids), local.mean(axis=0))
        assert not np.allclose(present(first.centroids), present(second.centroids))

    def test_centroids_from_some_clients_only(self):
        global_state, clients = make_federation()
        clients[4] = dataclasses.replace(clients[4], centroids=None)
        clients[5] = dataclasses.replace(
            clients[5], class_counts=[25, 0, 25, 25], per_class_loss=[0.5, None, 0.5, 0.5]
        )
        outcome = run_audit(global_state, clients, AuditConfig(), round_index=0)
        assert present(outcome.centroid_weights)[4].tolist() == [0.0] * N_CLASSES
        assert present(outcome.centroid_weights)[5, 1] == 0.0
        assert present(outcome.centroid_weights)[5, 0] > 0.0


class TestRunAuditValidation:
    def test_bad_config_and_round(self):
        global_state, clients = make_federation(n_clients=2)
        with pytest.raises(InvalidParameterError, match="config: expected AuditConfig"):
            run_audit(global_state, clients, {"aggregation": "fedavg"}, round_index=0)  # type: ignore[arg-type]
        with pytest.raises(InvalidParameterError, match="round_index"):
            run_audit(global_state, clients, AuditConfig(), round_index=-1)

    def test_no_clients(self):
        global_state, _ = make_federation(n_clients=1)
        with pytest.raises(InvalidInputError, match="at least one client"):
            run_audit(global_state, [], AuditConfig(), round_index=0)

    @pytest.mark.parametrize(
        ("change", "match"),
        [
            ({"client_id": "c0"}, r"clients\[1\]\.client_id: duplicate 'c0'"),
            ({"client_id": ""}, "client_id: expected a non-empty str"),
            ({"num_samples": True}, "num_samples: expected a positive int"),
            ({"num_samples": 0}, "num_samples: expected a positive int"),
            ({"class_counts": [1, 2]}, "class_counts: 2 classes, expected 4"),
            ({"per_class_loss": [0.1, 0.2]}, "per_class_loss: 2 classes, expected 4"),
            ({"train_loss": -1.0}, "train_loss: must be >= 0"),
            ({"train_accuracy": 1.5}, "train_accuracy: must be <= 1"),
            ({"probe_softmax": [0.5, 0.5]}, "probe_softmax: expected a 2-D"),
            ({"state": "weights.safetensors"}, "state: expected a StateReader"),
            ({"probe_softmax": [[0.25] * 4] * 3}, r"probe_softmax: client 'c1' has shape \(3, 4\)"),
            ({"centroids": np.zeros((4, 2))}, r"centroids: client 'c1' has shape \(4, 2\)"),
        ],
    )
    def test_malformed_client(self, change, match):
        global_state, clients = make_federation(n_clients=2)
        clients[1] = dataclasses.replace(clients[1], **change)
        with pytest.raises(InvalidInputError, match=match):
            run_audit(global_state, clients, AuditConfig(), round_index=0)

    def test_centroid_class_count(self):
        global_state, clients = make_federation(n_clients=2)
        clients = [dataclasses.replace(c, centroids=np.zeros((3, 2))) for c in clients]
        with pytest.raises(InvalidInputError, match="centroids: 3 classes, expected 4"):
            run_audit(global_state, clients, AuditConfig(), round_index=0)

    def test_not_a_client(self):
        global_state, clients = make_federation(n_clients=1)
        with pytest.raises(InvalidInputError, match=r"clients\[1\]: expected ClientRoundData"):
            run_audit(
                global_state,
                [clients[0], {"client_id": "x"}],  # type: ignore[list-item]
                AuditConfig(),
                round_index=0,
            )


class TestAuditConfig:
    def test_defaults_from_the_spec(self):
        config = AuditConfig()
        assert config.fednoro.random_states == tuple(range(9))
        assert config.fednoro.separation_threshold == 2.0
        assert config.fednoro.min_clients == 4
        assert config.fedncl.beta == 1.0
        assert config.fedncl.tau == 50.0
        assert config.fedncl.t_corr == 60
        assert config.fedncl.alpha == 0.6
        assert config.fedrn.k == 2
        assert config.fedrn.alpha == 0.6
        assert config.aggregation_settings.trim_fraction == 0.1
        assert (config.status.m, config.status.w) == (2, 3)

    def test_json_round_trip(self):
        config = AuditConfig(
            detectors=("fednoro", "expertise"),
            primary_detector="fednoro",
            aggregation="reliability_weighted",
            fednoro=FedNoRoSettings(random_states=(5, 6)),
            fedrn=FedRNSettings(chunk_size=128),
            fedncl=FedNCLSettings(t_k=7),
        )
        data = json.loads(json.dumps(config.to_json(), allow_nan=False))
        assert data["detectors"] == ["fednoro", "expertise"]
        assert (data["fednoro_random_states"], data["neighbor_chunk_size"]) == ([5, 6], 128)
        assert data["fedncl_t_k"] == 7
        assert AuditConfig.from_json(data) == config
        assert AuditConfig.from_json({}) == AuditConfig()

    def test_coercion(self):
        config = AuditConfig(
            detectors=["fednoro"],  # type: ignore[arg-type]
            primary_detector="fednoro",
            fednoro=FedNoRoSettings(random_states=[1, 2]),  # type: ignore[arg-type]
            fedncl=FedNCLSettings(beta=2),
        )
        assert config.detectors == ("fednoro",)
        assert config.fednoro.random_states == (1, 2)
        assert isinstance(config.fedncl.beta, float)

    def test_from_json_rejects_unknown_keys(self):
        with pytest.raises(
            InvalidParameterError, match=r"unknown configuration key\(s\) \['bogus'\]"
        ):
            AuditConfig.from_json({"aggregation": "median", "bogus": 1})
        with pytest.raises(InvalidParameterError, match="expected a mapping"):
            AuditConfig.from_json([("aggregation", "median")])  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"detectors": ("fednoro", "fednoro")}, "unique"),
            ({"detectors": "fednoro"}, "sequence of names"),
            ({"detectors": ("fedrn",)}, r"detectors\[0\]"),
            ({"detectors": ("fedncl",)}, "must include primary_detector 'evidence'"),
            ({"primary_detector": "expertise"}, "primary_detector"),
            ({"aggregation": "krum"}, "aggregation"),
            (
                {"aggregation": "reliability_weighted", "primary_detector": "fedncl"},
                "needs noisy probabilities",
            ),
            ({"fednoro_random_states": ()}, "fednoro_random_states"),
            ({"fednoro_random_states": (1, -2)}, r"fednoro_random_states\[1\]"),
            ({"fednoro_require_separation": "no"}, "fednoro_require_separation"),
            ({"fednoro_separation_threshold": -1.0}, "fednoro_separation_threshold"),
            ({"fednoro_min_clients": 1}, "fednoro_min_clients"),
            ({"fedncl_beta": -0.5}, "fedncl_beta"),
            ({"fedncl_two_sided": 1}, "fedncl_two_sided"),
            ({"fedncl_divergence_variant": "l2"}, "fedncl_divergence_variant"),
            ({"fedncl_loss_mode": "max"}, "fedncl_loss_mode"),
            ({"fedncl_min_clients": 1}, "fedncl_min_clients"),
            ({"fedncl_tau": 0.5}, "fedncl_tau"),
            ({"fedncl_t_corr": 0}, "fedncl_t_corr"),
            ({"fedncl_t_k": 0}, "fedncl_t_k"),
            ({"fedncl_alpha": 2.0}, "fedncl_alpha"),
            ({"fedrn_k": 0}, "fedrn_k"),
            ({"fedrn_alpha": -0.1}, "fedrn_alpha"),
            ({"fedrn_similarity": "cosine"}, "fedrn_similarity"),
            ({"neighbor_chunk_size": 0}, "neighbor_chunk_size"),
            ({"daagg_variant": "x"}, "daagg_variant"),
            ({"trim_fraction": 0.5}, "trim_fraction"),
            ({"status_w": 0}, "status_w"),
            ({"status_m": 4}, "status_m"),
        ],
    )
    def test_invalid_values(self, kwargs, match):
        with pytest.raises(InvalidParameterError, match=match):
            AuditConfig.from_flat(**kwargs)


def test_a_client_reporting_a_loss_beyond_any_model_is_named() -> None:
    global_state, clients = make_federation()
    clients[4] = dataclasses.replace(clients[4], per_class_loss=[0.5, 1e155, 0.5, 0.5])
    with pytest.raises(InvalidInputError, match=r"clients\[4\]\.per_class_loss: a value above"):
        run_audit(global_state, clients, AuditConfig(), round_index=0)
