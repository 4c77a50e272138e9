"""The change notifier: thread-safe signals to asyncio waiters, sent only when a commit lands;
what goes to other processes is published inside the committing transaction."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from service.config import Settings
from service.coordinator.notify import LocalNotifier, mark_changed
from service.coordinator.resources import Services
from service.store.blobs import DirectoryBlobStore
from service.store.session import make_engine, make_sessionmaker


class Recorder(LocalNotifier):
    """Records `publish` (to other processes, in the transaction) and `notify` (this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[uuid.UUID] = []
        self.published: list[uuid.UUID] = []
        self.fail_publish = False

    def publish(self, session: Session, federation_id: uuid.UUID) -> None:
        assert session.in_transaction(), "published outside the committing transaction"
        assert federation_id not in self.sent, "published after this process was woken"
        if self.fail_publish:
            raise RuntimeError("the database refused the notification")
        self.published.append(federation_id)

    def notify(self, federation_id: uuid.UUID) -> None:
        self.sent.append(federation_id)
        super().notify(federation_id)


@pytest.mark.anyio
async def test_a_signal_from_another_thread_wakes_the_waiter() -> None:
    notifier = LocalNotifier()
    fid = uuid.uuid4()
    with notifier.subscribe(fid) as changes:
        assert notifier.subscribers(fid) == 1
        threading.Timer(0.1, notifier.notify, args=(fid,)).start()
        assert await changes.wait(10.0) is True
        assert await changes.wait(0.05) is False  # one signal, consumed
    assert notifier.subscribers(fid) == 0


@pytest.mark.anyio
async def test_a_signal_sent_before_the_wait_is_kept_and_others_are_ignored() -> None:
    notifier = LocalNotifier()
    fid = uuid.uuid4()
    with notifier.subscribe(fid) as changes:
        notifier.notify(uuid.uuid4())  # another federation
        assert await changes.wait(0.05) is False
        notifier.notify(fid)  # between the caller's read and its wait
        await asyncio.sleep(0)
        assert await changes.wait(0.0) is True


def test_a_signal_after_the_loop_closed_is_dropped() -> None:
    notifier = LocalNotifier()
    fid = uuid.uuid4()
    loop = asyncio.new_event_loop()

    async def subscribe_and_leave_open() -> None:
        context = notifier.subscribe(fid)
        context.__enter__()

    loop.run_until_complete(subscribe_and_leave_open())
    loop.close()
    notifier.notify(fid)  # no exception: nobody is waiting any more


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    engine = make_engine(settings.resolved_database_url)
    services = Services(
        settings=settings,
        sessions=make_sessionmaker(engine),
        blobs=DirectoryBlobStore(settings.blob_dir),
        notifier=Recorder(),
    )
    yield services
    services.close()


@pytest.mark.db
def test_signals_go_out_on_commit_only(services: Services) -> None:
    recorder = services.notifier
    assert isinstance(recorder, Recorder)
    committed, rolled_back = uuid.uuid4(), uuid.uuid4()

    with services.sessions() as session:
        mark_changed(session, rolled_back)
        assert recorder.sent == []  # nothing before the commit
        session.rollback()
        session.commit()

    def failing_use_case() -> None:
        with services.sessions.begin() as session:
            mark_changed(session, rolled_back)
            raise RuntimeError("the use case failed")

    with pytest.raises(RuntimeError):
        failing_use_case()
    with services.sessions.begin() as session:
        mark_changed(session, committed)
        mark_changed(session, committed)
        assert recorder.sent == []
        assert recorder.published == []  # published by the commit, before its COMMIT
    assert recorder.sent == [committed]
    assert recorder.published == [committed]  # once, for both marks; not the rolled-back ones


@pytest.mark.db
def test_a_savepoint_publishes_in_the_enclosing_transaction_and_wakes_nobody_yet(
    services: Services,
) -> None:
    """A savepoint's release runs the commit events: its marks are published inside the
    enclosing transaction (PostgreSQL delivers them only with it), and this process's waiters
    wait for the outermost commit; the enclosing rollback drops them."""
    recorder = services.notifier
    assert isinstance(recorder, Recorder)
    dropped, kept = uuid.uuid4(), uuid.uuid4()

    with services.sessions() as session:
        with session.begin_nested():
            mark_changed(session, dropped)
        assert recorder.published == [dropped]
        assert recorder.sent == []
        session.rollback()
    assert recorder.sent == []

    with services.sessions.begin() as session:
        mark_changed(session, kept)
        with session.begin_nested():
            pass  # released: publishes what is marked so far
        assert recorder.published == [dropped, kept]
        savepoint = session.begin_nested()
        savepoint.rollback()  # what it held is gone: the commit publishes again (deduplicated)
        assert recorder.sent == []
    assert recorder.published == [dropped, kept, kept]
    assert recorder.sent == [kept]


@pytest.mark.db
def test_a_notification_that_cannot_be_published_fails_the_commit(services: Services) -> None:
    recorder = services.notifier
    assert isinstance(recorder, Recorder)
    recorder.fail_publish = True
    fid = uuid.uuid4()
    with pytest.raises(RuntimeError, match="refused the notification"):
        with services.sessions.begin() as session:
            mark_changed(session, fid)
    assert recorder.sent == []  # nothing committed: nobody woken
    recorder.fail_publish = False
    with services.sessions.begin() as session:
        session.connection()  # a transaction with nothing marked: nothing left over to send
    assert recorder.published == []
    assert recorder.sent == []


@pytest.mark.db
def test_marks_of_a_failed_commit_do_not_leak_into_the_sessions_next_transaction(
    services: Services,
) -> None:
    recorder = services.notifier
    assert isinstance(recorder, Recorder)
    first, second = uuid.uuid4(), uuid.uuid4()
    session = services.sessions()
    try:
        mark_changed(session, first)
        recorder.fail_publish = True
        with pytest.raises(RuntimeError, match="refused the notification"):
            session.commit()
        session.close()  # the failed transaction ends here, without a rollback call
        recorder.fail_publish = False
        # the same Session object, a new transaction: only what it marks is published and sent
        mark_changed(session, second)
        session.commit()
    finally:
        session.close()
    assert recorder.published == [second]
    assert recorder.sent == [second]


@pytest.mark.db
def test_closing_the_services_removes_the_commit_hook(settings: Settings) -> None:
    engine = make_engine(settings.resolved_database_url)
    sessions = make_sessionmaker(engine)
    recorder = Recorder()
    blobs = DirectoryBlobStore(settings.blob_dir)
    Services(settings=settings, sessions=sessions, blobs=blobs, notifier=recorder).close()
    try:
        with sessions.begin() as session:
            mark_changed(session, uuid.uuid4())
    finally:
        engine.dispose()
    assert recorder.sent == []
    assert recorder.published == []
