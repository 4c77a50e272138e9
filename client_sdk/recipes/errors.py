"""Errors raised by the training recipes and the signals.

Every error is a ``ValueError`` subclass that names the argument (or hyper-parameter) and the
reason, so a Participant can report it to the operator as it is::

    RecipeError(ValueError)
    ├── UnknownRecipeError          get_recipe() with a name that is not registered
    ├── InvalidHyperparameterError  a hyper-parameter has the wrong type or is out of range
    ├── InvalidRoundContextError    an inconsistent RoundContext (negative round, bad weights, ...)
    ├── InvalidLocalDataError       LocalData with wrong dtypes/shapes or labels out of range
    ├── ModelContractError          the model does not fit what the recipe needs (no Linear head,
    │                               wrong number of outputs, a neighbor state that does not load)
    ├── SignalError                 a signal was requested without what it needs
    └── TrainingDivergedError       local training produced a non-finite loss
"""

from __future__ import annotations

__all__ = [
    "InvalidHyperparameterError",
    "InvalidLocalDataError",
    "InvalidRoundContextError",
    "ModelContractError",
    "RecipeError",
    "SignalError",
    "TrainingDivergedError",
    "UnknownRecipeError",
]


class RecipeError(ValueError):
    """Base class of the recipe and signal errors."""


class UnknownRecipeError(RecipeError):
    """The recipe name is not registered."""


class InvalidHyperparameterError(RecipeError):
    """A hyper-parameter has the wrong type or lies outside its allowed range."""


class InvalidRoundContextError(RecipeError):
    """The RoundContext is inconsistent."""


class InvalidLocalDataError(RecipeError):
    """The local data has the wrong dtypes or shapes, or labels outside ``[0, C)``."""


class ModelContractError(RecipeError):
    """The model does not have what the recipe needs."""


class SignalError(RecipeError):
    """A requested signal cannot be computed from what was given."""


class TrainingDivergedError(RecipeError):
    """Local training produced a non-finite loss (learning rate too high, bad data)."""
