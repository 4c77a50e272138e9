"""The operator's path end to end from the CLI (issue 21, point 1): model init and upload,
federation create --quiet and start, client pin/unpin, rounds, events, and --json/--csv on every
list."""

from __future__ import annotations

import csv
import io
import json
import sys
import uuid
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from service.cli import app

# Refused before any request: nothing listens at this URL.
NOWHERE = {"FEDAUDIT_URL": "http://127.0.0.1:9", "FEDAUDIT_ADMIN_TOKEN": "t" * 20}

FACTORY = """
from torch import nn


def make_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def make_text():
    return "not a network"


def broken():
    raise RuntimeError("no GPU here")


NUMBER = 3
"""


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with `operator_models.py`, made the current one (as an operator runs it)."""
    (tmp_path / "operator_models.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the cwd on it: undo
    monkeypatch.delitem(sys.modules, "operator_models", raising=False)
    return tmp_path


def test_model_init_writes_the_factory_state_as_safetensors(model_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["model", "init", "--module", "operator_models:make_model", "--out", "a.safetensors"]
    )
    assert result.exit_code == 0, result.output
    assert "wrote a.safetensors: 4 tensors, 67 values" in result.output
    state = load_file(model_dir / "a.safetensors")
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "0.weight": (8, 4),
        "0.bias": (8,),
        "2.weight": (3, 8),
        "2.bias": (3,),
    }
    # --seed makes the weights reproducible; another seed gives others
    again = CliRunner().invoke(
        app, ["model", "init", "-m", "operator_models:make_model", "-o", "b.safetensors"]
    )
    assert again.exit_code == 0, again.output
    other = CliRunner().invoke(
        app,
        ["model", "init", "-m", "operator_models:make_model", "-o", "c.safetensors"]
        + ["--seed", "1"],
    )
    assert other.exit_code == 0, other.output
    b, c = load_file(model_dir / "b.safetensors"), load_file(model_dir / "c.safetensors")
    assert all((state[k] == b[k]).all() for k in state)
    assert not (state["0.weight"] == c["0.weight"]).all()


def test_model_init_keeps_an_existing_file_unless_forced(model_dir: Path) -> None:
    (model_dir / "initial.safetensors").write_bytes(b"keep me")
    refused = CliRunner().invoke(app, ["model", "init", "-m", "operator_models:make_model"])
    assert refused.exit_code == 2
    assert "exists" in refused.output
    assert (model_dir / "initial.safetensors").read_bytes() == b"keep me"
    forced = CliRunner().invoke(
        app, ["model", "init", "-m", "operator_models:make_model", "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert set(load_file(model_dir / "initial.safetensors")) == {
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    }


@pytest.mark.parametrize(
    ("target", "code", "expected"),
    [
        ("operator_models", 2, "expected MODULE:ATTRIBUTE"),
        ("no_such_module_here:make", 1, "cannot import 'no_such_module_here'"),
        ("operator_models:missing", 1, "'operator_models' has no attribute 'missing'"),
        ("operator_models:NUMBER", 1, "is neither a torch.nn.Module nor a callable"),
        ("operator_models:make_text", 1, "make_text() returned a str, not a torch.nn.Module"),
        ("operator_models:broken", 1, "RuntimeError: no GPU here"),
    ],
)
def test_model_init_says_why_it_cannot_build_the_module(
    model_dir: Path, target: str, code: int, expected: str
) -> None:
    result = CliRunner().invoke(app, ["model", "init", "--module", target])
    assert result.exit_code == code, result.output
    assert expected in " ".join(result.output.split())
    assert not (model_dir / "initial.safetensors").exists()


def test_save_initial_model_refuses_what_is_not_a_module(tmp_path: Path) -> None:
    from torch import nn

    from client_sdk import save_initial_model

    with pytest.raises(TypeError, match="torch.nn.Module"):
        save_initial_model("model", tmp_path / "x.safetensors")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no parameters"):
        save_initial_model(nn.ReLU(), tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["federation", "list"],
        ["client", "list", "some-id"],
        ["rounds", "some-id"],
        ["events", "some-id"],
    ],
)
def test_every_list_refuses_csv_and_json_together(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--csv", "--json"], env=NOWHERE)
    assert result.exit_code == 1
    assert "--csv and --json exclude each other" in " ".join(result.output.split())


def test_client_anchor_refuses_remove_with_a_reason() -> None:
    result = CliRunner().invoke(
        app, ["client", "anchor", "f", "c", "--remove", "--reason", "curated"], env=NOWHERE
    )
    assert result.exit_code == 1
    assert "--remove and --reason exclude each other" in " ".join(result.output.split())


def test_model_upload_refuses_an_unreadable_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["model", "upload", "some-id", str(tmp_path / "none.safetensors")], env=NOWHERE
    )
    assert result.exit_code == 2
    assert "cannot read" in result.output


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.slow
def test_the_operator_path_end_to_end(model_dir: Path) -> None:
    from client_sdk import FederationClient
    from fedaudit_sim.coordinator_process import CoordinatorProcess

    runner = CliRunner()
    with CoordinatorProcess(model_dir / "coord") as server:
        env = {
            "FEDAUDIT_URL": server.url,
            "FEDAUDIT_ADMIN_TOKEN": server.admin_token,
            "COLUMNS": "200",
        }

        def cli(*args: str) -> str:
            result = runner.invoke(app, list(args), env=env)
            assert result.exit_code == 0, result.output
            return result.output

        (model_dir / "spec.json").write_text(
            json.dumps(
                {
                    "name": "operator-fed",
                    "task": {"num_classes": 3, "input_shape": [4]},
                    "plan": {"rounds": 2, "min_clients": 2},
                    "config": {"method": "fednoro"},
                }
            )
        )
        quiet = cli("federation", "create", "spec.json", "--quiet")
        fid = quiet.strip()
        assert quiet == f"{uuid.UUID(fid)}\n"  # the id alone, for FID=$(...)

        # start before the model: refused, and it says what is missing
        early = runner.invoke(app, ["federation", "start", fid], env=env)
        assert early.exit_code == 1
        assert "409" in early.output
        assert "upload the initial model first" in early.output

        cli("model", "init", "--module", "operator_models:make_model")
        uploaded = cli("model", "upload", fid, "initial.safetensors")
        assert uploaded.startswith("model version ")

        tokens = {}
        for name in ("site-a", "site-b", "=site-c"):
            out = cli("client", "add", fid, name)
            tokens[name] = out.split("token: ")[1].split()[0]

        # --json and --csv on the lists
        feds = json.loads(cli("federation", "list", "--json"))
        mine = next(f for f in feds if f["id"] == fid)
        assert (mine["name"], mine["status"], mine["clients"]) == ("operator-fed", "waiting", 3)
        rows = _csv_rows(cli("federation", "list", "--csv"))
        assert {"id": fid, "name": "operator-fed", "clients": "3", "rounds": "2"}.items() <= next(
            r for r in rows if r["id"] == fid
        ).items()
        clients = json.loads(cli("client", "list", fid, "--json"))
        ids = {c["name"]: c["id"] for c in clients}
        assert set(ids) == {"site-a", "site-b", "=site-c"}
        client_rows = _csv_rows(cli("client", "list", fid, "--csv"))
        # a name a spreadsheet would run as a formula is written as text
        assert {r["name"] for r in client_rows} == {"site-a", "site-b", "'=site-c"}
        assert {r["status"] for r in client_rows} == {"trusted"}

        # pin and unpin
        pinned = cli(
            "client", "pin", fid, ids["site-a"], "--status", "noisy", "--reason", "labels re-read"
        )
        assert f"client site-a ({ids['site-a']}) is pinned noisy" in pinned
        listed = {c["name"]: c for c in json.loads(cli("client", "list", fid, "--json"))}
        assert listed["site-a"]["pinned_status"] == "noisy"
        assert listed["site-a"]["pin_reason"] == "labels re-read"
        wrong = runner.invoke(
            app, ["client", "pin", fid, ids["site-a"], "--status", "bad", "--reason", "x"], env=env
        )
        assert wrong.exit_code == 2
        unpinned = cli("client", "unpin", fid, ids["site-a"])
        assert "is unpinned; its status: trusted" in unpinned
        listed = {c["name"]: c for c in json.loads(cli("client", "list", fid, "--json"))}
        assert listed["site-a"]["pinned_status"] is None

        # two of three sites join; start opens round 0 with them
        for name in ("site-a", "site-b"):
            with FederationClient(server.url, api_token=tokens[name]) as site:
                site.join(fid, num_samples=10, class_counts=[4, 3, 3])
        assert json.loads(cli("rounds", fid, "--json")) == []
        started = cli("federation", "start", fid)
        assert "is running: round 0 open with 2 of 3 sites joined" in " ".join(started.split())

        table = cli("rounds", fid)
        assert "open" in table
        assert "0/2" in table
        rounds = json.loads(cli("rounds", fid, "--json"))
        assert [(r["index"], r["state"], len(r["selected_clients"])) for r in rounds] == [
            (0, "open", 2)
        ]
        round_rows = _csv_rows(cli("rounds", fid, "--csv"))
        assert [(r["index"], r["state"], r["selected_clients"]) for r in round_rows] == [
            ("0", "open", "2")
        ]

        # the audit trail, whole and filtered
        trail = json.loads(cli("events", fid, "--json"))
        kinds = [e["kind"] for e in trail]
        assert "federation.started" in kinds
        assert [e["id"] for e in trail] == sorted(e["id"] for e in trail)
        pins = json.loads(cli("events", fid, "--json", "--client", ids["site-a"]))
        assert pins
        assert all(e["client_id"] == ids["site-a"] for e in pins)
        started_only = json.loads(cli("events", fid, "--json", "--kind", "federation.started"))
        assert [e["kind"] for e in started_only] == ["federation.started"]
        event_rows = _csv_rows(cli("events", fid, "--csv"))
        assert [int(r["id"]) for r in event_rows] == [e["id"] for e in trail]
        assert "federation.started" in cli("events", fid)

        missing = runner.invoke(app, ["rounds", "00000000-0000-0000-0000-000000000000"], env=env)
        assert missing.exit_code == 1
        assert "404" in missing.output
