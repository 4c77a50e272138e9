"""A real coordinator in a child process on a loopback port (simulations, demo, e2e tests).

The child is exactly what an operator runs: ``fedaudit db upgrade`` then ``fedaudit serve``,
configured through ``FEDAUDIT_*`` environment variables. `kill()` sends SIGKILL, which is how the
crash tests simulate a power cut.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CoordinatorStartError(RuntimeError):
    """The coordinator process did not become ready; the message ends with its log."""


class PortTakenError(CoordinatorStartError):
    """The port was bound by another process before the coordinator could bind it."""


PORT_ATTEMPTS = 5
"""Ports tried when the port is chosen here (:class:`PortTakenError` on each but the last)."""

_ADDRESS_IN_USE = "address already in use"


class CoordinatorProcess:
    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        admin_token: str | None = None,
        database_url: str | None = None,
        reaper_interval_s: float = 0.5,
        extra_env: dict[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        workers: int = 1,
    ) -> None:
        self.data_dir = data_dir
        # a port chosen here may be taken by another process before the child binds it (parallel
        # test workers, simulations side by side): start() then tries another; a given one is kept
        self._choose_port = port is None
        self.port = port or free_port()
        self.admin_token = admin_token or secrets.token_urlsafe(24)
        self.database_url = database_url
        self.reaper_interval_s = reaper_interval_s
        self.extra_env = extra_env or {}
        self.startup_timeout_s = startup_timeout_s
        self.workers = workers
        self.log_path = data_dir / "coordinator.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "FEDAUDIT_DATA_DIR": str(self.data_dir),
            "FEDAUDIT_ADMIN_TOKEN": self.admin_token,
            "FEDAUDIT_REAPER_INTERVAL_S": str(self.reaper_interval_s),
            "FEDAUDIT_LOG_LEVEL": "WARNING",
            **self.extra_env,
        }
        if self.database_url:
            env["FEDAUDIT_DATABASE_URL"] = self.database_url
        return env

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "service.cli", "db", "upgrade"],
            env=self._env(),
            check=True,
            capture_output=True,
        )
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._spawn()
                return
            except PortTakenError:
                if not self._choose_port or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = free_port()

    def _spawn(self) -> None:
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
            ],
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._wait_ready(log_start)

    def _wait_ready(self, log_start: int) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        foreign = False
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                if _ADDRESS_IN_USE in self._log_since(log_start).lower():
                    raise PortTakenError(f"port {self.port} was taken:\n{self.log_tail()}")
                raise CoordinatorStartError(
                    f"coordinator exited with {self._process.returncode}:\n{self.log_tail()}"
                )
            if not foreign:
                try:
                    if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                        # ready, and ours? Another coordinator on this port refuses our admin
                        # token: asked once (its sign-in throttle counts failures), then our
                        # child is left to fail its bind and exit
                        if self._answers_to_our_token():
                            return
                        foreign = True
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        self.kill()
        raise CoordinatorStartError(
            f"coordinator not ready after {self.startup_timeout_s}s:\n{self.log_tail()}"
        )

    def _answers_to_our_token(self) -> bool:
        response = httpx.get(
            f"{self.url}/api/v1/federations",
            params={"limit": 1},
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=2,
        )
        return response.status_code == 200

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run (a crash)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=30)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
