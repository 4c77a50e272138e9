"""`fedaudit --version`, and conflicting output flags refused."""

from __future__ import annotations

from typer.testing import CliRunner

from service import __version__
from service.cli import app

runner = CliRunner()


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"fedaudit {__version__}\n"


def test_no_arguments_still_prints_the_help():
    result = runner.invoke(app, [])
    assert "Usage" in result.output
    assert "federation" in result.output


def test_report_refuses_csv_and_json_together():
    # refused before any request: no coordinator listens at this URL
    result = runner.invoke(
        app, ["report", "some-id", "--csv", "--json", "--url", "http://127.0.0.1:9", "--token", "t"]
    )
    assert result.exit_code == 1
    assert "--csv and --json exclude each other" in " ".join(result.output.split())
