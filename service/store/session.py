"""Engine and session factory.

SQLite is the embedded default: WAL journal (readers never block the writer), a busy timeout so
concurrent writers wait instead of failing, and foreign keys on. The pysqlite driver starts a
transaction only at the first write, so a write issued first in a transaction (the round-close
compare-and-set) takes the database write lock before anything is read: that is what makes
closing exactly-once on SQLite, as the row lock does on PostgreSQL.

SQLite has one writer at a time, and a writer that finds the lock taken sleeps in SQLite's busy
handler, in growing steps up to 100 ms, however soon the lock is released: with dozens of threads
writing at once (a thousand sites joining or uploading together) the lock sat free most of the
time while they slept (1,000 simultaneous joins took 29 s of wall time for 4 s of CPU). So the
engine's threads also queue for one in-process lock (`WriteGate`) at their transaction's first
write and hand it on at its commit or rollback: the next writer is woken at once. SQLite's own
lock still decides (other processes, and a gate that times out, fall back on it).
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 60_000
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class WriteGate:
    """One writing transaction at a time among an SQLite engine's connections, queued in Python.

    Taken before a transaction's first INSERT, UPDATE, DELETE or REPLACE (when pysqlite opens the
    transaction and SQLite's write lock is wanted), given back once that transaction's COMMIT or
    ROLLBACK has run, or its connection closes. A writer that waits longer than the busy timeout
    goes on without it, to SQLite's own locking.
    """

    def __init__(self, timeout_s: float) -> None:
        self._lock = threading.Lock()
        self._timeout_s = timeout_s
        self._holder: Any = None  # the DBAPI connection whose transaction holds the gate

    @property
    def held(self) -> bool:
        """Whether a transaction holds the gate now."""
        return self._lock.locked()

    def before_write(self, dbapi_connection: Any, statement: str) -> None:
        if self._holder is dbapi_connection or not statement.lstrip()[:7].upper().startswith(
            _WRITES
        ):
            return
        if self._lock.acquire(timeout=self._timeout_s):
            self._holder = dbapi_connection

    def release(self, connection: Any) -> None:
        # the engine and the pool end transactions through a proxy of the DBAPI connection
        dbapi_connection = getattr(connection, "dbapi_connection", connection)
        if self._holder is dbapi_connection and dbapi_connection is not None:
            self._holder = None
            self._lock.release()

    def install(self, engine: Engine) -> None:
        _GATES[engine] = self
        dialect = engine.dialect  # the pool ends transactions through the same dialect object
        commit, rollback = dialect.do_commit, dialect.do_rollback

        def do_commit(dbapi_connection: Any) -> None:
            try:
                commit(dbapi_connection)
            finally:
                self.release(dbapi_connection)

        def do_rollback(dbapi_connection: Any) -> None:
            try:
                rollback(dbapi_connection)
            finally:
                self.release(dbapi_connection)

        dialect.do_commit = do_commit  # type: ignore[method-assign]
        dialect.do_rollback = do_rollback  # type: ignore[method-assign]

        @event.listens_for(engine, "before_cursor_execute")
        def _gate(_conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
            self.before_write(cursor.connection, statement)

        @event.listens_for(engine.pool, "close")
        def _closed(dbapi_connection: Any, _record: Any) -> None:
            self.release(dbapi_connection)


_GATES: weakref.WeakKeyDictionary[Engine, WriteGate] = weakref.WeakKeyDictionary()


def write_gate(engine: Engine) -> WriteGate | None:
    """The write gate of an engine `make_engine` made for an SQLite database (None otherwise)."""
    return _GATES.get(engine)


def make_engine(
    url: str,
    *,
    echo: bool = False,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    pool_timeout_s: float | None = None,
) -> Engine:
    """Create an engine for `url`, configured for concurrent use.

    The pool arguments (None: SQLAlchemy's defaults) size the connection pool; a checkout that
    waits longer than `pool_timeout_s` raises `sqlalchemy.exc.TimeoutError`. An in-memory SQLite
    database has no such pool and ignores them.
    """
    parsed = make_url(url)
    pool: dict[str, Any] = {
        key: value
        for key, value in (
            ("pool_size", pool_size),
            ("max_overflow", max_overflow),
            ("pool_timeout", pool_timeout_s),
        )
        if value is not None
    }
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        else:
            pool = {}
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            **pool,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        WriteGate(SQLITE_BUSY_TIMEOUT_MS / 1000).install(engine)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        url = str(parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False))
    return create_engine(url, echo=echo, pool_pre_ping=True, **pool)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (the API serialises after the commit)."""
    return sessionmaker(bind=engine, expire_on_commit=False)
