"""Engine and session factory.

SQLite is the embedded default: WAL journal (readers never block the writer), a busy timeout so
concurrent writers wait instead of failing, and foreign keys on. The pysqlite driver starts a
transaction only at the first write, so a write issued first in a transaction (the round-close
compare-and-set) takes the database write lock before anything is read: that is what makes
closing exactly-once on SQLite, as the row lock does on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 60_000


class DatabaseMissingError(FileNotFoundError):
    """A command that needs an existing coordinator database found no SQLite file."""


def make_engine(
    url: str,
    *,
    echo: bool = False,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    pool_timeout_s: float | None = None,
    must_exist: bool = False,
) -> Engine:
    """Create an engine for `url`, configured for concurrent use.

    The pool arguments (None: SQLAlchemy's defaults) size the connection pool; a checkout that
    waits longer than `pool_timeout_s` raises `sqlalchemy.exc.TimeoutError`. An in-memory SQLite
    database has no such pool and ignores them.

    A SQLite file's directory is created where missing (the coordinator's first start), unless
    `must_exist` (a command that works on an existing coordinator's database): then a missing
    file raises :class:`DatabaseMissingError` and nothing is created.
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
            if must_exist and not Path(database).is_file():
                raise DatabaseMissingError(
                    f"no database at {database}: start the coordinator there once "
                    "(fedaudit serve), or point FEDAUDIT_DATA_DIR or FEDAUDIT_DATABASE_URL at "
                    "its data"
                )
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

        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        url = str(parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False))
    return create_engine(url, echo=echo, pool_pre_ping=True, **pool)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (the API serialises after the commit)."""
    return sessionmaker(bind=engine, expire_on_commit=False)
