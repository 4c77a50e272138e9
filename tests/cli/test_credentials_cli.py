"""Credential commands against a real coordinator: site tokens over HTTP, the admin token and
dashboard sessions in its database, all without a restart."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from client_sdk import AdminClient, AuthenticationError, FederationClient
from fedaudit_sim.coordinator_process import CoordinatorProcess
from service.cli import app
from service.config import get_settings

pytestmark = pytest.mark.slow


def test_site_and_admin_tokens_rotate_and_sessions_end(tmp_path: Path) -> None:
    runner = CliRunner()
    with CoordinatorProcess(tmp_path / "coord") as server:
        env = {"FEDAUDIT_URL": server.url, "FEDAUDIT_ADMIN_TOKEN": server.admin_token}
        with AdminClient(server.url, server.admin_token) as admin:
            federation = admin.create_federation(
                {
                    "name": f"cli-{uuid.uuid4().hex[:6]}",
                    "task": {"num_classes": 2, "input_shape": [4]},
                    "plan": {"rounds": 1},
                }
            )
            site = admin.add_client(federation.id, "hospital-a")
        fid, cid = str(federation.id), str(site.id)

        revoked = runner.invoke(
            app, ["client", "revoke-token", fid, cid, "--reason", "laptop stolen"], env=env
        )
        assert revoked.exit_code == 0, revoked.output
        with FederationClient(server.url, site.token, max_retries=0) as client:
            with pytest.raises(AuthenticationError, match="revoked"):
                client.get_task(federation.id)

        rotated = runner.invoke(app, ["client", "rotate-token", fid, cid], env=env)
        assert rotated.exit_code == 0, rotated.output
        new_site_token = rotated.stdout.strip().splitlines()[-1]
        assert new_site_token.startswith("fa_c_")
        with FederationClient(server.url, new_site_token, max_retries=0) as client:
            assert client.get_task(federation.id).num_classes == 2

        # the admin token, in the coordinator's database (the command runs on its host)
        server_env = {"FEDAUDIT_DATA_DIR": str(server.data_dir), "FEDAUDIT_ADMIN_TOKEN": ""}
        with httpx.Client(base_url=server.url) as browser:
            assert (
                browser.post("/admin/login", data={"token": server.admin_token}).status_code == 303
            )
            assert browser.get("/admin").status_code == 200
            get_settings.cache_clear()
            ended = runner.invoke(app, ["admin", "logout-everywhere"], env=server_env)
            assert ended.exit_code == 0, ended.output
            assert "1 dashboard session(s) ended" in ended.output
            assert browser.get("/admin", follow_redirects=False).status_code == 303

        get_settings.cache_clear()
        new = runner.invoke(app, ["admin", "rotate-token"], env=server_env)
        get_settings.cache_clear()
        assert new.exit_code == 0, new.output
        new_admin_token = new.stdout.strip().splitlines()[-1]
        assert new_admin_token.startswith("fa_a_")
        with AdminClient(server.url, server.admin_token, max_retries=0) as old:
            with pytest.raises(AuthenticationError):
                old.list_federations()
        with AdminClient(server.url, new_admin_token) as admin:
            assert [f.id for f in admin.list_federations()] == [federation.id]


@pytest.mark.parametrize("command", [["admin", "rotate-token"], ["admin", "logout-everywhere"]])
def test_a_database_command_without_a_database_creates_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    data_dir = tmp_path / "not-yet" / "data"
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(
            app, command, env={"FEDAUDIT_DATA_DIR": str(data_dir), "FEDAUDIT_DATABASE_URL": ""}
        )
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 1, result.output
    assert "no database at" in result.output
    assert "fedaudit.db" in result.output
    assert not (tmp_path / "not-yet").exists()  # no directory, no empty database file
