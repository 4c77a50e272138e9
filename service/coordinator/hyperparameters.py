"""Typed hyper-parameters of each client recipe, checked when a federation is created.

The sites read these with the SDK's ``Hyperparameters`` (``client_sdk/recipes``), which refuses a
wrong type or range only once training starts, at every site; the coordinator checks the same
keys, types and ranges up front so that a spec with ``lr: "abc"`` or ``local_epochs: -3`` is
refused with the field named and never reaches a site. A key the recipe does not read is refused
too (a misspelt ``learning_rate`` would otherwise be ignored silently).

Strict types: a number is not a string, a boolean is not a number, an integer is a JSON integer
(``2``, not ``2.0``); a float may be written as an integer (``1`` for ``1.0``). Floats are finite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.errors import Problem
from service.inputs import INT32_MAX, Name

MAX_LOCAL_EPOCHS = 10_000
MAX_BATCH_SIZE = 1_000_000

PositiveFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
UnitFloat = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Rounds = Annotated[int, Field(ge=0, le=INT32_MAX)]
HeadName = Annotated[Name, Field(min_length=1, max_length=200)]
"""The name of the model's classification head (a module name)."""


class CommonHyperparameters(BaseModel):
    """What every recipe reads (the SDK's ``TrainingConfig``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: PositiveFloat = 0.01
    momentum: UnitFloat = 0.9
    weight_decay: NonNegativeFloat = 0.0
    local_epochs: int = Field(default=1, ge=1, le=MAX_LOCAL_EPOCHS)
    batch_size: int = Field(default=32, ge=1, le=MAX_BATCH_SIZE)
    max_grad_norm: PositiveFloat | None = None


class FedProxHyperparameters(CommonHyperparameters):
    mu: NonNegativeFloat = 0.01


class FedNoRoHyperparameters(CommonHyperparameters):
    warmup_rounds: Rounds = 10
    kd_temperature: PositiveFloat = 0.8
    kd_weight_max: UnitFloat = 0.8
    ramp_rounds: Rounds = 39
    absent_class_prior: Literal["rarest", "zero"] = "rarest"
    kd_samples: Literal["all", "contradicted"] = "all"
    kd_scope: Literal["site", "classes"] = "classes"
    kd_classes: Literal["held", "all"] = "held"
    kd_marginal: Literal["labels", "teacher"] = "labels"
    la_tau: UnitFloat = 0.0


class FedRNHyperparameters(CommonHyperparameters):
    warmup_rounds: Rounds = 100
    gmm_tol: PositiveFloat = 1e-2
    gmm_reg_covar: NonNegativeFloat = 5e-4
    clean_threshold: UnitFloat = 0.5
    head_epochs: int = Field(default=1, ge=0, le=MAX_LOCAL_EPOCHS)
    head_lr: PositiveFloat | None = None
    head_name: HeadName | None = None


class FedNCLCorrectionHyperparameters(CommonHyperparameters):
    t_corr: Rounds = 60
    confidence_threshold: UnitFloat = 0.9
    confidence_inclusive: bool = False


class RoFLHyperparameters(CommonHyperparameters):
    forget_rate: float = Field(default=0.2, ge=0.0, le=0.99, allow_inf_nan=False)
    forget_rounds: Rounds = 10
    t_pl: Rounds = 100
    lambda_cen: NonNegativeFloat = 1.0
    lambda_e: NonNegativeFloat = 0.8
    centroid_reduction: Literal["mean", "sum"] = "mean"
    head_name: HeadName | None = None


class FLRHyperparameters(CommonHyperparameters):
    alpha: UnitFloat = 0.9
    beta: UnitFloat = 0.7
    gamma: UnitFloat = 0.5
    lam: NonNegativeFloat = 2.0
    r_w: Rounds = 50
    warmup_rounds: Rounds = 50
    clamp: float = Field(default=1e-4, gt=0.0, le=0.49, allow_inf_nan=False)


HYPERPARAMETERS: dict[str, type[CommonHyperparameters]] = {
    "fedavg": CommonHyperparameters,
    "fedprox": FedProxHyperparameters,
    "fednoro": FedNoRoHyperparameters,
    "fedrn": FedRNHyperparameters,
    "fedncl_correction": FedNCLCorrectionHyperparameters,
    "rofl": RoFLHyperparameters,
    "flr": FLRHyperparameters,
}
"""The hyper-parameters each recipe reads, by recipe name (the SDK's registry names)."""


def hyperparameter_errors(recipe: str, values: Mapping[str, Any]) -> list[Problem]:
    """The problems of `values` for `recipe`, each ``{"loc", "msg", "type"}`` with ``loc`` the
    key (and index) inside the hyper-parameters; empty when they are valid."""
    model = HYPERPARAMETERS[recipe]
    try:
        model.model_validate(dict(values))
    except ValidationError as exc:
        errors: list[Problem] = []
        for error in exc.errors(include_url=False):
            msg = str(error["msg"])
            if error["type"] == "extra_forbidden":
                msg = f"the {recipe} recipe has no such hyper-parameter; it reads " + ", ".join(
                    sorted(model.model_fields)
                )
            errors.append({"loc": list(error["loc"]), "msg": msg, "type": error["type"]})
        return errors
    return []
