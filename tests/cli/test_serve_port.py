"""`fedaudit serve` on an address another process holds: refused at once, before start-up."""

from __future__ import annotations

import socket
from pathlib import Path

from typer.testing import CliRunner

from service.cli import app


def test_serve_refuses_a_port_in_use_before_any_start_up(tmp_path: Path) -> None:
    from service.config import get_settings

    get_settings.cache_clear()
    data = tmp_path / "data"
    env = {
        "FEDAUDIT_DATA_DIR": str(data),
        "FEDAUDIT_ADMIN_TOKEN": "x" * 40,
        "FEDAUDIT_STARTUP_SWEEP": "true",
    }
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        try:
            result = CliRunner().invoke(
                app, ["serve", "--host", "127.0.0.1", "--port", str(port)], env=env
            )
        finally:
            get_settings.cache_clear()
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert f"cannot serve on 127.0.0.1:{port}: address already in use" in text
    assert "Traceback" not in text
    assert not data.exists()  # no start-up work: no database, no lock, no sweep


def test_a_host_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    from service.config import get_settings

    get_settings.cache_clear()
    env = {"FEDAUDIT_DATA_DIR": str(tmp_path / "data"), "FEDAUDIT_ADMIN_TOKEN": "x" * 40}
    try:
        result = CliRunner().invoke(
            app, ["serve", "--host", "no-such-host.invalid", "--port", "8"], env=env
        )
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 1, result.output
    assert "cannot serve on no-such-host.invalid:8: the host does not resolve" in " ".join(
        result.output.split()
    )
