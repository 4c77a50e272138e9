"""Deep validation of a federation spec (issue 20, point 4): typed hyper-parameters per recipe
and a positive input shape, refused with the field named (422 problem+json) and nothing stored."""

from __future__ import annotations

import inspect
import re
from typing import Any

import httpx
import pytest

from client_sdk.recipes import RECIPES as SDK_RECIPES
from client_sdk.recipes import hyperparameters as sdk_hyperparameters
from service.coordinator.federation_config import RECIPES
from service.coordinator.hyperparameters import HYPERPARAMETERS, hyperparameter_errors
from tests.factories import ADMIN, federation_spec

PROBLEM = "application/problem+json"


def spec_with(config: dict[str, Any] | None = None, **task: Any) -> dict[str, Any]:
    spec = federation_spec(config=config)
    spec["task"].update(task)
    return spec


async def create(api: httpx.AsyncClient, spec: dict[str, Any]) -> httpx.Response:
    return await api.post("/api/v1/federations", json=spec, headers=ADMIN)


async def assert_refused(
    api: httpx.AsyncClient, spec: dict[str, Any], locs: list[list[object]]
) -> dict:
    response = await create(api, spec)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict = response.json()
    assert body["type"] == "/problems/validation-error"
    assert [e["loc"] for e in body["errors"]] == locs
    assert (await api.get("/api/v1/federations", headers=ADMIN)).json()["total"] == 0
    return body


@pytest.mark.anyio
@pytest.mark.db
async def test_the_issue_examples_are_refused_with_the_field_named(api: httpx.AsyncClient) -> None:
    hp = ["body", "config", "hyperparameters"]
    body = await assert_refused(
        api,
        spec_with({"method": "fedavg", "hyperparameters": {"lr": "abc", "local_epochs": -3}}),
        [[*hp, "lr"], [*hp, "local_epochs"]],
    )
    assert body["detail"].startswith("hyperparameters.lr: Input should be a valid number")
    assert "greater than or equal to 1" in body["errors"][1]["msg"]
    await assert_refused(
        api,
        spec_with(input_shape=[-1, 0]),
        [["body", "task", "input_shape", 0], ["body", "task", "input_shape", 1]],
    )


@pytest.mark.anyio
@pytest.mark.db
@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"method": "fedavg", "hyperparameters": {"lr": 0}}, "lr"),
        ({"method": "fedavg", "hyperparameters": {"lr": True}}, "lr"),
        ({"method": "fedavg", "hyperparameters": {"lr": "0.01"}}, "lr"),
        ({"method": "fedavg", "hyperparameters": {"momentum": 1.5}}, "momentum"),
        ({"method": "fedavg", "hyperparameters": {"optimizer": "rmsprop"}}, "optimizer"),
        ({"method": "fedavg", "hyperparameters": {"local_epochs": 2.5}}, "local_epochs"),
        ({"method": "fedavg", "hyperparameters": {"local_epochs": 10**6}}, "local_epochs"),
        ({"method": "fedavg", "hyperparameters": {"batch_size": 0}}, "batch_size"),
        ({"method": "fedavg", "hyperparameters": {"max_grad_norm": -1}}, "max_grad_norm"),
        ({"method": "fedavg", "hyperparameters": {"learning_rate": 0.1}}, "learning_rate"),
        ({"method": "fedprox", "hyperparameters": {"mu": -0.1}}, "mu"),
        ({"method": "fednoro", "hyperparameters": {"kd_weight_max": 2}}, "kd_weight_max"),
        ({"method": "fedrn", "hyperparameters": {"head_name": ""}}, "head_name"),
        (
            {"method": "fedncl", "hyperparameters": {"confidence_inclusive": 1}},
            "confidence_inclusive",
        ),
        ({"method": "rofl", "hyperparameters": {"forget_rate": 1.0}}, "forget_rate"),
        ({"method": "flr", "hyperparameters": {"clamp": 0}}, "clamp"),
        # a key of another recipe: flr's warm-up means nothing to fedavg
        ({"method": "fedavg", "hyperparameters": {"warmup_rounds": 3}}, "warmup_rounds"),
        # the recipe override decides which keys are read
        (
            {"method": "fedavg", "recipe": "fedprox", "hyperparameters": {"kd_temperature": 1}},
            "kd_temperature",
        ),
    ],
)
async def test_a_wrong_hyperparameter_is_refused(
    api: httpx.AsyncClient, config: dict[str, Any], key: str
) -> None:
    await assert_refused(api, spec_with(config), [["body", "config", "hyperparameters", key]])


@pytest.mark.anyio
@pytest.mark.db
async def test_an_input_shape_too_large_per_sample_is_refused(api: httpx.AsyncClient) -> None:
    await assert_refused(
        api, spec_with(input_shape=[65536, 65536]), [["body", "task", "input_shape"]]
    )


@pytest.mark.anyio
@pytest.mark.db
async def test_valid_hyperparameters_are_stored_as_given(api: httpx.AsyncClient) -> None:
    config = {
        "method": "fedprox",
        "hyperparameters": {"lr": 1, "mu": 0.1, "local_epochs": 3, "max_grad_norm": None},
    }
    response = await create(api, spec_with(config, input_shape=[3, 32, 32]))
    assert response.status_code == 201, response.text
    stored = response.json()["config"]["hyperparameters"]
    assert stored == {
        "optimizer": "sgd",
        "lr": 1,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "local_epochs": 3,
        "batch_size": 32,
        "max_grad_norm": None,
        "mu": 0.1,
    }
    assert response.json()["task"]["input_shape"] == [3, 32, 32]


def test_every_recipe_has_its_hyperparameters() -> None:
    assert set(HYPERPARAMETERS) == set(RECIPES) == set(SDK_RECIPES)


@pytest.mark.parametrize("recipe", sorted(HYPERPARAMETERS))
def test_the_sdk_reads_every_key_the_coordinator_accepts(recipe: str) -> None:
    """Each key of the coordinator's model is read by name in the SDK's recipe or its shared
    training configuration, so the two lists cannot drift apart unnoticed."""
    source = inspect.getsource(sdk_hyperparameters.TrainingConfig) + inspect.getsource(
        inspect.getmodule(type(SDK_RECIPES[recipe]))  # type: ignore[arg-type]
    )
    read = set(re.findall(r'hp\.get_\w+\(\s*"(\w+)"', source))
    assert set(HYPERPARAMETERS[recipe].model_fields) == read


def test_defaults_are_valid_for_every_recipe() -> None:
    for recipe in HYPERPARAMETERS:
        assert hyperparameter_errors(recipe, {}) == []
