"""The simulator's data preparation, evaluation and audit parsing (preparation.py,
round_records.py, federation.py), no processes."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from client_sdk import APIStatusError, ProblemDetails
from client_sdk._responses import AuditRecord
from client_sdk.participant import state_to_bytes
from fedaudit_sim.datasets import Dataset, DataSplit
from fedaudit_sim.federation import Federation, create_federation
from fedaudit_sim.preparation import (
    ModelScores,
    client_names,
    evaluate_state,
    per_class_losses,
    prepare_data,
)
from fedaudit_sim.round_records import ClientRound, round_record
from fedaudit_sim.scenario import MethodSpec, ScenarioError, validate_scenario

SCENARIO = {
    "dataset": "wine",
    "clients": 6,
    "partition": {"method": "dirichlet", "params": {"beta": 0.5}},
    "noise": {"protocol": "rho_range", "params": {"rho": 0.5, "lo": 0.5, "hi": 0.7}},
}


def test_same_seed_same_partition_noise_and_model():
    scenario = validate_scenario(SCENARIO)
    first, second = prepare_data(scenario, 3), prepare_data(scenario, 3)
    assert len(first.client_indices) == 6
    for a, b in zip(first.client_indices, second.client_indices, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first.noise.noisy_labels, second.noise.noisy_labels)
    np.testing.assert_array_equal(first.noise.realised_rates, second.noise.realised_rates)
    np.testing.assert_array_equal(first.split.test.y, second.split.test.y)
    assert first.initial_state == second.initial_state
    assert first.federation_seed == second.federation_seed


def test_another_seed_changes_partition_noise_and_model():
    scenario = validate_scenario(SCENARIO)
    first, other = prepare_data(scenario, 3), prepare_data(scenario, 4)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(first.client_indices, other.client_indices, strict=True)
    )
    assert first.initial_state != other.initial_state
    assert first.federation_seed != other.federation_seed


def test_realised_noise_is_recorded_per_client():
    data = prepare_data(validate_scenario(SCENARIO), 0)
    noise = data.noise
    # rho_range(rho=0.5) on 6 clients: exactly floor(0.5 * 6) = 3 noisy clients.
    assert int(noise.noisy_clients.sum()) == 3
    for k, idx in enumerate(data.client_indices):
        truth = data.split.train.y[idx]
        noisy = noise.noisy_labels[idx]
        # The realised rate is the fraction of the client's labels that changed.
        assert noise.realised_rates[k] == pytest.approx(float(np.mean(truth != noisy)))
        local = data.local_data(k)
        np.testing.assert_array_equal(local.labels.numpy(), noisy)
        assert local.true_labels is not None
        np.testing.assert_array_equal(local.true_labels.numpy(), truth)
        assert data.class_counts(k) == np.bincount(noisy, minlength=3).tolist()
        if noise.noisy_clients[k]:
            assert 0.4 < noise.realised_rates[k] <= 0.7
        else:
            assert noise.realised_rates[k] == 0.0


def test_exact_noisy_count_gives_exactly_that_many_truly_noisy_clients():
    scenario = validate_scenario(
        {**SCENARIO, "noise": {"protocol": "rho_range", "params": {"noisy_clients": 2}}}
    )
    for seed in (0, 1):
        noise = prepare_data(scenario, seed).noise
        assert int(noise.noisy_clients.sum()) == 2
        assert int(np.sum(noise.target_rates > 0)) == 2


def test_asymmetric_target_without_realised_flips_is_clean_in_the_truth():
    # wine, 6 clients, every client noisy by target (uniform_all 0.5), but the map flips only
    # class 0 -> 1. With k_classes(k=1) each client holds one class: the clients without
    # class 0 realise no flip and are clean; the class-0 holders flip half their labels.
    scenario = validate_scenario(
        {
            **SCENARIO,
            "partition": {"method": "k_classes", "params": {"k": 1}},
            "noise": {
                "protocol": "uniform_all",
                "params": {"eps": 0.5},
                "flip": "asymmetric",
                "class_map": {0: 1},
            },
        }
    )
    data = prepare_data(scenario, 0)
    y = data.split.train.y
    holds_zero = [bool(np.any(y[idx] == 0)) for idx in data.client_indices]
    assert 0 < sum(holds_zero) < 6
    assert data.noise.target_rates.tolist() == [0.5] * 6
    assert data.noise.noisy_clients.tolist() == holds_zero
    for k, zero in enumerate(holds_zero):
        assert (data.noise.realised_rates[k] > 0) == zero


def test_default_model_follows_the_data_kind():
    assert prepare_data(validate_scenario(SCENARIO), 0).model_name == "mlp"
    digits = prepare_data(validate_scenario({**SCENARIO, "dataset": "digits"}), 0)
    assert digits.model_name == "cnn"
    model = digits.build_model()
    assert state_to_bytes(model) == digits.initial_state


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"clients": 500}, "partition: num_clients=500 exceeds"),
        ({"model": {"name": "cnn"}}, "model: model 'cnn' needs an image input_shape"),
        ({"model": {"params": {"width": 3}}}, "model: model 'mlp' has no option(s) ['width']"),
        (
            {"noise": {"protocol": "uniform_all", "flip": "asymmetric", "class_map": {0: 7}}},
            "noise: class_map entry 0->7 is outside [0, 3)",
        ),
    ],
)
def test_settings_that_do_not_fit_the_data_are_scenario_errors(change, expected):
    scenario = validate_scenario({**SCENARIO, **change})
    with pytest.raises(ScenarioError) as info:
        prepare_data(scenario, 0)
    assert expected in str(info.value)


def test_missing_file_dataset_is_a_scenario_error(tmp_path):
    scenario = validate_scenario({**SCENARIO, "dataset": "mnist", "data_dir": str(tmp_path)})
    with pytest.raises(ScenarioError, match="dataset 'mnist': data file .* not found"):
        prepare_data(scenario, 0)


def test_client_names_sort_in_index_order():
    assert client_names(3) == ["client-00", "client-01", "client-02"]
    names = client_names(120)
    assert names[0] == "client-000"
    assert names[-1] == "client-119"
    assert sorted(names) == names


def _split(x_test, y_test, num_classes=3) -> DataSplit:
    def make(x: np.ndarray, y: list[int]) -> Dataset:
        return Dataset(
            name="toy",
            x=np.asarray(x, dtype=np.float32),
            y=np.asarray(y, dtype=np.int64),
            num_classes=num_classes,
            input_shape=(num_classes,),
            class_names=tuple(str(c) for c in range(num_classes)),
            kind="tabular",
        )

    return DataSplit(train=make(x_test, y_test), test=make(x_test, y_test))


def test_evaluate_state_by_hand():
    # An identity linear model predicts argmax(x). Inputs are one-hot for classes
    # 0, 1, 2, 2, 0 with true labels 0, 1, 1, 2, 2: predictions right on samples 0, 1 and 3.
    model = nn.Linear(3, 3)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))
        model.bias.zero_()
    state = state_to_bytes(model)
    eye = np.eye(3)
    split = _split(eye[[0, 1, 2, 2, 0]], [0, 1, 1, 2, 2])
    other = nn.Linear(3, 3)  # evaluation loads the state into whatever model it is given
    acc, bal, recall = evaluate_state(other, state, split)
    assert acc == pytest.approx(3 / 5)
    # Per-class recall: class 0 1/1, class 1 1/2, class 2 1/2: mean 2/3.
    assert recall == [1.0, 0.5, 0.5]
    assert bal == pytest.approx(2 / 3)
    assert not other.training


def test_per_class_losses_by_hand():
    # Zero weights: every logit is 0, so every sample's cross-entropy is log(3); a class the
    # client does not hold gets None.
    model = nn.Linear(3, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    split = _split(np.eye(3)[[0, 1, 1]], [0, 1, 1])
    data = SimpleNamespace(
        split=split,
        client_indices=[np.array([0, 1]), np.array([2])],
        local_data=lambda k: SimpleNamespace(
            inputs=torch.from_numpy(split.train.x[[[0, 1], [2]][k]]),
            labels=torch.from_numpy(split.train.y[[[0, 1], [2]][k]]),
        ),
    )
    losses = per_class_losses(model, state_to_bytes(model), data)  # type: ignore[arg-type]
    log3 = float(np.log(3.0))
    assert losses[0] == [pytest.approx(log3), pytest.approx(log3), None]
    assert losses[1] == [None, pytest.approx(log3), None]


def _summary(precision: float | None = None) -> SimpleNamespace:
    metrics = {} if precision is None else {"label_precision": precision, "label_recall": 1.0}
    return SimpleNamespace(
        train_loss=0.3,
        train_seconds=0.2,
        signal_seconds=0.01,
        upload_bytes=10,
        download_bytes=20,
        metrics=metrics,
    )


def test_round_record_maps_the_stored_audit_by_client_id():
    names = ["client-00", "client-01", "client-02"]
    ids = {name: str(uuid.UUID(int=i + 1)) for i, name in enumerate(names)}
    fed = Federation(
        spec=MethodSpec(method="fednoro"),
        federation_id="f",
        config={"warmup_rounds": 1},
        names=names,
        ids=ids,
        participants=[],
        eval_model=nn.Linear(1, 1),
        started=0.0,
    )
    # The coordinator orders the audit by client name or id, not by our index: here 2, 0, 1.
    order = [ids["client-02"], ids["client-00"], ids["client-01"]]
    audit = {
        "client_ids": order,
        "primary": "fednoro",
        "primary_flags": [True, False, None],
        "in_warmup": False,
        "detections": {
            "fednoro": {
                "method": "fednoro",
                "status": "ok",
                "reason": None,
                "summary": {"ashman_d": 4.5},
                "verdicts": [
                    {
                        "score": 3.2,
                        "probability": 0.95,
                        "flag": True,
                        "evidence": {"gmm_noisy_probability": 0.95, "normalised_loss": [1.0]},
                    },
                    {
                        "score": -0.4,
                        "probability": 0.05,
                        "flag": False,
                        "evidence": {"gmm_noisy_probability": 0.05, "normalised_loss": [0.0]},
                    },
                    {
                        "score": 0.1,
                        "probability": 0.1,
                        "flag": False,
                        "evidence": {"gmm_noisy_probability": 0.1, "normalised_loss": [0.2]},
                    },
                ],
            },
            "fedncl": {
                "method": "fedncl",
                "status": "undetermined",
                "reason": "too few",
                "verdicts": [None] * 3,
            },
        },
        "expertise": [0.1, 1.0, 0.7],
        "neighbors": {ids["client-00"]: [{"client_id": ids["client-01"], "weight": 0.4}]},
        "self_weights": {ids["client-00"]: 0.6},
        "aggregation": {"rule": "daagg", "weights": [0.1, 0.5, 0.4], "fallback_reason": None},
    }
    info = SimpleNamespace(
        audit=AuditRecord.model_validate(audit), coordinator_seconds=0.25, aggregation_rule="daagg"
    )
    trained = (
        1.5,
        [
            ClientRound(role="clean", summary=_summary()),
            ClientRound(role="clean", summary=_summary(0.9)),
            ClientRound(role="noisy", summary=_summary()),
        ],
    )
    scores = ModelScores(0.8, 0.7, [0.9, None, 0.5])
    record = round_record(fed, 4, info, {"client-02": "suspect"}, scores, trained)
    by_name = {c.name: c for c in record.clients}
    c0, c1, c2 = by_name["client-00"], by_name["client-01"], by_name["client-02"]
    assert (c0.primary_flag, c1.primary_flag, c2.primary_flag) == (False, None, True)
    assert (c0.weight, c1.weight, c2.weight) == (0.5, 0.4, 0.1)
    assert (c0.expertise, c1.expertise, c2.expertise) == (1.0, 0.7, 0.1)
    assert c2.detectors["fednoro"]["noisiness"] == 3.2
    assert c2.detectors["fednoro"]["posterior"] == 0.95
    assert c1.detectors["fednoro"]["noisiness"] == 0.1
    assert c2.detectors["fednoro"]["flag"] is True
    assert c2.normalised_loss == [1.0]
    assert c1.detectors["fedncl"] == {
        "status": "undetermined",
        "score": None,
        "flag": None,
        "noisiness": None,
    }
    assert c0.neighbors == ["client-01"]
    assert c0.self_weight == 0.6
    assert c1.neighbors is None
    assert (c2.status, c0.status) == ("suspect", None)
    assert (c2.role, c1.label_precision, c0.label_precision) == ("noisy", 0.9, None)
    assert (record.index, record.accuracy, record.balanced_accuracy) == (4, 0.8, 0.7)
    assert record.class_recall == [0.9, None, 0.5]
    assert (record.coordinator_seconds, record.ashman_d, record.wall_seconds) == (0.25, 4.5, 1.5)
    assert record.detector_status == {"fednoro": "ok", "fedncl": "undetermined"}


def test_a_refused_method_configuration_is_a_scenario_error_with_the_problem():
    problem = ProblemDetails(
        status=422, detail="invalid configuration", errors=[{"loc": ["config", "aggregation"]}]
    )
    response = httpx.Response(422, request=httpx.Request("POST", "http://test/federations"))

    class RefusingAdmin:
        def create_federation(self, body):
            raise APIStatusError("422", response=response, problem=problem)

    data = prepare_data(validate_scenario(SCENARIO), 0)
    with httpx.Client() as http, pytest.raises(ScenarioError) as info:
        create_federation(
            RefusingAdmin(),  # type: ignore[arg-type]
            http,
            data,
            MethodSpec(method="fedavg", aggregation="nope"),
            client_names(6),
        )
    assert str(info.value) == (
        "method 'fedavg': the coordinator refused the configuration: invalid configuration "
        "[{'loc': ['config', 'aggregation']}]"
    )
