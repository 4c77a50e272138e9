"""Killing the coordinator (SIGKILL) during an upload leaves nothing behind after the restart.

A real coordinator process on a loopback port receives an upload whose body stops half-way (the
sender waits); the process is killed while the staged ``upload-*.part`` file is on disk. A blob
that no row references is also planted, as a kill between a blob's rename and its row's commit
would leave it. After the restart: no ``.part`` file, no blob without a row, every blob a row
references still there, and the interrupted site's upload goes through on retry.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from client_sdk import AdminClient, FederationClient
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_federation_e2e import create_federation, submit_round, tiny_data

pytestmark = [pytest.mark.slow, pytest.mark.db]

BOUNDARY = "leftovers-boundary"


def blob_keys(data_dir: Path) -> set[str]:
    root = data_dir / "blobs"
    return {p.name for p in root.glob("??/*") if p.is_file()}


def part_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("tmp/*.part")) + sorted(data_dir.glob("blobs/.tmp/*.part"))


def stalled_upload(release: threading.Event) -> Iterator[bytes]:
    """A multipart update whose state part stops after 3 MiB until `release` is set."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n'
        '{"num_samples": 40}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="state"; '
        'filename="state.safetensors"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    yield head
    for _ in range(3):
        yield b"\0" * (1024 * 1024)
    release.wait(60)
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def joined_federation(server: CoordinatorProcess, names: list[str]) -> tuple[Any, dict[str, str]]:
    """A two-round federation of ``names``, every site joined with tiny_data's counts."""
    with AdminClient(server.url, server.admin_token) as admin:
        federation, tokens = create_federation(admin, names, rounds=2)
    for seed, name in enumerate(names):
        counts = torch.bincount(tiny_data(seed).labels, minlength=2).tolist()
        with FederationClient(server.url, tokens[name]) as client:
            client.join(federation.id, num_samples=40, class_counts=counts)
    return federation, tokens


def post_stalled_upload(
    server: CoordinatorProcess, federation_id: Any, token: str, release: threading.Event
) -> httpx.Response:
    """Round 0's update of the site holding ``token``, its body stalled until ``release``."""
    return httpx.post(
        f"{server.url}/api/v1/federations/{federation_id}/rounds/0/updates",
        content=stalled_upload(release),
        headers={
            "Authorization": f"Bearer {token}",
            "Idempotency-Key": "b-0",
            "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        },
        timeout=60,
    )


def test_kill_during_upload_leaves_no_part_file_and_no_orphan_blob(
    tmp_path: Path, database_url: str
) -> None:
    names = ["a", "b", "c"]
    data_dir = tmp_path / "coord"
    server = CoordinatorProcess(data_dir, database_url=database_url)
    server.start()
    release = threading.Event()
    try:
        federation, tokens = joined_federation(server, names)
        assert submit_round(server, federation.id, tokens["a"], 0) == 0  # acknowledged
        referenced = blob_keys(data_dir)
        assert len(referenced) == 2  # the initial model and a's update

        errors: list[BaseException] = []

        def upload() -> None:
            try:
                post_stalled_upload(server, federation.id, tokens["b"], release)
            except httpx.TransportError as exc:  # the server died under it: expected
                errors.append(exc)

        sender = threading.Thread(target=upload)
        sender.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            staged = list(data_dir.glob("tmp/upload-*.part"))
            if staged and staged[0].stat().st_size >= 1024 * 1024:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the upload was never staged:\n{server.log_tail()}")

        server.kill()  # SIGKILL mid-upload: no handler runs
        release.set()
        sender.join(30)
        assert errors, "the upload should have been cut off by the kill"
        assert list(data_dir.glob("tmp/upload-*.part")), "the kill left the staged upload"

        # what a kill between a blob's rename and its row's commit leaves
        orphan_bytes = b"a blob no row references"
        orphan = hashlib.sha256(orphan_bytes).hexdigest()
        (data_dir / "blobs" / orphan[:2]).mkdir(exist_ok=True)
        (data_dir / "blobs" / orphan[:2] / orphan).write_bytes(orphan_bytes)
        (data_dir / "tmp" / "state-1-abc.safetensors.part").write_bytes(b"half an aggregate")

        server.start()  # same data directory and database
        assert part_files(data_dir) == []
        assert blob_keys(data_dir) == referenced  # the orphan went, the referenced stayed

        with AdminClient(server.url, server.admin_token) as admin:
            round0 = admin.get_round(federation.id, 0)
            assert round0.state == "open"
            assert len(round0.submitted_clients) == 1
            assert admin.download_model(round0.model_in_id)  # still readable
        assert submit_round(server, federation.id, tokens["b"], 1) == 0  # the retry goes through
        assert len(blob_keys(data_dir)) == 3
    finally:
        release.set()
        server.stop()


def test_a_second_coordinator_on_a_live_data_directory_leaves_its_uploads_alone(
    tmp_path: Path, database_url: str
) -> None:
    # A first-use trial started `fedaudit serve` twice on one data directory: the second one's
    # start-up sweep removed the first one's staged upload as a crash's leftover. Now the
    # sweep runs only where no other coordinator process serves the directory.
    names = ["a", "b", "c"]
    data_dir = tmp_path / "coord"
    first = CoordinatorProcess(data_dir, database_url=database_url)
    first.start()
    second = CoordinatorProcess(data_dir, database_url=database_url, admin_token=first.admin_token)
    release = threading.Event()
    try:
        federation, tokens = joined_federation(first, names)
        answers: list[int] = []

        def upload() -> None:
            response = post_stalled_upload(first, federation.id, tokens["b"], release)
            answers.append(response.status_code)

        sender = threading.Thread(target=upload)
        sender.start()
        deadline = time.monotonic() + 30
        while not list(data_dir.glob("tmp/upload-*.part")) and time.monotonic() < deadline:
            time.sleep(0.05)
        staged = list(data_dir.glob("tmp/upload-*.part"))
        assert staged, f"the upload was never staged:\n{first.log_tail()}"

        second.start()  # the same data directory and database, another port
        assert "start-up sweep skipped" in second.log_tail()
        assert all(path.exists() for path in staged), "the second start-up removed the upload"
        second.stop()

        release.set()
        sender.join(30)
        # the body ends where the state's bytes do: a malformed state, refused, not lost
        assert len(answers) == 1
        assert answers[0] in (400, 413, 422), answers
        assert part_files(data_dir) == []  # the first coordinator cleaned up after itself
    finally:
        release.set()
        second.stop()
        first.stop()
