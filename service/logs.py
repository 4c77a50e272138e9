"""The coordinator's logs: one format for its own lines and uvicorn's, and one line per event.

``FEDAUDIT_LOG_FORMAT=text`` (default) writes ``time level logger: message``, the message on
one line (:class:`OneLineText`); ``json`` writes one JSON object per line through
python-json-logger (``time``, ``level``, ``logger``, ``message``, plus the fields a line
carries: an event's ``event``, ``federation_id``, ``round_id``, ``client_id``).
:func:`log_config` is a :func:`logging.config.dictConfig` dictionary that also takes over
uvicorn's loggers (its server and access lines), so that ``fedaudit serve`` hands the same
dictionary to uvicorn and every worker process formats alike.

Every event of the audit trail (a round opened or closed, a site flagged, an inconclusive audit,
a site error, a refused update, ...) is logged once at INFO by the logger ``fedaudit.events``
when the transaction that recorded it commits (:mod:`service.store.event_log`): a rolled-back
event leaves no line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

__all__ = ["CurrentStderr", "NoColour", "OneLineText", "log_config"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
_JSON_RENAME = {"asctime": "time", "levelname": "level", "name": "logger"}


class CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to whatever ``sys.stderr`` is when a line is written (as logging's
    last-resort handler does), not the stream it was when logging was configured: a test
    runner or a tool that swaps standard error for a while leaves no dangling handler."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


class OneLineText(logging.Formatter):
    """The text format with each message on one line: a newline or carriage return in it (a
    site's error message quoting torch, say) is written as ``\\n`` / ``\\r``. A traceback
    (``exc_info``) still follows on lines of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        message = record.message
        if "\n" not in message and "\r" not in message:
            return super().formatMessage(record)
        record.message = message.replace("\r", "\\r").replace("\n", "\\n")
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


class NoColour(logging.Filter):
    """Drops uvicorn's ``color_message`` (terminal escape codes) from a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)
        return True


def log_config(level: str, fmt: str) -> dict[str, Any]:
    """A dictConfig dictionary: the root logger and uvicorn's, one handler on standard error."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format: expected 'text' or 'json', got {fmt!r}")
    formatter: dict[str, Any] = (
        {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": _JSON_FIELDS,
            "rename_fields": _JSON_RENAME,
        }
        if fmt == "json"
        else {"()": OneLineText, "fmt": _TEXT_FORMAT}
    )
    handler = {
        "()": CurrentStderr,
        "formatter": "fedaudit",
        "filters": ["no_colour"],
    }
    uvicorn = {"handlers": ["stderr"], "level": level, "propagate": False}
    # boto3 (the s3 blob backend) logs each request's headers at DEBUG, the signed
    # Authorization header with the access key id among them: never below INFO.
    quiet = _no_finer_than_info(level)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"fedaudit": formatter},
        "filters": {"no_colour": {"()": NoColour}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": uvicorn,
            "uvicorn.error": {"level": level},
            "uvicorn.access": uvicorn,
            **{name: {"level": quiet} for name in ("boto3", "botocore", "s3transfer", "urllib3")},
        },
    }


def _no_finer_than_info(level: str) -> str:
    """`level`, or INFO where `level` would show DEBUG lines."""
    number = logging.getLevelName(level.upper())
    if isinstance(number, int) and number < logging.INFO:
        return "INFO"
    return level
