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


def test_a_setting_that_is_not_valid_is_named_without_a_traceback():
    from service.config import get_settings

    get_settings.cache_clear()
    try:
        env = {"FEDAUDIT_PORT": "abc", "FEDAUDIT_LOG_FORMAT": "xml"}
        for command in (["serve"], ["admin", "rotate-token"], ["db", "upgrade"]):
            result = runner.invoke(app, command, env=env)
            assert result.exit_code == 1, result.output
            text = " ".join(result.output.split())
            assert "FEDAUDIT_PORT='abc': Input should be a valid integer" in text
            assert "FEDAUDIT_LOG_FORMAT='xml': Input should be 'text' or 'json'" in text
            assert "Traceback" not in text
            assert result.exception is None or isinstance(result.exception, SystemExit)
    finally:
        get_settings.cache_clear()


def _command_paths() -> list[list[str]]:
    """Every command and group of `fedaudit` (the plugins' too), as argument lists."""
    import typer.main

    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_help_names_parameters_readably():
    """No ``<str>``, ``<bool>`` or ``{federation_id}`` in any --help (issue 21's walkthrough)."""
    paths = _command_paths()
    assert ["client", "add"] in paths
    assert len(paths) > 20
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert result.exit_code == 0, (path, result.output)
        for unreadable in ("<str>", "<bool>", "{"):
            assert unreadable not in result.output, (path, unreadable, result.output)
    added = runner.invoke(app, ["client", "add", "--help"], env={"COLUMNS": "200"})
    assert "Usage: fedaudit client add [OPTIONS] FEDERATION_ID NAME" in added.output
    assert "--url" in added.output
    assert " URL " in added.output
    pinned = runner.invoke(app, ["client", "pin", "--help"], env={"COLUMNS": "200"})
    assert "<trusted|suspect|noisy>" in pinned.output  # the choices stay
