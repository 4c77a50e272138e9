"""The operator's CLI against a real coordinator: federation, client and report commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from client_sdk import FederationClient
from fedaudit_sim.coordinator_process import CoordinatorProcess
from service.cli import app

pytestmark = pytest.mark.slow


def test_federation_client_and_report_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    with CoordinatorProcess(tmp_path / "coord") as server:
        env = {
            "FEDAUDIT_URL": server.url,
            "FEDAUDIT_ADMIN_TOKEN": server.admin_token,
            "COLUMNS": "200",
        }
        spec = tmp_path / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "name": "cli-fed",
                    "task": {"num_classes": 3, "input_shape": [4]},
                    "plan": {"rounds": 2},
                    "config": {"method": "fednoro"},
                }
            )
        )
        created = runner.invoke(app, ["federation", "create", str(spec)], env=env)
        assert created.exit_code == 0, created.output
        fid = json.loads(created.output)["id"]
        assert json.loads(created.output)["config"]["aggregation"] == "daagg"

        listed = runner.invoke(app, ["federation", "list"], env=env)
        assert listed.exit_code == 0
        assert "cli-fed" in listed.output
        # On an 80-column terminal the id, which every other command takes, is still whole.
        terminal = {**env, "COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
        narrow = runner.invoke(app, ["federation", "list"], env=terminal)
        assert fid in narrow.output, narrow.output
        visible = re.sub(r"\x1b\[[0-9;]*m", "", narrow.output)  # a terminal gets bold headers
        assert max(len(line) for line in visible.splitlines()) <= 80
        shown = runner.invoke(app, ["federation", "show", fid], env=env)
        assert json.loads(shown.output)["name"] == "cli-fed"

        added = runner.invoke(app, ["client", "add", fid, "hospital-a"], env=env)
        assert added.exit_code == 0
        assert "token: fa_c_" in added.output
        # a name with brackets is printed as written, not taken for console markup
        bracketed = runner.invoke(app, ["client", "add", fid, "lab[b]"], env=env)
        assert bracketed.exit_code == 0, bracketed.output
        assert "client lab[b] (" in bracketed.output
        # --quiet: the token alone, for TOKEN=$(fedaudit client add ... --quiet); it is the
        # site's token (the coordinator answers the site with it)
        quiet = runner.invoke(app, ["client", "add", fid, "site-q", "--quiet"], env=env)
        assert quiet.exit_code == 0, quiet.output
        assert re.fullmatch(r"fa_c_[A-Za-z0-9_-]+\n", quiet.output), quiet.output
        with FederationClient(server.url, quiet.output.strip()) as site:
            assert site.get_task(fid).num_classes == 3
        clients = runner.invoke(app, ["client", "list", fid], env=env)
        assert "hospital-a" in clients.output
        assert "lab[b]" in clients.output
        client_id = added.output.split("(")[1].split(")")[0]
        narrow = runner.invoke(app, ["client", "list", fid], env=terminal)
        assert client_id in narrow.output, narrow.output
        no_reason = runner.invoke(app, ["client", "anchor", fid, client_id], env=env)
        assert no_reason.exit_code != 0
        anchored = runner.invoke(
            app, ["client", "anchor", fid, client_id, "--reason", "curated labels"], env=env
        )
        assert anchored.exit_code == 0, anchored.output
        assert "is a trust anchor" in anchored.output
        unanchored = runner.invoke(app, ["client", "anchor", fid, client_id, "--remove"], env=env)
        assert "is not a trust anchor" in unanchored.output

        # a site that never joined says so; a suspended one too, until it is resumed
        assert re.search(r"hospital-a .* not joined", clients.output), clients.output
        no_reason = runner.invoke(app, ["client", "suspend", fid, client_id], env=env)
        assert no_reason.exit_code != 0
        suspended = runner.invoke(
            app, ["client", "suspend", fid, client_id, "--reason", "maintenance"], env=env
        )
        assert suspended.exit_code == 0, suspended.output
        assert "is suspended" in suspended.output
        listed = runner.invoke(app, ["client", "list", fid, "--csv"], env=env)
        row = next(line for line in listed.output.splitlines() if "hospital-a" in line)
        assert row.endswith(",suspended,0,maintenance"), row
        resumed = runner.invoke(app, ["client", "resume", fid, client_id], env=env)
        assert resumed.exit_code == 0, resumed.output
        assert "is resumed (not_joined)" in resumed.output
        # a pinned status: the table shows the pin and says so; --csv has both columns
        pinned = runner.invoke(
            app,
            ["client", "pin", fid, client_id, "--status", "noisy", "--reason", "audit"],
            env=piped_env(env),
        )
        assert pinned.exit_code == 0, pinned.output
        table = runner.invoke(app, ["client", "list", fid], env=piped_env(env))
        assert re.search(r"hospital-a .* noisy \(pinned\)", table.output), table.output
        listed = runner.invoke(app, ["client", "list", fid, "--csv"], env=env)
        row = next(line for line in listed.output.splitlines() if "hospital-a" in line)
        assert f"{client_id},hospital-a,trusted,noisy,audit," in row, row

        report = runner.invoke(app, ["report", fid], env=env)
        assert report.exit_code == 0, report.output
        assert "hospital-a" in report.output
        assert "lab[b]" in report.output
        # Into a file or a pipe (no terminal, no COLUMNS) the table gets 120 columns, so its
        # headers are whole.
        piped = {k: v for k, v in env.items() if k != "COLUMNS"}
        report = runner.invoke(app, ["report", fid], env=piped)
        assert "expertise" in report.output, report.output
        assert "Fed-NCL q" in report.output
        csv_report = runner.invoke(app, ["report", fid, "--csv"], env=env)
        assert csv_report.output.splitlines()[0].startswith("client_id,name,status")

        stopped = runner.invoke(
            app, ["federation", "stop", fid, "--reason", "wrong task spec"], env=env
        )
        assert stopped.exit_code == 0, stopped.output
        assert "stopped by the admin: wrong task spec" in stopped.output
        shown = runner.invoke(app, ["federation", "show", fid], env=env)
        assert shown.exit_code == 0, shown.output  # the admin still sees a stopped federation
        assert json.loads(shown.output)["status"] == "stopped"
        assert json.loads(shown.output)["status_reason"] == "stopped by the admin: wrong task spec"
        stopped_report = runner.invoke(app, ["report", fid], env=env)
        assert "STOPPED: stopped by the admin: wrong task spec" in " ".join(
            stopped_report.output.split()
        )
        again = runner.invoke(app, ["federation", "stop", fid, "--reason", "x"], env=env)
        assert again.exit_code == 1
        assert "409" in again.output
        assert "nothing to stop" in " ".join(again.output.split())

        missing = runner.invoke(
            app, ["federation", "show", "00000000-0000-0000-0000-000000000000"], env=env
        )
        assert missing.exit_code == 1
        assert "404" in missing.output
        wrong_token = runner.invoke(
            app, ["federation", "list"], env={**env, "FEDAUDIT_ADMIN_TOKEN": "x"}
        )
        assert wrong_token.exit_code == 1
        assert "401" in wrong_token.output


def test_db_upgrade_then_serve_refuses_unmigrated(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"FEDAUDIT_DATA_DIR": str(tmp_path), "FEDAUDIT_ADMIN_TOKEN": "t" * 20}
    from service.config import get_settings

    get_settings.cache_clear()
    refused = runner.invoke(app, ["serve", "--port", "0"], env=env)
    assert refused.exit_code == 1
    assert "fedaudit db upgrade" in refused.output
    get_settings.cache_clear()
    upgraded = runner.invoke(app, ["db", "upgrade"], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    assert "database at head" in upgraded.output
    get_settings.cache_clear()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read the spec"),
        ('{"name": "x"', "is not valid JSON"),
        ("[1, 2]", "must be a JSON object with name, task, plan and config, not a list"),
    ],
)
def test_federation_create_refuses_an_unreadable_spec(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    # Refused before any request: no coordinator runs at this URL.
    spec = tmp_path / "spec.json"
    if content is not None:
        spec.write_text(content)
    env = {"FEDAUDIT_URL": "http://127.0.0.1:9", "FEDAUDIT_ADMIN_TOKEN": "t" * 20}
    result = CliRunner().invoke(app, ["federation", "create", str(spec)], env=env)
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())


def test_an_error_message_is_printed_as_text_not_markup(tmp_path: Path) -> None:
    # brackets in a path (or a server's problem detail) are not console markup
    spec = tmp_path / "spec[site].json"
    env = {"FEDAUDIT_URL": "http://127.0.0.1:9", "FEDAUDIT_ADMIN_TOKEN": "t" * 20}
    result = CliRunner().invoke(app, ["federation", "create", str(spec)], env=env)
    assert result.exit_code == 2, result.output
    assert "spec[site].json" in "".join(result.output.split())


def piped_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a pipe: no terminal width, so the table gets 120 columns."""
    return {k: v for k, v in env.items() if k != "COLUMNS"}
