"""fedaudit inside a Flower federation (``pip install fedaudit[flower]``, flwr >= 1.20).

- :class:`FedAuditStrategy`: a server-side message-API strategy that wraps another one (FedAvg by
  default) and audits every training round: in process with :func:`service.audit.run_audit`
  (the default), or by forwarding the round to a running fedaudit coordinator over HTTP
  (``coordinator=CoordinatorConnection(url, admin_token)``; :mod:`fedaudit_flower.coordinator`).
- :func:`signals_record`: the ClientApp side, the SDK's signals as a ``ConfigRecord`` for the
  reply, under :data:`SIGNALS_KEY`.

See docs/flower.md.
"""

from fedaudit_flower._records import (
    SIGNALS_FORMAT,
    SIGNALS_KEY,
    SignalsFormatError,
    WireSignals,
    decode_signals,
    encode_signals,
)
from fedaudit_flower.auditing import Auditor, InProcessAuditor, RoundAudit
from fedaudit_flower.client import DEFAULT_SIGNALS, privacy_policy, signals_record
from fedaudit_flower.coordinator import CoordinatorAuditor, CoordinatorConnection
from fedaudit_flower.strategy import (
    DEFAULT_AUDIT_CONFIG,
    REPORT_FORMAT,
    STATUS_CODES,
    FedAuditStrategy,
)

__all__ = [
    "DEFAULT_AUDIT_CONFIG",
    "DEFAULT_SIGNALS",
    "REPORT_FORMAT",
    "SIGNALS_FORMAT",
    "SIGNALS_KEY",
    "STATUS_CODES",
    "Auditor",
    "CoordinatorAuditor",
    "CoordinatorConnection",
    "FedAuditStrategy",
    "InProcessAuditor",
    "RoundAudit",
    "SignalsFormatError",
    "WireSignals",
    "decode_signals",
    "encode_signals",
    "privacy_policy",
    "signals_record",
]
