"""An initial model that cannot fit the task is refused; it can be replaced until round 0 opens."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from service.config import Settings
from tests.api.conftest import make_federation
from tests.factories import ADMIN, auth, federation_spec, state_bytes, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

OCTET = {**ADMIN, "Content-Type": "application/octet-stream"}


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


async def create(api: httpx.AsyncClient, **spec: Any) -> str:
    response = await api.post("/api/v1/federations", json=federation_spec(**spec), headers=ADMIN)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def blobs(settings: Settings) -> list[str]:
    return sorted(p.name for p in settings.blob_dir.rglob("*") if p.is_file())


async def test_a_model_with_no_output_of_num_classes_is_refused(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    """The issue's model: 784 inputs, 2 outputs, for a 10-class task."""
    fid = await create(api, num_classes=10)
    state = {
        "fc1.weight": f32(128, 784),
        "fc1.bias": f32(128),
        "fc2.weight": f32(2, 128),
        "fc2.bias": f32(2),
    }
    response = await api.put(
        f"/api/v1/federations/{fid}/model", content=state_bytes(state), headers=OCTET
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert response.headers["content-type"].startswith("application/problem+json")
    assert problem["type"] == "/problems/invalid-model"
    assert "no tensor of the model has a dimension of 10" in problem["detail"]
    assert "fc2.weight [2, 128]" in problem["detail"]
    assert problem["errors"][0]["loc"] == ["model", "fc2.weight"]
    assert blobs(settings) == []
    federation = (await api.get(f"/api/v1/federations/{fid}", headers=ADMIN)).json()
    assert federation["status"] == "created"
    assert federation["current_model_id"] is None


async def test_legitimate_layouts_are_accepted(api: httpx.AsyncClient) -> None:
    """Buffers after the head in name order, a conv head, an [in, out] matrix, int buffers."""
    models = {
        "batchnorm-last": {
            "conv.weight": f32(16, 1, 3, 3),
            "fc.weight": f32(10, 16),
            "fc.bias": f32(10),
            "norm.running_mean": f32(16),
            "norm.running_var": f32(16),
            "norm.num_batches_tracked": np.asarray(0, dtype=np.int64),
        },
        "conv-head": {"features.weight": f32(8, 1, 3, 3), "classifier.weight": f32(10, 8, 1, 1)},
        "in-out-matrix": {"embed.weight": f32(64, 32), "W": f32(32, 10)},
    }
    for name, state in models.items():
        fid = await create(api, name=name, num_classes=10)
        response = await api.put(
            f"/api/v1/federations/{fid}/model", content=state_bytes(state), headers=OCTET
        )
        assert response.status_code == 201, (name, response.text)


async def test_a_declared_head_must_output_num_classes(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    fid = await create(
        api, num_classes=10, config={"method": "fedrn", "hyperparameters": {"head_name": "head"}}
    )
    state = {
        "body.weight": f32(10, 64),  # a dimension of 10 elsewhere: the declared head decides
        "head.weight": f32(3, 10),
        "head.bias": f32(3),
    }
    response = await api.put(
        f"/api/v1/federations/{fid}/model", content=state_bytes(state), headers=OCTET
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert [e["loc"] for e in problem["errors"]] == [
        ["model", "head.weight"],
        ["model", "head.bias"],
    ]
    assert "weight shape [3, 10]: 3 outputs, but the task has 10 classes" in problem["detail"]
    assert blobs(settings) == []
    fine = {"body.weight": f32(64, 64), "head.weight": f32(10, 64), "head.bias": f32(10)}
    response = await api.put(
        f"/api/v1/federations/{fid}/model", content=state_bytes(fine), headers=OCTET
    )
    assert response.status_code == 201, response.text


async def test_the_initial_model_is_replaced_until_round_zero_opens(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    fed = await make_federation(api, clients=("a", "b"), join=False)
    url = f"/api/v1/federations/{fed.id}/model"
    first = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    old_id = first["current_model_id"]
    # A site cannot fetch version 0 before round 0: the admin may still replace it.
    early = await api.get(f"/api/v1/models/{old_id}", headers=fed.headers("a"))
    assert early.status_code == 404
    old_blobs = blobs(settings)
    assert len(old_blobs) == 1

    replaced = await api.put(url, content=state_bytes(tiny_state(3.0)), headers=OCTET)
    assert replaced.status_code == 201, replaced.text
    new_id = replaced.json()["id"]
    assert new_id != old_id
    federation = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    assert federation["current_model_id"] == new_id
    assert federation["status"] == "waiting"
    models = (await api.get(f"/api/v1/federations/{fed.id}/models", headers=ADMIN)).json()
    assert [m["id"] for m in models] == [new_id]
    assert blobs(settings) == [replaced.json()["sha256"]]  # the old blob is gone
    assert old_blobs != blobs(settings)
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    kinds = [e["kind"] for e in events["items"]]
    assert "model.initial_replaced" in kinds

    for name in ("a", "b"):  # round 0 opens once both joined
        response = await api.post(
            f"/api/v1/federations/{fed.id}/join",
            json={"num_samples": 10, "class_counts": [5, 5]},
            headers=auth(fed.tokens[name]),
        )
        assert response.status_code == 200, response.text
    current = await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("a")
    )
    assert current.json()["instructions"]["global_model_id"] == new_id
    download = await api.get(f"/api/v1/models/{new_id}", headers=fed.headers("a"))
    assert download.status_code == 200

    late = await api.put(url, content=state_bytes(tiny_state(4.0)), headers=OCTET)
    assert late.status_code == 409
    assert "can no longer be replaced" in late.json()["detail"]
    federation = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    assert federation["current_model_id"] == new_id
    assert blobs(settings) == [replaced.json()["sha256"]]


async def test_a_stopped_federation_keeps_its_initial_model(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, join=False)
    stopped = await api.post(
        f"/api/v1/federations/{fed.id}/stop", json={"reason": "wrong task"}, headers=ADMIN
    )
    assert stopped.status_code == 200, stopped.text
    late = await api.put(
        f"/api/v1/federations/{fed.id}/model", content=state_bytes(tiny_state(5.0)), headers=OCTET
    )
    assert late.status_code == 409
    assert "has stopped; its initial model can no longer be replaced" in late.json()["detail"]


async def create_task(api: httpx.AsyncClient, name: str, input_shape: list[int]) -> str:
    spec = federation_spec(name=name, num_classes=10)
    spec["task"]["input_shape"] = input_shape
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.parametrize(
    ("state", "weight", "says"),
    [
        (  # the walkthrough's MLP: Flatten, Linear(784, 128), ReLU, Linear(128, 10)
            {
                "1.weight": f32(128, 784),
                "1.bias": f32(128),
                "3.weight": f32(10, 128),
                "3.bias": f32(10),
            },
            "1.weight",
            "the first layer with weights '1' (weight [128, 784]) takes 784 input features, "
            "more than the 64 values of a sample of shape [1, 8, 8]",
        ),
        (  # a Linear first, without the Flatten: it reads the last dimension, 8
            {"0.weight": f32(10, 64), "0.bias": f32(10)},
            "0.weight",
            "the first layer '0' (weight [10, 64]) takes 64 input features, but the task's "
            "samples of shape [1, 8, 8] end in 8",
        ),
        (  # a colour network (3 channels) for grey samples, nested in a Sequential
            {
                "0.0.weight": f32(8, 3, 3, 3),
                "0.0.bias": f32(8),
                "1.weight": f32(10, 288),
                "1.bias": f32(10),
            },
            "0.0.weight",
            "the first layer '0.0' (weight [8, 3, 3, 3]) is a convolution over 3 input channels "
            "(per group), but the task's samples of shape [1, 8, 8] have 1",
        ),
    ],
)
async def test_a_first_layer_that_cannot_take_the_samples_is_refused(
    api: httpx.AsyncClient,
    settings: Settings,
    state: dict[str, np.ndarray],
    weight: str,
    says: str,
) -> None:
    fid = await create_task(api, "first-layer", [1, 8, 8])
    response = await api.put(
        f"/api/v1/federations/{fid}/model", content=state_bytes(state), headers=OCTET
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"] == "/problems/invalid-model"
    assert says in problem["detail"]
    assert problem["errors"] == [
        {"loc": ["model", weight], "msg": problem["errors"][0]["msg"], "type": "input_shape"}
    ]
    assert says in problem["errors"][0]["msg"]
    assert blobs(settings) == []


async def test_first_layers_that_fit_or_cannot_be_told_are_accepted(api: httpx.AsyncClient) -> None:
    """For [1, 8, 8] samples: what fits, and what the names do not tell (accepted)."""
    head = {"9.weight": f32(10, 16), "9.bias": f32(10)}
    models: dict[str, dict[str, np.ndarray]] = {
        "flatten-linear": {"1.weight": f32(16, 64), "1.bias": f32(16), **head},
        "pooled-then-linear": {"2.weight": f32(16, 16), "2.bias": f32(16), **head},
        "linear-on-rows": {"0.weight": f32(16, 8), "0.bias": f32(16), **head},
        "conv": {"0.weight": f32(16, 1, 3, 3), "0.bias": f32(16), **head},
        "conv-after-padding": {"1.weight": f32(16, 3, 3, 3), **head},  # not the first module
        "embedding-first": {"0.weight": f32(1000, 128), **head},  # no bias: not a Linear
        "batchnorm-first": {  # a module with buffers first: not a single layer
            "0.weight": f32(1),
            "0.bias": f32(1),
            "0.running_mean": f32(1),
            "0.running_var": f32(1),
            "2.weight": f32(16, 784),
            "2.bias": f32(16),
            **head,
        },
        "named-attributes": {  # fc1 may not be the first layer: the file keeps no order
            "fc1.weight": f32(16, 784),
            "fc1.bias": f32(16),
            "fc2.weight": f32(10, 16),
            "fc2.bias": f32(10),
        },
    }
    for name, state in models.items():
        fid = await create_task(api, name, [1, 8, 8])
        response = await api.put(
            f"/api/v1/federations/{fid}/model", content=state_bytes(state), headers=OCTET
        )
        assert response.status_code == 201, (name, response.text)
    # grouped convolutions: 4 channels read by a weight of 2 per group (groups=2), and a
    # transposed convolution's [in, out, k, k]
    for name, state in {
        "grouped": {"0.weight": f32(8, 2, 3, 3), **head},
        "transposed": {"0.weight": f32(4, 3, 3, 3), **head},
    }.items():
        fid = await create_task(api, name, [4, 8, 8])
        response = await api.put(
            f"/api/v1/federations/{fid}/model", content=state_bytes(state), headers=OCTET
        )
        assert response.status_code == 201, (name, response.text)
