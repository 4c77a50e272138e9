"""Retention end to end (issue 22, point 4): a real coordinator process (uvicorn on a loopback
port, SQLite, blobs as files under its data directory) and real SDK sites training tiny torch
models. What retention removes and keeps is read from outside only: the HTTP API, the
``fedaudit`` command in a child process, and the files in the data directory's ``blobs/``.

1. Without ``FEDAUDIT_RETENTION_ROUNDS`` nothing is pruned; ``fedaudit prune --dry-run`` changes
   nothing on disk; ``fedaudit prune --keep-rounds 2`` removes the update blobs of the older
   rounds and keeps every global model and the updates of the last two rounds; the report, the
   ``fedaudit report`` command and the global models' downloads still work, what needs a pruned
   update answers 410.
2. A coordinator started with ``FEDAUDIT_RETENTION_ROUNDS=2`` prunes by itself as rounds close:
   after each close the update blobs on disk are those of the last two rounds only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from client_sdk import AdminClient, APIStatusError, FederationClient, Participant
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_federation_e2e import create_federation, tiny_data, tiny_model

pytestmark = pytest.mark.slow

SITES = ["site-a", "site-b", "site-c"]


def blob_files(data_dir: Path) -> dict[str, tuple[int, int]]:
    """The blobs on disk (``blobs/<key[:2]>/<key>``): key -> (size, mtime in ns)."""
    found = {}
    for path in (data_dir / "blobs").glob("??/*"):
        if path.is_file() and len(path.name) == 64 and path.name.startswith(path.parent.name):
            stat = path.stat()
            found[path.name] = (stat.st_size, stat.st_mtime_ns)
    return found


def run_sites(
    server: CoordinatorProcess,
    federation_id: uuid.UUID,
    tokens: dict[str, str],
    *,
    on_round: Callable[[Any], None] | None = None,
) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start one thread per site running the Participant loop; its errors land in the list."""
    errors: list[BaseException] = []

    def site(seed: int, name: str) -> None:
        try:
            with FederationClient(server.url, tokens[name]) as client:
                Participant(
                    client,
                    federation_id,
                    tiny_model(seed),
                    tiny_data(seed, n=24),
                    device="cpu",
                    on_round=on_round,
                ).run()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    # Daemons: a site left retrying a coordinator that a failed test stopped must not hang pytest.
    threads = [threading.Thread(target=site, args=(i, n), daemon=True) for i, n in enumerate(SITES)]
    for thread in threads:
        thread.start()
    return threads, errors


def join_all(sites: tuple[list[threading.Thread], list[BaseException]]) -> None:
    threads, errors = sites
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a site did not finish"
    assert not errors, errors


def update_blobs(admin: AdminClient, federation_id: uuid.UUID) -> dict[int, dict[str, str]]:
    """Round index -> {update id: sha256} of every accepted update, from the event trail."""
    indices = {r.id: r.index for r in admin.list_rounds(federation_id)}
    by_round: dict[int, dict[str, str]] = {}
    for event in admin.list_events(federation_id, kind="update.accepted"):
        assert event.round_id is not None
        by_round.setdefault(indices[event.round_id], {})[event.data["update_id"]] = event.data[
            "sha256"
        ]
    return by_round


def global_blobs(admin: AdminClient, federation_id: uuid.UUID) -> dict[str, str]:
    """Global model id -> sha256: the initial model and each round's aggregate."""
    return {m["id"]: m["sha256"] for m in admin.get_json(f"/federations/{federation_id}/models")}


def fedaudit(server: CoordinatorProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``fedaudit`` command, as an operator runs it, in a child process."""
    env = {
        **os.environ,
        "FEDAUDIT_URL": server.url,
        "FEDAUDIT_ADMIN_TOKEN": server.admin_token,
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def downloads(admin: AdminClient, model_id: str) -> int:
    """The HTTP status of a model download."""
    try:
        admin.download_model(model_id)
    except APIStatusError as exc:
        return exc.status_code
    return 200


def test_prune_by_hand_removes_old_update_blobs_and_keeps_the_global_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEDAUDIT_RETENTION_ROUNDS", raising=False)
    data_dir = tmp_path / "coord"
    with CoordinatorProcess(data_dir) as server:
        with AdminClient(server.url, server.admin_token, max_retries=0) as admin:
            federation, tokens = create_federation(admin, SITES, rounds=4)
            join_all(run_sites(server, federation.id, tokens))
            assert admin.get_federation(federation.id).status == "finished"

            updates = update_blobs(admin, federation.id)
            globals_ = global_blobs(admin, federation.id)
            assert sorted(updates) == [0, 1, 2, 3]
            assert all(len(u) == 3 for u in updates.values())
            assert len(globals_) == 5  # the initial model and the aggregates of rounds 0-3
            every_update = {sha for u in updates.values() for sha in u.values()}
            assert len(every_update) == 12  # every update is its own blob
            on_disk = blob_files(data_dir)
            # Retention unset: nothing was pruned, every update's blob is there.
            assert set(on_disk) == every_update | set(globals_.values())
            report_before = admin.get_json(f"/federations/{federation.id}/report")

            # A dry run says what would go and changes nothing on disk or in the API.
            dry = fedaudit(server, "prune", str(federation.id), "--keep-rounds", "2", "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert "would prune 6 update(s) of rounds 0, 1" in dry.stdout
            dry_json = fedaudit(
                server, "prune", str(federation.id), "--keep-rounds", "2", "--dry-run", "--json"
            )
            assert dry_json.returncode == 0, dry_json.stderr
            planned = json.loads(dry_json.stdout)
            assert planned["dry_run"] is True
            assert planned["pruned"]["rounds"] == [0, 1]
            assert planned["pruned"]["updates"] == 6
            assert planned["pruned"]["blobs"] == 6
            assert blob_files(data_dir) == on_disk  # same files, sizes and mtimes
            for index in (0, 1):
                assert admin.get_round(federation.id, index).pruned_clients == []
            for update_id in updates[0]:
                assert downloads(admin, update_id) == 200
            assert not admin.list_events(federation.id, kind="federation.pruned")

            # The prune itself.
            done = fedaudit(server, "prune", str(federation.id), "--keep-rounds", "2")
            assert done.returncode == 0, done.stderr
            assert "pruned 6 update(s) of rounds 0, 1 (6 blob(s)" in done.stdout
            assert "(rounds 2, 3)" in done.stdout
            assert "5 global model(s)" in done.stdout

            left = blob_files(data_dir)
            gone = {sha for i in (0, 1) for sha in updates[i].values()}
            kept = {sha for i in (2, 3) for sha in updates[i].values()} | set(globals_.values())
            assert set(left) == kept  # exactly: the old update blobs went, nothing else did
            assert not gone & set(left)
            for key in kept:  # and what stayed is untouched
                assert left[key] == on_disk[key]

            # Through the API: pruned updates answer 410, kept ones and global models serve.
            for index in (0, 1):
                for update_id in updates[index]:
                    assert downloads(admin, update_id) == 410
                pruned = admin.get_round(federation.id, index).pruned_clients
                assert len(pruned) == 3
            for index in (2, 3):
                for update_id in updates[index]:
                    assert downloads(admin, update_id) == 200
                assert admin.get_round(federation.id, index).pruned_clients == []
            for model_id, sha in globals_.items():
                assert hashlib.sha256(admin.download_model(model_id)).hexdigest() == sha

            # The report reads audit results and kept signals only: unchanged, and the command
            # prints it.
            assert admin.get_json(f"/federations/{federation.id}/report") == report_before
            printed = fedaudit(server, "report", str(federation.id))
            assert printed.returncode == 0, printed.stderr
            for name in SITES:
                assert name in printed.stdout
            as_json = fedaudit(server, "report", str(federation.id), "--json")
            assert as_json.returncode == 0, as_json.stderr
            assert {row["name"] for row in json.loads(as_json.stdout)["clients"]} == set(SITES)

            # A what-if of a pruned round is refused (410); of a kept round it still runs.
            whatif = f"/federations/{federation.id}/rounds/%d/recompute"
            with pytest.raises(APIStatusError) as refused:
                admin.post_json(whatif % 0, {"audit": {}})
            assert refused.value.status_code == 410
            replay = admin.post_json(whatif % 3, {"audit": {}})
            assert replay["distance_to_actual_model"]["total"] == pytest.approx(0.0, abs=1e-5)

            # One event says what went; pruning again with the same N removes nothing more.
            events = admin.list_events(federation.id, kind="federation.pruned")
            assert len(events) == 1
            assert events[0].data["pruned"]["updates"] == 6
            again = fedaudit(server, "prune", str(federation.id), "--keep-rounds", "2", "--json")
            assert again.returncode == 0, again.stderr
            assert json.loads(again.stdout)["pruned"]["updates"] == 0
            assert json.loads(again.stdout)["kept"]["already_pruned"] == 6
            assert blob_files(data_dir) == left


def closed(admin: AdminClient, federation_id: uuid.UUID, index: int) -> bool:
    return any(r.index == index and r.state == "closed" for r in admin.list_rounds(federation_id))


def test_retention_setting_prunes_at_each_round_close(tmp_path: Path) -> None:
    data_dir = tmp_path / "coord"
    rounds = 5
    server = CoordinatorProcess(data_dir, extra_env={"FEDAUDIT_RETENTION_ROUNDS": "2"})
    # Each site waits after its upload of round r until the main thread has looked at the disk
    # once round r closed, so what it sees is exactly the state after that close.
    looked = [threading.Event() for _ in range(rounds)]

    def hold(summary: Any) -> None:
        looked[summary.round_index].wait(60)

    with server:
        with AdminClient(server.url, server.admin_token, max_retries=0) as admin:
            federation, tokens = create_federation(admin, SITES, rounds=rounds)
            sites = run_sites(server, federation.id, tokens, on_round=hold)
            counts = []
            try:
                for index in range(rounds):
                    deadline = time.monotonic() + 60
                    while not closed(admin, federation.id, index):
                        assert time.monotonic() < deadline, f"round {index} did not close"
                        time.sleep(0.05)
                    updates = update_blobs(admin, federation.id)
                    globals_ = global_blobs(admin, federation.id)
                    on_disk = set(blob_files(data_dir))
                    # Kept: the updates of the last two finished rounds, every global model.
                    recent = {i for i in updates if i > index - 2}
                    kept = {sha for i in recent for sha in updates[i].values()}
                    assert on_disk == kept | set(globals_.values()), index
                    assert len(globals_) == index + 2
                    counts.append(len(on_disk - set(globals_.values())))
                    for i in updates:
                        pruned = admin.get_round(federation.id, i).pruned_clients
                        assert len(pruned) == (3 if i <= index - 2 else 0), (index, i)
                    looked[index].set()
            finally:
                for event in looked:
                    event.set()
            join_all(sites)

            # The update blobs on disk stayed bounded by two rounds' worth as rounds went on.
            assert counts == [3, 6, 6, 6, 6]
            events = admin.list_events(federation.id, kind="federation.pruned")
            assert [e.actor for e in events] == ["system"] * 3  # the closes of rounds 2, 3, 4
            assert [e.data["pruned"]["rounds"] for e in events] == [[0], [1], [2]]
            report = admin.get_json(f"/federations/{federation.id}/report")
            assert {row["name"] for row in report["clients"]} == set(SITES)
            printed = fedaudit(server, "report", str(federation.id))
            assert printed.returncode == 0, printed.stderr
            # `fedaudit prune` without --keep-rounds uses the coordinator's setting: nothing more.
            again = fedaudit(server, "prune", str(federation.id), "--json")
            assert again.returncode == 0, again.stderr
            assert json.loads(again.stdout)["keep_rounds"] == 2
            assert json.loads(again.stdout)["pruned"]["updates"] == 0
