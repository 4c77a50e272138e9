"""A round closes exactly once, even with concurrent closers on separate engines ("replicas")."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.coordinator import clients, federations, reaper, rounds, updates
from service.coordinator.federation_config import FederationConfigInput
from service.coordinator.resources import Services
from service.store import repositories, tables
from service.store.blobs import write_temp_file
from service.store.session import make_engine, make_sessionmaker
from tests.factories import state_bytes, tiny_state, update_parts

pytestmark = pytest.mark.db


def make_services(settings: Settings) -> Services:
    return Services.create(settings, make_sessionmaker(make_engine(settings.resolved_database_url)))


def staged(settings: Settings, data: bytes) -> updates.StagedUpload:
    path, digest, size = write_temp_file(settings.tmp_dir, data)
    return updates.StagedUpload(path=path, sha256=digest, size=size)


def federation_with_model(
    services: Services,
    session: Session,
    *,
    name: str,
    min_clients: int = 1,
    deadline_s: float = 600,
    config: FederationConfigInput | None = None,
    rounds: int = 3,
) -> tables.Federation:
    """A two-class federation of ``rounds`` rounds (3) with its initial model (no clients)."""
    federation = federations.create_federation(
        session,
        name=name,
        num_classes=2,
        input_shape=[2],
        class_names=None,
        rounds=rounds,
        min_clients=min_clients,
        max_clients=None,
        round_deadline_s=deadline_s,
        config=config
        or FederationConfigInput(method="fedavg", detectors=["fedncl"], primary_detector="fedncl"),
        seed=1,
        actor="admin",
    )
    upload = staged(services.settings, state_bytes(tiny_state(0.0)))
    federations.upload_initial_model(
        services,
        session,
        federation.id,
        staged=upload.path,
        sha256=upload.sha256,
        size=upload.size,
        actor="admin",
    )
    return federation


def prepare_round(
    services: Services, names: list[str], *, min_clients: int = 1, deadline_s: float = 600
):
    """A federation with round 0 open and every client joined: (fid, round id, clients)."""
    with services.sessions.begin() as session:
        federation = federation_with_model(
            services, session, name="race", min_clients=min_clients, deadline_s=deadline_s
        )
        created = [
            federations.add_client(session, federation.id, name=n, actor="admin")[0] for n in names
        ]
        for client in created:
            clients.join(session, client, num_samples=10, class_counts=[5, 5], now=services.clock())
        fid = federation.id
    with services.sessions() as session:
        rnd = rounds.get_round(session, fid, 0)
        return fid, rnd.id, {c.name: c for c in created}


def submit(services: Services, fid, client, value: float, index: int = 0) -> None:
    files = update_parts(tiny_state(value), num_samples=10)
    upload = staged(services.settings, files["state"][1])
    updates.submit_update(
        services,
        client,
        federation_id=fid,
        round_index=index,
        metadata_raw=files["metadata"][1],
        staged=upload,
        idempotency_key=f"{client.name}-{index}",
    )


def complete_round_not_closed(settings: Settings, values: tuple[float, float]):  # noqa: ANN201
    """Services whose worker never runs a close (a crash, or a close the test runs itself) and
    a round in which sites a and b sent updates of these values: complete, still open."""
    settings.close_rounds_inline = False
    services = make_services(settings)
    services.worker.submit_once = lambda key, job: None  # type: ignore[method-assign]
    fid, round_id, members = prepare_round(services, ["a", "b"])
    submit(services, fid, members["a"], values[0])
    submit(services, fid, members["b"], values[1])
    return services, fid, round_id, members


def test_concurrent_closers_close_once(settings: Settings) -> None:
    # the closers race below
    primary, fid, round_id, members = complete_round_not_closed(settings, (1.0, 3.0))

    replicas = [make_services(settings) for _ in range(4)]
    results: list[bool] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def closer(services: Services) -> None:
        barrier.wait()
        try:
            results.append(rounds.close_round(services, round_id, reason="complete"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=closer, args=(replicas[i % 4],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors, errors
    assert sorted(results) == [False] * 7 + [True]
    with primary.sessions() as session:
        versions = session.scalar(
            select(func.count())
            .select_from(tables.ModelVersion)
            .where(tables.ModelVersion.federation_id == fid)
        )
        audits = session.scalar(select(func.count()).select_from(tables.AuditResult))
        opened = session.scalars(
            select(tables.Round.index).where(tables.Round.federation_id == fid)
        ).all()
        closed_events = session.scalar(
            select(func.count())
            .select_from(tables.Event)
            .where(tables.Event.kind == "round.closed")
        )
    assert versions == 2  # the initial model and round 0's output
    assert audits == 1
    assert sorted(opened) == [0, 1]
    assert closed_events == 1
    for services in [primary, *replicas]:
        services.close()


def test_deadline_closes_with_min_clients_or_extends(settings: Settings) -> None:
    services = make_services(settings)
    fid, round_id, members = prepare_round(services, ["a", "b", "c"], min_clients=2, deadline_s=30)
    opened = services.clock()

    # Nobody submitted and the deadline passed: the deadline is extended and recorded.
    services.clock = lambda: opened + timedelta(seconds=31)
    assert reaper.check_rounds(services) == []
    with services.sessions() as session:
        rnd = session.get(tables.Round, round_id)
        assert rnd.state == "open"
        assert rnd.deadline_extensions == 1
        assert rnd.deadline_at == opened + timedelta(seconds=61)  # now (31 s) + the 30 s deadline
        kinds = session.scalars(select(tables.Event.kind)).all()
    assert "round.deadline_extended" in kinds

    # Two of three submit (min_clients = 2); at the new deadline the round closes without c.
    services.clock = lambda: opened + timedelta(seconds=32)
    submit(services, fid, members["a"], 1.0)
    submit(services, fid, members["b"], 1.0)
    assert reaper.check_rounds(services) == []  # not yet at the extended deadline
    services.clock = lambda: opened + timedelta(seconds=120)
    assert reaper.check_rounds(services) == [round_id]
    with services.sessions() as session:
        rnd = session.get(tables.Round, round_id)
        assert rnd.state == "closed"
        assert rnd.state_reason == "deadline"
        assert set(rnd.aggregation_weights or {}) == {str(members["a"].id), str(members["b"].id)}
    services.close()


def test_reaper_resumes_a_complete_round_after_restart(settings: Settings, tmp_path: Path) -> None:
    """Updates accepted but the close never ran (crash): a new process's checker closes it."""
    # the crash: the close never runs
    before_crash, fid, round_id, members = complete_round_not_closed(settings, (1.0, 1.0))
    before_crash.close()

    after_restart = make_services(settings)
    assert reaper.check_rounds(after_restart) == [round_id]
    with after_restart.sessions() as session:
        assert session.get(tables.Round, round_id).state == "closed"
    after_restart.close()


def test_two_replicas_extend_a_starved_round_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica B reads the expired round, then A's checker extends it before B takes the lock:
    B must see the new deadline and leave it (one extension, one event), not extend it again."""
    replica_a, replica_b = make_services(settings), make_services(settings)
    _, round_id, _ = prepare_round(replica_a, ["a", "b"], min_clients=2, deadline_s=30)
    later = replica_a.clock() + timedelta(seconds=31)
    replica_a.clock = replica_b.clock = lambda: later
    touch = repositories.touch_open_round
    interleaved: list[str | None] = []

    def a_extends_first(session: Session, rid: uuid.UUID) -> bool:
        if not interleaved:
            interleaved.append("a")
            worker = threading.Thread(
                target=lambda: interleaved.append(reaper._deadline_action(replica_a, rid))
            )
            worker.start()
            worker.join(timeout=60)
        return touch(session, rid)

    monkeypatch.setattr(repositories, "touch_open_round", a_extends_first)
    assert reaper._deadline_action(replica_b, round_id) is None
    assert interleaved == ["a", None]  # A ran in between (and extended)
    with replica_a.sessions() as session:
        rnd = session.get(tables.Round, round_id)
        assert rnd.deadline_extensions == 1
        assert rnd.deadline_at == later + timedelta(seconds=30)
        extended = session.scalar(
            select(func.count())
            .select_from(tables.Event)
            .where(tables.Event.kind == "round.deadline_extended")
        )
    assert extended == 1
    replica_a.close()
    replica_b.close()


def test_a_close_that_fails_after_an_admin_stop_leaves_the_stop(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close raises, and before its failure is recorded an admin stops the federation: the
    federation stays stopped with the admin's reason (not failed with the close's error)."""
    from service.coordinator import audits

    # closed below
    services, fid, round_id, members = complete_round_not_closed(settings, (1.0, 3.0))

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("boom")

    record_failure = rounds._mark_failed

    def stopped_first(services_: Services, rid: uuid.UUID, reason: str) -> None:
        federations.stop(services, fid, reason="enough", actor="admin")
        record_failure(services_, rid, reason)

    monkeypatch.setattr(audits, "audit_round", broken)
    monkeypatch.setattr(rounds, "_mark_failed", stopped_first)
    with pytest.raises(ValueError, match="boom"):
        rounds.close_round(services, round_id, reason="complete")
    with services.sessions() as session:
        federation = session.get(tables.Federation, fid)
        rnd = session.get(tables.Round, round_id)
        kinds = session.scalars(select(tables.Event.kind)).all()
    assert (federation.status, federation.status_reason) == (
        "stopped",
        "stopped by the admin: enough",
    )
    assert rnd.state == "failed"
    assert rnd.state_reason == "the federation was stopped by the admin: enough"
    assert "round.failed" not in kinds
    services.close()
