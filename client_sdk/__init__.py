"""fedaudit client SDK: join a federation and train locally between HTTP rounds.

Usage::

    from client_sdk import FederationClient, Participant

    client = FederationClient("https://coordinator.example", api_token=TOKEN)
    Participant(client, FEDERATION_ID, model, dataset, state_dir="fedaudit-state").run()
"""

from client_sdk._client import AdminClient, FederationClient
from client_sdk._exceptions import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    CoordinatorSDKError,
    FederationFailedError,
    IntegrityError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)
from client_sdk._models import CurrentRound, Instructions, ProblemDetails, UpdateReceipt
from client_sdk.participant import Participant, RoundSummary, default_device

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AdminClient",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "CoordinatorSDKError",
    "CurrentRound",
    "FederationClient",
    "FederationFailedError",
    "Instructions",
    "IntegrityError",
    "InternalServerError",
    "NotFoundError",
    "Participant",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProblemDetails",
    "RateLimitError",
    "RoundSummary",
    "UnprocessableEntityError",
    "UpdateReceipt",
    "default_device",
]
