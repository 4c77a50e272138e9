"""Bodies of the health routes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ChangeNotifierState(BaseModel):
    """What wakes this process's long-polls when a round opens or closes."""

    kind: Literal["local", "file", "postgres"] = Field(
        description=(
            "local: in-process signals (FEDAUDIT_CHANGE_NOTIFIER=local, an in-memory SQLite "
            "database, or no psycopg 3); file: a signal file beside the SQLite database file "
            "between the processes that share it; postgres: PostgreSQL LISTEN/NOTIFY between "
            "replicas."
        )
    )
    listening: bool | None = Field(
        description=(
            "postgres: whether the LISTEN connection is up now (false while it reconnects: "
            "other replicas' changes then reach this process's waiting sites at their 15-second "
            "re-check). file: whether the watcher of the signal file runs. local: null."
        )
    )
    last_error: str | None = Field(
        description=(
            "The type of the listener's last connection failure (e.g. OperationalError; its "
            "message is in the coordinator's log); null when none since start-up."
        )
    )
    last_error_at: str | None = Field(description="When it failed (ISO 8601, UTC); null when none.")


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    change_notifier: ChangeNotifierState
