"""fedaudit client SDK: join a federation and train locally between HTTP rounds.

Usage::

    from client_sdk import FederationClient, Participant

    client = FederationClient("http://127.0.0.1:8000", api_token=TOKEN)
    Participant(client, FEDERATION_ID, model, dataset, state_dir="fedaudit-state").run()

``http://127.0.0.1:8000`` is README's quickstart coordinator (plain http on loopback); one that
sites reach over a network serves ``https://`` (``fedaudit serve --tls-cert/--tls-key``, or a TLS
proxy in front).
"""

from typing import TYPE_CHECKING, Any

from client_sdk._admin import AdminClient
from client_sdk._client import FederationClient
from client_sdk._detection_responses import (
    AuditEvidenceDetails,
    AuditEvidenceDetection,
    AuditEvidenceSummary,
    AuditExpertiseDetails,
    AuditExpertiseDetection,
    AuditExpertiseSummary,
    AuditFedNCLDetails,
    AuditFedNCLDetection,
    AuditFedNCLSummary,
    AuditFedNoRoDetails,
    AuditFedNoRoDetection,
    AuditFedNoRoSummary,
)
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
    ProtocolMismatchError,
    RateLimitError,
    SignalPolicyError,
    SiteRoundError,
    UnprocessableEntityError,
)
from client_sdk._report_responses import (
    ClassEvidence,
    ClientHistory,
    DetectorEvidence,
    NoisyClientReport,
    ReportClient,
)
from client_sdk._responses import (
    AuditAggregationDetails,
    AuditRecord,
    ClientInfo,
    CurrentRound,
    Diagnostics,
    Instructions,
    ProblemDetails,
    RoundInfo,
    SignalPolicy,
    UpdateReceipt,
)

if TYPE_CHECKING:
    from client_sdk.participant import (
        Participant,
        RoundSummary,
        default_device,
        save_initial_model,
    )

# The training side (torch) is imported when first used, so that an operator's script that only
# reads reports (``from client_sdk import AdminClient``) does not load a deep-learning stack.
_LAZY = {"Participant", "RoundSummary", "default_device", "save_initial_model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from client_sdk import participant

        return getattr(participant, name)
    raise AttributeError(f"module 'client_sdk' has no attribute {name!r}")


__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AdminClient",
    "AuditAggregationDetails",
    "AuditEvidenceDetails",
    "AuditEvidenceDetection",
    "AuditEvidenceSummary",
    "AuditExpertiseDetails",
    "AuditExpertiseDetection",
    "AuditExpertiseSummary",
    "AuditFedNCLDetails",
    "AuditFedNCLDetection",
    "AuditFedNCLSummary",
    "AuditFedNoRoDetails",
    "AuditFedNoRoDetection",
    "AuditFedNoRoSummary",
    "AuditRecord",
    "AuthenticationError",
    "BadRequestError",
    "ClassEvidence",
    "ClientHistory",
    "ClientInfo",
    "ConflictError",
    "CoordinatorSDKError",
    "CurrentRound",
    "DetectorEvidence",
    "Diagnostics",
    "FederationClient",
    "FederationFailedError",
    "Instructions",
    "IntegrityError",
    "InternalServerError",
    "NoisyClientReport",
    "NotFoundError",
    "Participant",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProblemDetails",
    "ProtocolMismatchError",
    "RateLimitError",
    "ReportClient",
    "RoundInfo",
    "RoundSummary",
    "SignalPolicy",
    "SignalPolicyError",
    "SiteRoundError",
    "UnprocessableEntityError",
    "UpdateReceipt",
    "default_device",
    "save_initial_model",
]
