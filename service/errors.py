"""Domain errors of the coordinator, each carrying its HTTP status and problem type.

No web or database imports: the API layer renders these as RFC 9457 problem details
(``service/api/problems.py``). Extensions (``errors``, ``open_round`` ...) travel in `extensions`;
``errors`` lists the refused input's problems, each a :class:`Problem`.

    CoordinatorError
    ├── BadRequestError              400 bad-request
    ├── AuthError                    401 unauthorized
    │   └── ForbiddenError           403 forbidden
    ├── NotFoundError                404 not-found
    ├── ConflictError                409 conflict
    │   ├── RoundClosedError         409 round-closed
    │   ├── DuplicateUpdateError     409 duplicate-update
    │   ├── IdempotencyKeyReusedError 409 idempotency-key-reused
    │   └── FederationStateError     409 federation-state
    ├── GoneError                    410 gone
    ├── PayloadTooLargeError         413 payload-too-large
    ├── InvalidSpecError             422 validation-error
    ├── UpdateRejectedError          422 update-rejected
    │   ├── InconsistentUpdateError  422 update-inconsistent
    │   └── PrivacyPolicyError       422 privacy-policy
    ├── InvalidModelError            422 invalid-model
    ├── RateLimitedError             429 rate-limited
    ├── DpAccountingUnavailableError 501 dp-accounting-unavailable
    └── NotReadyError                503 not-ready
"""

from __future__ import annotations

from typing import Any, ClassVar, NotRequired

from typing_extensions import TypedDict


class Problem(TypedDict):
    """One problem of a refused input (an update, a join, a federation spec, its
    hyper-parameters, a model file): where (``loc``, the path of keys and indices to the field)
    and what (``msg``); ``type`` where a check names its kind (``head_outputs``, a schema rule's
    ``missing`` ...). Answered in a problem's ``errors`` and recorded in events as it is."""

    loc: list[str | int]
    msg: str
    type: NotRequired[str]


def problem(loc: list[str | int], msg: str) -> Problem:
    """A problem at ``loc``, saying ``msg``."""
    return {"loc": loc, "msg": msg}


class CoordinatorError(Exception):
    """Base of every expected error; `status`, `title` and `type_slug` describe the problem type.

    ``errors``, when given, is the first of the `extensions` (the problems of a refused input).
    """

    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"
    type_slug: ClassVar[str] = "internal"

    def __init__(
        self, detail: str, *, errors: list[Problem] | None = None, **extensions: Any
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = extensions if errors is None else {"errors": errors, **extensions}


class BadRequestError(CoordinatorError):
    status = 400
    title = "Bad request"
    type_slug = "bad-request"


class AuthError(CoordinatorError):
    status = 401
    title = "Unauthorized"
    type_slug = "unauthorized"


class ForbiddenError(AuthError):
    status = 403
    title = "Forbidden"
    type_slug = "forbidden"


class NotFoundError(CoordinatorError):
    status = 404
    title = "Not found"
    type_slug = "not-found"


class ConflictError(CoordinatorError):
    status = 409
    title = "Conflict"
    type_slug = "conflict"


class RoundClosedError(ConflictError):
    title = "Round closed"
    type_slug = "round-closed"


class DuplicateUpdateError(ConflictError):
    title = "Duplicate update"
    type_slug = "duplicate-update"


class IdempotencyKeyReusedError(ConflictError):
    title = "Idempotency key reused"
    type_slug = "idempotency-key-reused"


class FederationStateError(ConflictError):
    title = "Federation state does not allow this"
    type_slug = "federation-state"


class GoneError(CoordinatorError):
    """What was stored once and removed for good (a model update pruned by retention)."""

    status = 410
    title = "Gone"
    type_slug = "gone"


class PayloadTooLargeError(CoordinatorError):
    status = 413
    title = "Payload too large"
    type_slug = "payload-too-large"


class InvalidSpecError(CoordinatorError):
    """A request body that its schema let through but a deeper rule refuses (a recipe's
    hyper-parameters): the same problem type as a schema violation, ``errors`` naming each field."""

    status = 422
    title = "Request validation failed"
    type_slug = "validation-error"


class UpdateRejectedError(CoordinatorError):
    status = 422
    title = "Update rejected"
    type_slug = "update-rejected"


class InconsistentUpdateError(UpdateRejectedError):
    """An update's num_samples / class_counts outside the drift allowed from the site's join."""

    title = "Update inconsistent with the join"
    type_slug = "update-inconsistent"


class PrivacyPolicyError(UpdateRejectedError):
    """A join or update whose counts or per-class signals are finer than the federation's
    signal privacy policy allows (nothing of it is stored)."""

    title = "Signals finer than the federation's privacy policy"
    type_slug = "privacy-policy"


class InvalidModelError(CoordinatorError):
    status = 422
    title = "Invalid model"
    type_slug = "invalid-model"


class RateLimitedError(CoordinatorError):
    status = 429
    title = "Too many requests"
    type_slug = "rate-limited"


class DpAccountingUnavailableError(CoordinatorError):
    """The federation's Gaussian mechanism needs the privacy accountant (``dp-accounting``, the
    ``fedaudit[dp]`` extra), which this coordinator lacks; nothing is accounted by other means."""

    status = 501
    title = "Privacy accounting unavailable"
    type_slug = "dp-accounting-unavailable"


class NotReadyError(CoordinatorError):
    status = 503
    title = "Not ready"
    type_slug = "not-ready"


class MigrationsNotAtHeadError(RuntimeError):
    """The database schema is not at the migrations' head; the service refuses to start."""


class StartupError(RuntimeError):
    """A setting names something this process cannot use; the service refuses to start."""


class MissingExtraError(StartupError):
    """An optional dependency that a setting needs is not installed; the message names the
    ``pip install`` that adds it (e.g. ``fedaudit[s3]``)."""


class BlobStoreUnavailableError(StartupError):
    """The configured blob store does not answer at start-up (an unreachable server, a
    missing bucket, credentials it refuses)."""
