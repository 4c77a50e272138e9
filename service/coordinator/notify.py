"""Change notifications: what wakes a long-poll when a federation's rounds or status change.

A use case that opens or closes a round, or starts, stops or finishes a federation, calls
`mark_changed(session, federation_id)`. A hook that `Services` installs on its session factory
(`CommitHook`) sends what was marked in two steps: to other processes inside the committing
transaction, just before its ``COMMIT`` (`ChangeNotifier.publish`), and to this process's own
waiters once the commit has landed (`ChangeNotifier.notify`). So a woken waiter that re-reads
the database sees the change, and a rolled-back transaction notifies nobody, here or elsewhere.

`ChangeNotifier` is the interface the rest of the service sees. `LocalNotifier` fans signals out
inside one process, which is all a single coordinator on SQLite needs (its `publish` does
nothing). On PostgreSQL the coordinator uses `PgNotifier` (`service.coordinator.pg_notify`) so
that replicas behind a load balancer wake each other's waiters: its `publish` runs
``pg_notify`` in the committing transaction (PostgreSQL delivers it when, and only if, that
transaction commits), and a listener thread (``LISTEN`` on one dedicated connection) hands what
it receives from other processes to a `LocalNotifier`. `Services` picks it from the database URL
(the setting ``change_notifier`` can force the local one).

Signals carry no state: a waiter re-reads the database after each one, so a spurious signal
costs one short query, and waiters also re-check on a slow timer in case a signal was missed
(a replica whose listener is reconnecting).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal, Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker
from typing_extensions import TypedDict

_PENDING = "fedaudit.changed_federations"
_PUBLISHED = "fedaudit.published_federations"


class NotifierState(TypedDict):
    """What ``/healthz`` shows of a change notifier (its ``change_notifier``), key for key."""

    kind: Literal["local", "file", "postgres"]
    """``local``: signals inside this process only; ``file``: a signal file beside the SQLite
    database (`FileNotifier`); ``postgres``: PostgreSQL ``LISTEN``/``NOTIFY`` (`PgNotifier`)."""
    listening: bool | None
    """Whether other processes' signals reach this one now (the signal file's watcher runs, the
    ``LISTEN`` connection is up); None when there is nothing to listen to."""
    last_error: str | None
    """The type of the listener's last failure (its message, which may name the database's
    host, is logged); None when none since start-up."""
    last_error_at: str | None
    """When it failed (ISO 8601, UTC); None when none."""


class Subscription(Protocol):
    async def wait(self, timeout_s: float) -> bool:
        """Wait for a signal sent since subscribing or since the last `wait` returned.

        Returns True when signalled, False when `timeout_s` passed first.
        """
        ...


class ChangeNotifier(Protocol):
    def publish(self, session: Session, federation_id: uuid.UUID) -> None:
        """Tell other processes, in the session's transaction just before it commits: what is
        sent this way must reach them only if that transaction commits. Raising fails the
        commit."""
        ...

    def notify(self, federation_id: uuid.UUID) -> None:
        """Signal every subscriber of the federation in this process (after the commit);
        callable from any thread."""
        ...

    def subscribe(self, federation_id: uuid.UUID) -> AbstractContextManager[Subscription]:
        """A subscription for the block, entered on a running asyncio event loop.

        Subscribe before reading the state you wait on: a change committed between the read and
        the first `wait` is then not missed.
        """
        ...

    def subscribers(self, federation_id: uuid.UUID) -> int:
        """How many subscriptions of this process wait on the federation now."""
        ...

    def start(self) -> None:
        """Begin relaying signals from other processes, if this notifier does (app start-up)."""
        ...

    def close(self) -> None:
        """Stop relaying and release what `start` opened (app shut-down)."""
        ...

    def state(self) -> NotifierState:
        """What ``/healthz`` shows of it: its kind, whether it listens to other processes now,
        and its listener's last failure."""
        ...

    def watch(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(listening)`` now and whenever the listener connects or loses its
        connection (from its thread); never for a notifier that listens to nothing."""
        ...


class _LocalSubscription:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def signal(self) -> None:
        """From any thread: set the event on its own loop."""
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass

    async def wait(self, timeout_s: float) -> bool:
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout=max(timeout_s, 0.0))
            except TimeoutError:
                return False
        self._event.clear()
        return True


class LocalNotifier:
    """In-process fan-out: thread-safe `notify`, asyncio waiters woken on their own loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: dict[uuid.UUID, set[_LocalSubscription]] = {}

    def publish(self, session: Session, federation_id: uuid.UUID) -> None:
        """Nothing to send: no other process listens."""

    def notify(self, federation_id: uuid.UUID) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions.get(federation_id, ()))
        for subscription in subscriptions:
            subscription.signal()

    @contextmanager
    def subscribe(self, federation_id: uuid.UUID) -> Iterator[_LocalSubscription]:
        subscription = _LocalSubscription(asyncio.get_running_loop())
        with self._lock:
            self._subscriptions.setdefault(federation_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            with self._lock:
                waiting = self._subscriptions.get(federation_id)
                if waiting is not None:
                    waiting.discard(subscription)
                    if not waiting:
                        del self._subscriptions[federation_id]

    def notify_all(self) -> None:
        """Signal every subscriber of every federation (after signals may have been missed)."""
        with self._lock:
            subscriptions = [s for waiting in self._subscriptions.values() for s in waiting]
        for subscription in subscriptions:
            subscription.signal()

    def subscribers(self, federation_id: uuid.UUID) -> int:
        with self._lock:
            return len(self._subscriptions.get(federation_id, ()))

    def start(self) -> None:
        """Nothing to start: signals stay inside this process."""

    def close(self) -> None:
        """Nothing to release."""

    def state(self) -> NotifierState:
        """In-process signals: nothing to listen to."""
        return {"kind": "local", "listening": None, "last_error": None, "last_error_at": None}

    def watch(self, callback: Callable[[bool], None]) -> None:
        """Nothing to watch: the callback is never called."""


def mark_changed(session: Session, federation_id: uuid.UUID) -> None:
    """Notify the federation's waiters, in this process and others, once this session's
    transaction commits.

    The mark belongs to the current transaction (begun here if need be, as the change it
    announces would): its rollback drops it.
    """
    session.connection()
    session.info.setdefault(_PENDING, set()).add(federation_id)


class CommitHook:
    """Sends the notifications marked in a session (see `mark_changed`): `publish` in the
    committing transaction before its ``COMMIT``, `notify` after it.

    A savepoint's release runs the session's commit events too: what is marked by then is
    published inside the enclosing transaction (delivered only if that one commits), and this
    process's waiters are woken only when the outermost transaction commits. A savepoint's
    rollback keeps the marks (a spurious signal is harmless) and has them published again, since
    PostgreSQL dropped what was published inside it.
    """

    def __init__(self, sessions: sessionmaker[Session], notifier: ChangeNotifier) -> None:
        self._sessions = sessions
        self._notifier = notifier
        event.listen(sessions, "before_commit", self._before_commit)
        event.listen(sessions, "after_commit", self._after_commit)
        event.listen(sessions, "after_soft_rollback", self._after_soft_rollback)
        event.listen(sessions, "after_transaction_end", self._after_transaction_end)

    def _before_commit(self, session: Session) -> None:
        pending = session.info.get(_PENDING)
        if not pending:
            return
        published = session.info.setdefault(_PUBLISHED, set())
        for federation_id in sorted(pending - published):
            self._notifier.publish(session, federation_id)
            published.add(federation_id)

    def _after_commit(self, session: Session) -> None:
        if session.in_nested_transaction():
            return  # a savepoint's release: the enclosing transaction may still roll back
        session.info.pop(_PUBLISHED, None)
        for federation_id in session.info.pop(_PENDING, ()):
            self._notifier.notify(federation_id)

    def _after_soft_rollback(self, session: Session, previous: SessionTransaction) -> None:
        # Every rollback, with or without a connection; a savepoint's leaves the outer marks.
        session.info.pop(_PUBLISHED, None)
        if previous.parent is None:
            session.info.pop(_PENDING, None)

    def _after_transaction_end(self, session: Session, transaction: SessionTransaction) -> None:
        # The outermost transaction ended (committed: _after_commit ran first; rolled back; or
        # closed with the session after a failed commit): nothing marked in it may leak into the
        # session's next transaction.
        if transaction.parent is None:
            session.info.pop(_PUBLISHED, None)
            session.info.pop(_PENDING, None)

    def remove(self) -> None:
        event.remove(self._sessions, "before_commit", self._before_commit)
        event.remove(self._sessions, "after_commit", self._after_commit)
        event.remove(self._sessions, "after_soft_rollback", self._after_soft_rollback)
        event.remove(self._sessions, "after_transaction_end", self._after_transaction_end)
