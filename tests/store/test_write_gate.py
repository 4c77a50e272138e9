"""The SQLite engine's write gate (`service.store.session.WriteGate`): a transaction takes it at
its first write and gives it back however it ends; reads never take it; many threads writing at
once all get through, one transaction at a time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, func, insert, select, update
from sqlalchemy.orm import Session

from service.store.session import WriteGate, make_engine, make_sessionmaker, write_gate

metadata = MetaData()
counter = Table("counter", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'gate.db'}", pool_size=2, max_overflow=8)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(counter).values(id=1, n=0))
    return engine


def gate_of(engine: Engine) -> WriteGate:
    gate = write_gate(engine)
    assert gate is not None
    return gate


def test_a_transaction_holds_the_gate_from_its_first_write_to_its_commit(engine: Engine) -> None:
    gate = gate_of(engine)
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        session.execute(select(counter.c.n))
        assert not gate.held  # a read does not take it
        session.execute(update(counter).values(n=counter.c.n + 1))
        assert gate.held
        session.execute(update(counter).values(n=counter.c.n + 1))  # nor twice
    assert not gate.held
    with sessions() as session:
        assert session.scalar(select(counter.c.n)) == 2


def test_the_gate_is_given_back_on_rollback_and_when_the_session_just_closes(
    engine: Engine,
) -> None:
    gate = gate_of(engine)
    sessions = make_sessionmaker(engine)
    with pytest.raises(RuntimeError), sessions.begin() as session:
        session.execute(update(counter).values(n=5))
        assert gate.held
        raise RuntimeError("the use case fails half-way")
    assert not gate.held
    session = Session(engine)
    session.execute(update(counter).values(n=7))
    assert gate.held
    session.close()  # no commit: the pool rolls the connection back on its return
    assert not gate.held
    with sessions() as session:
        assert session.scalar(select(counter.c.n)) == 0


def test_the_gate_is_given_back_when_its_connection_is_invalidated(engine: Engine) -> None:
    gate = gate_of(engine)
    with engine.connect() as conn:
        conn.execute(update(counter).values(n=3))
        assert gate.held
        conn.invalidate()  # the DBAPI connection is closed, its transaction lost
        assert not gate.held
    with engine.connect() as conn:
        assert conn.scalar(select(counter.c.n)) == 0


def test_many_threads_writing_at_once_all_get_through(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    threads, per_thread = 16, 20
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def writer() -> None:
        barrier.wait()
        try:
            for _ in range(per_thread):
                with sessions.begin() as session:
                    session.execute(update(counter).values(n=counter.c.n + 1))
                    session.execute(select(func.count()).select_from(counter))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=writer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not errors, errors
    assert not gate_of(engine).held
    with sessions() as session:
        assert session.scalar(select(counter.c.n)) == threads * per_thread


def test_each_sqlite_engine_has_its_own_gate_and_postgresql_none(tmp_path: Path) -> None:
    one = make_engine(f"sqlite:///{tmp_path / 'one.db'}")
    two = make_engine(f"sqlite:///{tmp_path / 'two.db'}")
    assert write_gate(one) is not None
    assert write_gate(two) is not None
    assert write_gate(one) is not write_gate(two)
    # creating an engine connects to nothing: no server is needed here
    assert write_gate(make_engine("postgresql://nobody@127.0.0.1:1/none")) is None
