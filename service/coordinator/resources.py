"""The resources the use cases need from the outside world, bundled once per process: database
sessions, the blob store, change notifications, rate limits, the background executor."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.coordinator.file_notify import FileNotifier, signal_file_for
from service.coordinator.notify import ChangeNotifier, CommitHook, LocalNotifier
from service.coordinator.ratelimit import EventBudget, FailureThrottle
from service.errors import MissingExtraError, StartupError
from service.store.base import utcnow
from service.store.blobs import BlobStore, DatabaseBlobStore, DirectoryBlobStore
from service.store.s3blobs import S3BlobStore, S3Location

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    sessions: sessionmaker[Session]
    blobs: BlobStore
    clock: Callable[[], datetime] = utcnow
    worker: BackgroundWorker = field(default_factory=lambda: BackgroundWorker())
    notifier: ChangeNotifier = field(default_factory=LocalNotifier)
    """Wakes long-polls when a federation's rounds or status change (see `notify`)."""
    auth_events: EventBudget = field(init=False)
    """Budget of auth.rejected events per federation and minute (from the settings)."""
    auth_throttle: FailureThrottle = field(init=False)
    """Wrong tokens per client address (429 past the limit, from the settings)."""
    _commit_hook: CommitHook = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.auth_events = EventBudget(self.settings.auth_rejected_events_per_minute, 60.0)
        self.auth_throttle = FailureThrottle(
            self.settings.auth_failure_limit, self.settings.auth_failure_window_s
        )
        self._commit_hook = CommitHook(self.sessions, self.notifier)

    def close(self) -> None:
        """Stop the worker and the notifier and release the database connections."""
        self.worker.shutdown()
        self._commit_hook.remove()
        self.notifier.close()
        bind = self.sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()

    @classmethod
    def create(cls, settings: Settings, sessions: sessionmaker[Session]) -> Services:
        settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            settings=settings,
            sessions=sessions,
            blobs=blob_store(settings, sessions),
            notifier=change_notifier(settings),
        )


def change_notifier(settings: Settings) -> ChangeNotifier:
    """What wakes long-polls, from ``FEDAUDIT_CHANGE_NOTIFIER``. Not started: the app's lifespan
    starts it (`ChangeNotifier.start`) and `Services.close` stops it.

    - ``local``: in-process signals;
    - ``auto`` (the default): PostgreSQL LISTEN/NOTIFY on a PostgreSQL database (replicas wake
      each other's waiters) when psycopg 3 (the ``postgres`` extra) is installed; a signal file
      beside a SQLite database file (:mod:`service.coordinator.file_notify`: the processes of
      ``fedaudit serve --workers N`` wake each other's waiters); in-process signals on an
      in-memory SQLite database, and on PostgreSQL without psycopg 3 (a database URL of another
      driver, ``postgresql+psycopg2://``), with a warning naming the setting and the extra;
    - ``postgres``: LISTEN/NOTIFY, or :class:`StartupError` (:class:`MissingExtraError`
      without psycopg 3) naming what to install or set.
    """
    url = settings.resolved_database_url
    mode = settings.change_notifier
    if mode == "local":
        return LocalNotifier()
    backend = make_url(url).get_backend_name()
    if backend != "postgresql":
        if mode == "postgres":
            raise StartupError(
                f"FEDAUDIT_CHANGE_NOTIFIER=postgres needs a PostgreSQL database, and the database "
                f"is {backend}: set FEDAUDIT_DATABASE_URL to a PostgreSQL URL, or "
                "FEDAUDIT_CHANGE_NOTIFIER=auto"
            )
        # a URI filename ("file:path?mode=rwc") names its path before the query
        database = (make_url(url).database or "").split("?")[0].removeprefix("file:")
        if backend == "sqlite" and database not in ("", ":memory:") and mode == "auto":
            return FileNotifier(signal_file_for(database))
        return LocalNotifier()
    try:
        from service.coordinator.pg_notify import PgNotifier
    except ImportError as exc:
        if mode == "postgres":
            raise MissingExtraError(
                "FEDAUDIT_CHANGE_NOTIFIER=postgres: replicas wake each other's long-polls "
                "through psycopg 3, which is not installed: pip install 'fedaudit[postgres]' "
                "(or set FEDAUDIT_CHANGE_NOTIFIER=local)"
            ) from exc
        log.warning(
            "FEDAUDIT_CHANGE_NOTIFIER=auto: the database is PostgreSQL, but psycopg 3 (the "
            "postgres extra) is not installed, so this process uses in-process change signals: "
            "a site waiting on another replica learns of a round's change at its 15-second "
            "re-check. Install it (pip install 'fedaudit[postgres]') for LISTEN/NOTIFY between "
            "replicas, or set FEDAUDIT_CHANGE_NOTIFIER=local to keep in-process signals "
            "without this warning."
        )
        return LocalNotifier()
    return PgNotifier.for_url(url)


def blob_store(settings: Settings, sessions: sessionmaker[Session]) -> BlobStore:
    """The blob store the settings name. The s3 backend checks its bucket here, at start-up:
    MissingExtraError without boto3, BlobStoreUnavailableError if the bucket does not answer."""
    if settings.blob_backend == "database":
        return DatabaseBlobStore(sessions, settings.data_dir / "blob-cache")
    if settings.blob_backend == "s3":
        assert settings.s3_bucket is not None  # the settings refuse s3 without a bucket
        location = S3Location(
            bucket=settings.s3_bucket,
            prefix=settings.s3_prefix,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            addressing_style=settings.s3_addressing_style,
        )
        return S3BlobStore.connect(location, settings.data_dir / "blob-cache")
    return DirectoryBlobStore(settings.blob_dir)


class BackgroundWorker:
    """One thread that closes rounds off the request path; each round is queued at most once.

    Nothing lives only here: a round that was queued when the process died is found again by
    the deadline checker (`reaper.check_rounds`) after a restart, because its updates are stored.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedaudit-close")
        self._pending: set[uuid.UUID] = set()
        self._lock = threading.Lock()

    def submit_once(self, key: uuid.UUID, job: Callable[[], object]) -> Future[object] | None:
        with self._lock:
            if key in self._pending:
                return None
            self._pending.add(key)

        def run() -> object:
            try:
                return job()
            except Exception:
                log.exception("background job for %s failed", key)
                raise
            finally:
                with self._lock:
                    self._pending.discard(key)

        return self._executor.submit(run)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)
