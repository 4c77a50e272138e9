"""Client training recipes (docs/algorithms.md, "Recipes") and their shared types.

``get_recipe(name)`` returns the registered recipe; every recipe has ``name`` and
``train(model, global_model, data, ctx) -> TrainReport`` (see ``docs/design/recipes-api.md``).

==================== =============================================================
name                 paper
==================== =============================================================
``fedavg``           cross-entropy (FedRN eq. 1)
``fedprox``          cross-entropy + (mu/2)||theta - theta_G||^2 (Li et al. 2020)
``fednoro``          logit adjustment + distillation for noisy clients (FedNoRo)
``fedrn``            GMM sample selection with k-reliable neighbors (FedRN)
``fedncl_correction`` relabelling by the global model (Fed-NCL section V-C)
``rofl``             small-loss samples, centroids, pseudo labels (RoFL)
``flr``              label-mixture regularisation (FLR)
==================== =============================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from client_sdk.recipes.base import LocalData, NeighborModel, Recipe, RoundContext, TrainReport
from client_sdk.recipes.errors import (
    InvalidHyperparameterError,
    InvalidLocalDataError,
    InvalidRoundContextError,
    ModelContractError,
    RecipeError,
    SignalError,
    TrainingDivergedError,
    UnknownRecipeError,
)
from client_sdk.recipes.fedavg import FedAvgRecipe
from client_sdk.recipes.fedncl import FedNCLCorrectionRecipe, relabel
from client_sdk.recipes.fednoro import (
    FedNoRoRecipe,
    kd_loss,
    kd_per_sample,
    kd_weight,
    log_class_prior,
    logit_adjusted_cross_entropy,
)
from client_sdk.recipes.fedprox import FedProxRecipe, proximal_term
from client_sdk.recipes.fedrn import FedRNRecipe, ensemble_clean_probability
from client_sdk.recipes.flr import FLRRecipe, flr_regulariser, flr_schedule
from client_sdk.recipes.model_io import find_head, forward_with_features
from client_sdk.recipes.rofl import RoFLLoss, RoFLRecipe, rofl_loss, update_centroids
from client_sdk.recipes.sample_selection import GmmSelection, per_sample_loss_gmm

__all__ = [
    "RECIPES",
    "FLRRecipe",
    "FedAvgRecipe",
    "FedNCLCorrectionRecipe",
    "FedNoRoRecipe",
    "FedProxRecipe",
    "FedRNRecipe",
    "GmmSelection",
    "InvalidHyperparameterError",
    "InvalidLocalDataError",
    "InvalidRoundContextError",
    "LocalData",
    "ModelContractError",
    "NeighborModel",
    "Recipe",
    "RecipeError",
    "RoFLLoss",
    "RoFLRecipe",
    "RoundContext",
    "SignalError",
    "TrainReport",
    "TrainingDivergedError",
    "UnknownRecipeError",
    "ensemble_clean_probability",
    "find_head",
    "flr_regulariser",
    "flr_schedule",
    "forward_with_features",
    "get_recipe",
    "kd_loss",
    "kd_per_sample",
    "kd_weight",
    "log_class_prior",
    "logit_adjusted_cross_entropy",
    "per_sample_loss_gmm",
    "proximal_term",
    "relabel",
    "rofl_loss",
    "update_centroids",
]

_ALL: tuple[Recipe, ...] = (
    FedAvgRecipe(),
    FedProxRecipe(),
    FedNoRoRecipe(),
    FedRNRecipe(),
    FedNCLCorrectionRecipe(),
    RoFLRecipe(),
    FLRRecipe(),
)

RECIPES: Mapping[str, Recipe] = MappingProxyType({recipe.name: recipe for recipe in _ALL})
"""Registered recipes by name (read-only)."""


def get_recipe(name: str) -> Recipe:
    """Return the recipe registered under ``name``.

    Raises
    ------
    UnknownRecipeError
        If no recipe has that name (the message lists the known ones).
    """
    try:
        return RECIPES[name]
    except (KeyError, TypeError):
        raise UnknownRecipeError(
            f"name: unknown recipe {name!r}; known: {sorted(RECIPES)}"
        ) from None
