"""``fedaudit serve``'s directory for prometheus_client's multiprocess mode (issue 21, point 5):
a private one for several workers, removed after; the user's own ``PROMETHEUS_MULTIPROC_DIR``
kept as it is, with a warning when it holds files, and refused when it is not a directory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

# Imported before a test sets PROMETHEUS_MULTIPROC_DIR: prometheus_client chooses at its import
# between values in memory and values in files, for the whole process.
from service.api import prometheus
from service.cli import app
from service.cli.server import _metrics_directory
from service.config import get_settings

VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def test_several_workers_get_a_private_directory_removed_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with _metrics_directory(2):
        path = Path(os.environ[VARIABLE])
        assert path.parent == tmp_path
        assert path.is_dir()
        assert list(path.iterdir()) == []
        assert path.stat().st_mode & 0o777 == 0o700  # private
        (path / "histogram_123.db").write_bytes(b"\0" * 8)  # what a worker leaves
    assert VARIABLE not in os.environ
    assert not path.exists()


def test_one_worker_keeps_its_metrics_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    with _metrics_directory(1):
        assert VARIABLE not in os.environ
    assert prometheus.multiprocess_dir() is None


def test_the_users_directory_is_used_and_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(VARIABLE, str(tmp_path))
    (tmp_path / "counter_1.db").write_bytes(b"\0" * 8)
    with _metrics_directory(2):
        assert os.environ[VARIABLE] == str(tmp_path)
    assert os.environ[VARIABLE] == str(tmp_path)
    assert (tmp_path / "counter_1.db").exists()


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_serve_refuses_a_metrics_directory_that_is_not_one(tmp_path: Path, kind: str) -> None:
    given = {"missing": str(tmp_path / "nowhere"), "file": str(tmp_path / "a-file"), "empty": ""}
    if kind == "file":
        Path(given[kind]).write_text("x")
    env = {
        "FEDAUDIT_DATA_DIR": str(tmp_path / "data"),
        "FEDAUDIT_ADMIN_TOKEN": "t" * 20,
        VARIABLE: given[kind],
    }
    refused = CliRunner().invoke(app, ["serve", "--port", "0", "--workers", "2"], env=env)
    assert refused.exit_code == 1
    message = " ".join(refused.output.split())
    assert f"{VARIABLE}={given[kind]} is not an existing directory" in message
    assert not (tmp_path / "data").exists()  # refused before anything else


def test_serve_warns_about_a_metrics_directory_with_files(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "counter_1.db").write_bytes(b"\0" * 8)
    env = {
        "FEDAUDIT_DATA_DIR": str(tmp_path / "data"),  # not migrated: serve stops after the check
        "FEDAUDIT_ADMIN_TOKEN": "t" * 20,
        VARIABLE: str(metrics),
    }
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["serve", "--port", "0", "--workers", "2"], env=env)
    finally:
        get_settings.cache_clear()
    message = " ".join(result.output.split())
    assert f"{VARIABLE}={metrics} is not empty" in message
    assert result.exit_code == 1
    assert "fedaudit db upgrade" in message
    assert (metrics / "counter_1.db").exists()
