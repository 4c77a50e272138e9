"""fedaudit inside a Flower federation (``pip install fedaudit[flower]``, flwr >= 1.20).

- :class:`FedAuditStrategy`: a server-side message-API strategy that wraps another one (FedAvg by
  default) and audits every training round in process with :func:`service.audit.run_audit`.
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
from fedaudit_flower.client import DEFAULT_SIGNALS, signals_record
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
    "FedAuditStrategy",
    "SignalsFormatError",
    "WireSignals",
    "decode_signals",
    "encode_signals",
    "signals_record",
]
