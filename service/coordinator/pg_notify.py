"""Change notifications between replicas over PostgreSQL ``LISTEN``/``NOTIFY``.

`PgNotifier` is the `ChangeNotifier` of coordinators on PostgreSQL. `publish(session,
federation_id)` sends ``pg_notify(channel, payload)`` in the committing transaction itself
(`service.store.change_channel`): PostgreSQL delivers it to every replica listening on the same
database when, and only if, that transaction commits, so there is no gap between the commit and
the signal, and no connection of its own to lose. `notify(federation_id)`, after the
commit, wakes this process's waiters at once. A listener thread holds one dedicated connection
(not from the request pool), ``LISTEN``s on the channel and hands each payload's federation id
to a `LocalNotifier`.

The payload is ``"<federation id> <origin>"``: a process skips the echo of its own signals, whose
waiters it has already woken. If the listener's connection drops, the thread logs it and
reconnects with back-off (0.1 s doubling to 5 s); meanwhile this replica's waiters learn of other
replicas' changes at their slow re-check only, and once listening again the thread wakes every
waiter once, since signals may have been missed.

The ``LISTEN`` stays here rather than in `service.store`, beside ``pg_notify``: it is no
statement of a unit of work but the set-up of a long-lived connection outside SQLAlchemy's pool,
read through psycopg's own notification API (``Connection.notifies``), and the import rules keep
psycopg, an optional extra, to this one module.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service.coordinator.notify import LocalNotifier, NotifierState, Subscription
from service.store import change_channel

log = logging.getLogger(__name__)

CHANNEL = change_channel.CHANNEL
APPLICATION_NAME = "fedaudit-listener"
CONNECT_TIMEOUT_S = 5
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
"""TCP keepalives and a send time-out (libpq parameters) on the listener's connection: a
connection left half-open by a failover or an idle-timeout in the network fails within about a
minute instead of the kernel's default of many minutes, so the listener reconnects that soon."""
MAX_BACKOFF_S = 5.0


def libpq_dsn(database_url: str) -> str:
    """The libpq URI of a SQLAlchemy PostgreSQL URL (``postgresql+psycopg://`` and the like)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class PgNotifier:
    """Signals shared by every process that uses the same database and channel."""

    def __init__(self, dsn: str, *, channel: str = CHANNEL, poll_s: float = 0.25) -> None:
        self._dsn = dsn
        self._channel = channel
        self._poll_s = poll_s
        self._origin = uuid.uuid4().hex
        self._local = LocalNotifier()
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._listener_pid: int | None = None
        self._thread: threading.Thread | None = None
        self._last_error: tuple[str, datetime] | None = None
        self._watchers: list[Callable[[bool], None]] = []

    @classmethod
    def for_url(
        cls, database_url: str, *, channel: str = CHANNEL, poll_s: float = 0.25
    ) -> PgNotifier:
        return cls(libpq_dsn(database_url), channel=channel, poll_s=poll_s)

    # --- ChangeNotifier ---------------------------------------------------------------------

    def publish(self, session: Session, federation_id: uuid.UUID) -> None:
        """``pg_notify`` in the session's transaction: other replicas hear of the change when it
        commits. Raises what the database raises (the commit then fails, and so does the use
        case, whose retry is the caller's, as for any failed commit)."""
        change_channel.send_in_transaction(
            session, f"{federation_id} {self._origin}", channel=self._channel
        )

    def notify(self, federation_id: uuid.UUID) -> None:
        """This process's waiters, after the commit (others' hear of it from `publish`)."""
        self._local.notify(federation_id)

    def subscribe(self, federation_id: uuid.UUID) -> AbstractContextManager[Subscription]:
        return self._local.subscribe(federation_id)

    def subscribers(self, federation_id: uuid.UUID) -> int:
        return self._local.subscribers(federation_id)

    def start(self, ready_timeout_s: float = 5.0) -> None:
        """Start the listener thread; wait up to `ready_timeout_s` for its ``LISTEN`` (if the
        database does not answer by then, the thread keeps trying in the background)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._listen_forever, name="fedaudit-listener", daemon=True
            )
            self._thread.start()
        if not self._listening.wait(ready_timeout_s):
            log.warning("change listener not connected yet; waiting sites re-check slowly")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- state, for health checks and tests -------------------------------------------------

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def state(self) -> NotifierState:
        """``kind`` postgres, ``listening``, and the listener's last failure: its exception's
        type (the message, which may name the database's host, is in the log) and when."""
        error = self._last_error
        return {
            "kind": "postgres",
            "listening": self.listening,
            "last_error": None if error is None else error[0],
            "last_error_at": None if error is None else error[1].isoformat(),
        }

    def watch(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(listening)`` now and at each change (from the listener's thread)."""
        self._watchers.append(callback)
        callback(self.listening)

    def _set_listening(self, listening: bool) -> None:
        if listening:
            self._listening.set()
        else:
            self._listening.clear()
        for callback in self._watchers:
            try:
                callback(listening)
            except Exception:  # a watcher (a metric) must not stop the listener
                log.exception("change listener: a state watcher failed")

    @property
    def listener_pid(self) -> int | None:
        """The server process id of the listener's connection (None while disconnected)."""
        return self._listener_pid

    # --- listening --------------------------------------------------------------------------

    def _listen_forever(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self._dsn,
                    autocommit=True,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    application_name=APPLICATION_NAME,
                    **KEEPALIVES,
                ) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    if failures:
                        log.warning("change listener connected again after %d attempt(s)", failures)
                    failures = 0
                    self._listener_pid = conn.info.backend_pid
                    self._set_listening(True)
                    # Whatever changed while nobody listened: every waiter re-reads once.
                    self._local.notify_all()
                    self._relay(conn)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                self._listener_pid = None
                if self._stop.is_set():
                    break
                self._last_error = (type(exc).__name__, datetime.now(UTC))
                self._set_listening(False)
                failures += 1
                delay = min(MAX_BACKOFF_S, 0.1 * 2 ** min(failures - 1, 10))
                log.warning(
                    "change listener lost its database connection (%s); reconnecting in %.1f s; "
                    "until then sites waiting here learn of other replicas' changes at their "
                    "slow re-check",
                    exc,
                    delay,
                )
                self._stop.wait(delay)
        self._listener_pid = None
        self._set_listening(False)

    def _relay(self, conn: psycopg.Connection) -> None:
        while not self._stop.is_set():
            for note in conn.notifies(timeout=self._poll_s):
                self._deliver(note.payload)

    def _deliver(self, payload: str) -> None:
        federation, _, origin = payload.partition(" ")
        if origin == self._origin:
            return  # our own signal: its waiters were woken when it was sent
        try:
            federation_id = uuid.UUID(federation)
        except ValueError:
            log.warning("ignoring a change signal with an unreadable payload %r", payload[:100])
            return
        self._local.notify(federation_id)
