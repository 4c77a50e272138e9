"""Alembic from code: upgrade, current revision, and the at-head check done at start-up."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from service.errors import MigrationsNotAtHeadError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
"""The Alembic revisions, inside the package (an installed wheel carries them)."""


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the migrations up to `revision`."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads; merge them")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def check_at_head(engine: Engine) -> None:
    """Raise `MigrationsNotAtHeadError` (saying how to fix it) unless the schema is at head.
    A SQLite database file that does not exist is reported without connecting (connecting
    would leave an empty file behind)."""
    database = str(engine.url.database or "")
    if database.startswith("file:") and engine.url.query.get("uri") in ("true", "1"):
        database = database.removeprefix("file:").split("?")[0]  # an SQLite URI's file
    if (
        engine.url.get_backend_name() == "sqlite"
        and database not in ("", ":memory:")
        and engine.url.query.get("mode") != "memory"
        and not Path(database).exists()
    ):
        raise MigrationsNotAtHeadError(
            f"there is no database at {database}; run `fedaudit db upgrade` (with the same "
            "FEDAUDIT_DATABASE_URL / FEDAUDIT_DATA_DIR) and start again"
        )
    current = current_revision(engine)
    head = head_revision()
    if current != head:
        url = engine.url.render_as_string(hide_password=True)
        raise MigrationsNotAtHeadError(
            f"the database {url} is at migration {current or '<none>'} but the code needs {head}; "
            "run `fedaudit db upgrade` (with the same FEDAUDIT_DATABASE_URL / FEDAUDIT_DATA_DIR) "
            "and start again"
        )
