"""A refused input's problems (service.errors.Problem) on the error that carries them."""

from __future__ import annotations

from service.errors import BadRequestError, InconsistentUpdateError, problem


def test_the_problems_are_the_first_extension_whatever_the_keyword_order() -> None:
    error = InconsistentUpdateError(
        "inconsistent",
        max_sample_drift=0.1,
        errors=[problem(["metadata", "num_samples"], "too many")],
        claimed={"num_samples": 30},
    )
    assert list(error.extensions) == ["errors", "max_sample_drift", "claimed"]
    assert error.extensions["errors"] == [{"loc": ["metadata", "num_samples"], "msg": "too many"}]


def test_an_error_without_problems_has_no_errors_extension() -> None:
    assert BadRequestError("bad", reason="why").extensions == {"reason": "why"}
    assert BadRequestError("bad").extensions == {}
