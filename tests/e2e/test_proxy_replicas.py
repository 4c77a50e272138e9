"""Two replicas behind nginx, configured by the repository's own proxy file.

`docker/nginx/fedaudit-replicas.conf` is what the compose profile "replicas" puts in front of
two coordinators. Here a local nginx runs that file (its upstream pointed at two local
`fedaudit serve` processes on one PostgreSQL database, the compose-only lines dropped) and the
sites talk to the proxy only: uploads larger than nginx's default body limit (the test fails
with that default), a long-poll parked on the proxy and answered when the round closes, requests
spread over both replicas, and a replica killed mid-round (0.2 s after five sites start their
uploads; whether an upload is cut then depends on timing, and the SDK retries it) that costs no
acknowledged update.
Without nginx the tests are skipped and say so; ``FEDAUDIT_REQUIRE_PROXY=1`` (CI, where
`scripts/install-nginx` installs Debian's package) makes that a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from client_sdk import AdminClient, CurrentRound, FederationClient, UpdateReceipt
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.replica_checks import stored_round0
from tests.factories import federation_spec, signals, state_bytes, tiny_state

pytestmark = [pytest.mark.slow, pytest.mark.db]

CONF = Path(__file__).resolve().parents[2] / "docker" / "nginx" / "fedaudit-replicas.conf"
BIG = 700_000
"""Entries of the extra float32 tensor: updates of about 2.8 MB, above nginx's default 1 MiB."""


def _nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_conf(text: str, upstreams: list[str], port: int) -> str:
    """The repository's proxy file for local replicas: upstream servers replaced, the
    compose-only lines dropped, the listen port set."""
    lines = []
    servers = iter(upstreams)
    for line in text.splitlines():
        if line.rstrip().endswith("# compose"):
            continue
        if line.rstrip().endswith("# replica"):
            line = f"    server {next(servers)};"
        lines.append(line)
    body = "\n".join(lines)
    body, listens = re.subn(r"listen 8080;", f"listen 127.0.0.1:{port};", body)
    assert listens == 1, "the proxy file's listen line changed: update this test"
    assert next(servers, None) is None, "the proxy file names fewer replicas than started"
    return body


@pytest.fixture
def proxy(tmp_path: Path, replicas: tuple[CoordinatorProcess, ...]) -> Iterator[str]:
    binary = _nginx()
    if binary is None:
        if os.environ.get("FEDAUDIT_REQUIRE_PROXY") == "1":
            pytest.fail("nginx is required (FEDAUDIT_REQUIRE_PROXY=1): scripts/install-nginx")
        pytest.skip("nginx is not installed (scripts/install-nginx installs Debian's package)")
    port = _free_port()
    upstreams = [r.url.removeprefix("http://").rstrip("/") for r in replicas]
    root = tmp_path / "nginx"
    root.mkdir()
    (root / "fedaudit.conf").write_text(local_conf(CONF.read_text(), upstreams, port))
    temp = " ".join(
        f"{kind}_temp_path {root / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi")
    )
    user = "user root;" if os.geteuid() == 0 else ""
    (root / "nginx.conf").write_text(
        f"{user} daemon off; worker_processes 1; pid {root}/nginx.pid;\n"
        f"error_log {root}/error.log warn; events {{ worker_connections 512; }}\n"
        "http { log_format up '$request_method $uri $status $upstream_addr';\n"
        f"access_log {root}/access.log up; {temp} scgi_temp_path {root}/scgi;\n"
        f"include {root}/fedaudit.conf; }}\n"
    )
    check = subprocess.run(
        [binary, "-t", "-p", str(root), "-c", str(root / "nginx.conf")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    process = subprocess.Popen([binary, "-p", str(root), "-c", str(root / "nginx.conf")])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (root / "error.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        (tmp_path / "access.log").write_text((root / "access.log").read_text())


def big_state(value: float) -> dict[str, np.ndarray]:
    return {**tiny_state(value), "extra.weight": np.full(BIG, value, dtype=np.float32)}


def setup(url: str, token: str, names: list[str]) -> tuple[uuid.UUID, dict[str, str]]:
    with AdminClient(url, token) as admin:
        spec = federation_spec(f"proxy-{uuid.uuid4().hex[:6]}", min_clients=len(names))
        federation = admin.create_federation(spec)
        admin.upload_initial_model(federation.id, state_bytes(big_state(0.0)))
        tokens = {name: admin.add_client(federation.id, name).token for name in names}
    for name in names:
        with FederationClient(url, tokens[name], max_retries=0) as client:
            client.join(federation.id, num_samples=10, class_counts=[5, 5])
    return federation.id, tokens


def upload(url: str, fid: uuid.UUID, token: str, name: str) -> UpdateReceipt:
    # the SDK's retries on (502, 503, 504 and lost connections), as a site runs it
    with FederationClient(url, token, max_retries=8, backoff_base_s=0.2) as client:
        return client.submit_update(
            fid,
            0,
            state=state_bytes(big_state(float(len(name)))),
            num_samples=10,
            signals=signals(10),
            idempotency_key=f"{name}-0",
        )


def test_sites_work_through_the_proxy_on_both_replicas(
    proxy: str, replicas: tuple[CoordinatorProcess, ...], database_url: str, tmp_path: Path
) -> None:
    names = ["p", "q", "r", "s"]
    fid, tokens = setup(proxy, replicas[0].admin_token, names)
    # a long-poll through the proxy, parked before the round it waits for exists
    waited: dict[str, CurrentRound] = {}
    answered: list[float] = []

    def poll() -> None:
        with FederationClient(proxy, tokens["p"], max_retries=0) as client:
            waited["answer"] = client.get_current_round(fid, wait_s=30)
        answered.append(time.monotonic())

    receipts = {name: upload(proxy, fid, tokens[name], name) for name in names[:3]}
    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.0)
    receipts["s"] = upload(proxy, fid, tokens["s"], "s")  # the last update: round 0 closes
    closed = time.monotonic()
    thread.join(timeout=60)
    # woken by the close (the replicas' notifier), not by its 15 s re-check or its 30 s wait
    assert answered
    assert answered[0] - closed < 10.0
    answer = waited["answer"]
    assert answer.status == "train", answer
    assert answer.round is not None
    assert answer.round.index == 1
    stored = stored_round0(database_url, fid)
    assert sorted(r[0] for r in stored) == sorted(r.id for r in receipts.values())
    assert len({r[1] for r in stored}) == len(names)
    served = {line.split()[-1] for line in (proxy_log(tmp_path)) if " 20" in line}
    replica_addresses = {r.url.removeprefix("http://").rstrip("/") for r in replicas}
    assert replica_addresses <= served, served  # least_conn spread the requests


def proxy_log(tmp_path: Path) -> list[str]:
    return (tmp_path / "nginx" / "access.log").read_text().splitlines()


def test_a_replica_killed_mid_round_behind_the_proxy_loses_nothing(
    proxy: str, replicas: tuple[CoordinatorProcess, ...], database_url: str
) -> None:
    a, _ = replicas
    names = [f"site-{i}" for i in range(6)]
    fid, tokens = setup(proxy, a.admin_token, names)
    receipts: dict[str, UpdateReceipt] = {}
    errors: list[BaseException] = []

    def site(name: str) -> None:
        try:
            receipts[name] = upload(proxy, fid, tokens[name], name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    site(names[0])
    threads = [threading.Thread(target=site, args=(name,)) for name in names[1:]]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    a.kill()  # mid-round: five uploads started through the proxy (some may be cut: retried)
    for thread in threads:
        thread.join(timeout=180)
    assert not errors, errors
    assert set(receipts) == set(names)
    stored = stored_round0(database_url, fid)
    assert sorted(r[0] for r in stored) == sorted(r.id for r in receipts.values())
    assert len({r[1] for r in stored}) == len(names)  # one update per site, none twice
    with FederationClient(proxy, tokens[names[0]], max_retries=8, backoff_base_s=0.2) as client:
        current = client.get_current_round(fid, wait_s=30)
    assert current.status == "train"
    assert current.round is not None
    assert current.round.index == 1
