"""The coordinator's logs from a real process: one format for its own lines and uvicorn's, and
one line per audit-trail event (issue 21, point 5)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from client_sdk import AdminClient, FederationClient
from client_sdk.participant import state_to_bytes
from fedaudit_sim.coordinator_process import CoordinatorProcess
from service.store import repositories as repo
from service.store.event_log import EVENT_LOGGER, log_committed_events
from service.store.session import make_engine
from tests.e2e.test_federation_e2e import tiny_model

pytestmark = pytest.mark.slow

SPEC = {
    "name": "logs",
    "task": {"num_classes": 2, "input_shape": [4]},
    "plan": {"rounds": 1, "min_clients": 1},
    "config": {"method": "fedavg"},
}


def _run_a_little(server: CoordinatorProcess) -> tuple[str, str, str]:
    """Create a federation, add a site, let it join (round 0 opens): (federation, site) ids."""
    with AdminClient(server.url, server.admin_token) as admin:
        federation = admin.create_federation(SPEC)
        admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
        created = admin.add_client(federation.id, "site-a")
    with FederationClient(server.url, created.token) as client:
        client.join(federation.id, num_samples=10, class_counts=[5, 5])
    return str(federation.id), str(created.id), created.token


def test_json_logs_are_json_and_carry_the_events(tmp_path: Path) -> None:
    env = {"FEDAUDIT_LOG_FORMAT": "json", "FEDAUDIT_LOG_LEVEL": "INFO"}
    with CoordinatorProcess(tmp_path / "coord", extra_env=env) as server:
        federation_id, client_id, _ = _run_a_little(server)
    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line, uvicorn's included
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert not any("color_message" in r for r in records)
    loggers = {r["logger"] for r in records}
    assert {"uvicorn.error", "uvicorn.access", "fedaudit.events"} <= loggers
    events = {r["event"]: r for r in records if r["logger"] == "fedaudit.events"}
    assert {"federation.created", "client.added", "client.joined", "round.opened"} <= set(events)
    assert events["federation.created"]["federation_id"] == federation_id
    assert events["client.joined"]["client_id"] == client_id
    assert events["round.opened"]["round_id"] is not None
    assert events["round.opened"]["message"].startswith("round.opened: ")
    access = [r["message"] for r in records if r["logger"] == "uvicorn.access"]
    assert any('"POST /api/v1/federations HTTP/1.1" 201' in m for m in access)


def test_text_logs_share_one_format(tmp_path: Path) -> None:
    env = {"FEDAUDIT_LOG_FORMAT": "text", "FEDAUDIT_LOG_LEVEL": "INFO"}
    with CoordinatorProcess(tmp_path / "coord", extra_env=env) as server:
        federation_id, _, token = _run_a_little(server)
        # a site's error message of several lines (as torch writes them) stays one log line
        with FederationClient(server.url, token) as client:
            assert client.report_error(
                federation_id,
                0,
                stage="load",
                error_type="RuntimeError",
                message="Error(s) in loading state_dict for Net:\n\tsize mismatch for fc.weight",
            )
    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    shape = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: .*")
    assert all(shape.fullmatch(line) for line in lines), lines
    error = [line for line in lines if " fedaudit.events: site.error: " in line]
    assert len(error) == 1
    assert error[0].endswith(
        "Error(s) in loading state_dict for Net:\\n\tsize mismatch for fc.weight"
    )
    assert any(
        line.endswith(
            "fedaudit.events: federation.created: federation 'logs' created "
            "(1 rounds, method fedavg)"
        )
        for line in lines
    )
    assert any(" uvicorn.access: " in line for line in lines)
    assert federation_id


def test_an_event_is_logged_when_its_transaction_commits_only(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Straight on the store (each backend): an event added in a transaction that rolls back
    # leaves no line; one that commits leaves one, after the commit.
    engine = make_engine(database_url)
    sessions = sessionmaker(engine)
    log_committed_events()
    caplog.set_level(logging.INFO, logger=EVENT_LOGGER)
    try:
        with sessions() as session:
            repo.add_event(session, kind="client.added", actor="test", message="never")
            assert caplog.records == []  # not before the commit
            session.rollback()
        with sessions() as session:
            repo.add_event(session, kind="client.pinned", actor="test", message="kept")
            assert caplog.records == []
            session.commit()
        # a session closed without committing, then used again: the closed one's event is gone
        reused = sessions()
        repo.add_event(reused, kind="client.added", actor="test", message="never")
        reused.close()
        repo.add_event(reused, kind="client.anchored", actor="test", message="reused")
        reused.commit()
        reused.close()
    finally:
        engine.dispose()
    assert [r.getMessage() for r in caplog.records] == [
        "client.pinned: kept",
        "client.anchored: reused",
    ]
    assert caplog.records[0].__dict__["event"] == "client.pinned"
