"""The migrations create exactly the models' schema, round-trip, and are enforced at start-up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pydantic import SecretStr
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import MigrationsNotAtHeadError
from service.main import create_app
from service.store import (
    stats,
    tables,  # noqa: F401
)
from service.store.base import Base, UTCDateTime, new_id, utcnow
from service.store.migrate import current_revision, downgrade, head_revision, upgrade
from service.store.session import make_engine

pytestmark = pytest.mark.db


def test_migrations_match_models(database_url: str) -> None:
    engine = make_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_upgrade_downgrade_round_trip(database_url: str) -> None:
    engine = make_engine(database_url)
    assert current_revision(engine) == head_revision()
    downgrade(database_url, "base")
    assert current_revision(engine) is None
    upgrade(database_url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_service_refuses_to_start_on_unmigrated_database(tmp_path: Path) -> None:
    def settings(url: str) -> Settings:
        return Settings(
            _env_file=None, data_dir=tmp_path, database_url=url, admin_token=SecretStr("x" * 20)
        )

    plain = settings(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(MigrationsNotAtHeadError, match="fedaudit db upgrade"):
        create_app(plain, run_reaper=False)
    # refused without connecting: no empty database file is left behind (a first-use trial
    # found a 4 KB fedaudit.db where none had been)
    assert not (tmp_path / "empty.db").exists()
    # the same through an SQLite URI (sqlite:///file:...?uri=true)
    with pytest.raises(MigrationsNotAtHeadError, match="there is no database"):
        create_app(settings(f"sqlite:///file:{tmp_path / 'uri.db'}?uri=true"), run_reaper=False)
    assert not (tmp_path / "uri.db").exists()
    # an existing database that is not migrated: refused as well, by its revision
    make_engine(f"sqlite:///{tmp_path / 'empty.db'}").connect().close()
    with pytest.raises(MigrationsNotAtHeadError, match="at migration <none>"):
        create_app(plain, run_reaper=False)


def test_metrics_event_count_reads_the_kind_index(tmp_path: Path) -> None:
    # /metrics groups every event by kind on each scrape; on a migrated database SQLite
    # answers the query repositories.status_counts sends from the covering index, not by
    # scanning the table.
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    upgrade(url)
    engine = make_engine(url)
    sent: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", capture)
    with Session(engine) as session:
        stats.status_counts(session)
    event.remove(engine, "before_cursor_execute", capture)
    (by_kind,) = [q for q in sent if "GROUP BY event.kind" in q]
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {by_kind}").all()
    engine.dispose()
    details = " ".join(str(row[-1]) for row in plan)
    assert "COVERING INDEX ix_event_kind" in details


SEPARATION_GROUPS_REVISION = "7c3e5a2b9d14"


def _federation_audits(url: str) -> dict[str, dict[str, Any] | None]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT name, config FROM federation")).all()
    engine.dispose()
    out: dict[str, dict[str, Any] | None] = {}
    for name, config in rows:
        data = json.loads(config) if isinstance(config, str) else config
        out[name] = data.get("audit")
    return out


def _insert_federations(url: str, configs: dict[str, dict[str, Any]]) -> None:
    """Hand-made federation rows (name -> stored config), as an older version stored them."""
    engine = make_engine(url)
    table = sa.table(
        "federation",
        sa.column("id", sa.Uuid()),
        sa.column("input_shape", sa.JSON()),
        *(sa.column(name) for name in ("name", "num_classes", "rounds")),
        *(sa.column(name) for name in ("min_clients", "round_deadline_s", "seed", "status")),
        sa.column("config", sa.JSON()),
        sa.column("created_at", UTCDateTime()),
        sa.column("updated_at", UTCDateTime()),
    )
    common = {
        "num_classes": 2,
        "input_shape": [4],
        "rounds": 3,
        "min_clients": 2,
        "round_deadline_s": 60.0,
        "seed": 0,
        "status": "running",
        "created_at": utcnow(),
        "updated_at": utcnow(),
    }
    with engine.begin() as connection:
        connection.execute(
            table.insert(),
            [
                {**common, "id": new_id(), "name": name, "config": config}
                for name, config in configs.items()
            ],
        )
    engine.dispose()


def _federation_configs(url: str) -> dict[str, dict[str, Any]]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT name, config FROM federation")).all()
    engine.dispose()
    return {
        name: json.loads(config) if isinstance(config, str) else config for name, config in rows
    }


def test_older_federations_keep_the_majority_rule(database_url: str) -> None:
    # federations stored before the setting existed: one with an audit configuration, one
    # without (a hand-made row); after the upgrade the first runs the rule it was created with
    downgrade(database_url, f"{SEPARATION_GROUPS_REVISION}-1")
    _insert_federations(
        database_url, {"old": {"audit": {"status_m": 2}}, "bare": {"method": "fedavg"}}
    )
    upgrade(database_url, SEPARATION_GROUPS_REVISION)
    audits = _federation_audits(database_url)
    assert audits["old"] == {"status_m": 2, "fednoro_separation_groups": "majority"}
    assert audits["bare"] is None
    downgrade(database_url, f"{SEPARATION_GROUPS_REVISION}-1")
    assert _federation_audits(database_url)["old"] == {"status_m": 2}
    upgrade(database_url)


BOUNDED_INFLUENCE_REVISION = "a4d81f3c6b20"


def test_older_federations_keep_uncapped_weights_and_get_the_drift_check(
    database_url: str,
) -> None:
    downgrade(database_url, f"{BOUNDED_INFLUENCE_REVISION}-1")
    old = {"method": "fedavg", "audit": {"status_m": 2, "aggregation": "fedavg"}}
    _insert_federations(database_url, {"old": old, "bare": {"method": "fedavg"}})
    upgrade(database_url, BOUNDED_INFLUENCE_REVISION)
    configs = _federation_configs(database_url)
    assert configs["old"] == {
        "method": "fedavg",
        "audit": {"status_m": 2, "aggregation": "fedavg", "max_client_weight_factor": None},
        "max_sample_drift": 0.1,
    }
    assert configs["bare"] == {"method": "fedavg"}
    downgrade(database_url, f"{BOUNDED_INFLUENCE_REVISION}-1")
    assert _federation_configs(database_url)["old"] == old
    upgrade(database_url)


STOPPED_REVISION = "f2c8d5a9b614"


def _statuses(url: str) -> dict[str, str]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT name, status FROM federation")).all()
    engine.dispose()
    return dict(rows)


def test_federations_an_admin_stopped_become_stopped(database_url: str) -> None:
    downgrade(database_url, f"{STOPPED_REVISION}-1")
    _insert_federations(database_url, {n: {"method": "fedavg"} for n in ("halted", "broke", "on")})
    engine = make_engine(database_url)
    with engine.begin() as connection:
        for name, reason in (
            ("halted", "stopped by the admin: wrong spec"),
            ("broke", "round 2 failed to close: ValueError: boom"),
        ):
            connection.execute(
                text("UPDATE federation SET status = 'failed', status_reason = :r WHERE name = :n"),
                {"r": reason, "n": name},
            )
    engine.dispose()
    upgrade(database_url, STOPPED_REVISION)
    assert _statuses(database_url) == {"halted": "stopped", "broke": "failed", "on": "running"}
    downgrade(database_url, f"{STOPPED_REVISION}-1")
    assert _statuses(database_url) == {"halted": "failed", "broke": "failed", "on": "running"}
    upgrade(database_url)
