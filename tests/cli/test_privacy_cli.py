"""``fedaudit federation create --min-class-count --count-bucket``: the federation's signal
privacy policy from the command line, against a real coordinator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedaudit_sim.coordinator_process import CoordinatorProcess
from service.cli import app

pytestmark = pytest.mark.slow

SPEC = {
    "name": "cli-privacy",
    "task": {"num_classes": 3, "input_shape": [4]},
    "plan": {"rounds": 2},
    "config": {"method": "fedavg", "privacy": {"min_class_count": 3, "count_bucket": 7}},
}

# the Gaussian mechanism's settings, off (stored with every policy)
NO_NOISE = {
    "dp_noise_multiplier": 0.0,
    "dp_clip_loss": None,
    "dp_clip_probe": None,
    "dp_delta": None,
}


def test_the_options_set_the_policy_over_the_spec(tmp_path: Path) -> None:
    runner = CliRunner()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"name": "cli-bare", "task": SPEC["task"], "plan": SPEC["plan"]}))
    with CoordinatorProcess(tmp_path / "coord") as server:
        env = {"FEDAUDIT_URL": server.url, "FEDAUDIT_ADMIN_TOKEN": server.admin_token}
        # the spec's policy, with the option given over it and the other setting kept
        created = runner.invoke(
            app, ["federation", "create", str(spec), "--min-class-count", "10"], env=env
        )
        assert created.exit_code == 0, created.output
        privacy = json.loads(created.output)["config"]["privacy"]
        assert privacy == {**NO_NOISE, "min_class_count": 10, "count_bucket": 7}
        # a spec without config gets one
        created = runner.invoke(
            app, ["federation", "create", str(bare), "--count-bucket", "5"], env=env
        )
        assert created.exit_code == 0, created.output
        privacy = json.loads(created.output)["config"]["privacy"]
        assert privacy == {**NO_NOISE, "min_class_count": 0, "count_bucket": 5}
        refused = runner.invoke(
            app, ["federation", "create", str(bare), "--count-bucket", "0"], env=env
        )
        assert refused.exit_code == 2, refused.output


# Each refused the way the coordinator refuses it (service/coordinator/signal_policy.py), with
# the part of the message that names the problem.
BAD_DP_OPTIONS = [
    (["--dp-noise-multiplier", "-1", "--dp-clip-loss", "1", "--dp-delta", "1e-5"], "greater"),
    (["--dp-noise-multiplier", "1", "--dp-delta", "1e-5"], "dp_clip_loss required"),
    (["--dp-noise-multiplier", "1", "--dp-clip-loss", "1"], "dp_delta required"),
    (["--dp-noise-multiplier", "1", "--dp-clip-loss", "0", "--dp-delta", "1e-5"], "greater"),
    (["--dp-noise-multiplier", "1", "--dp-clip-loss", "1", "--dp-delta", "1"], "less than 1"),
    (["--dp-noise-multiplier", "inf", "--dp-clip-loss", "1", "--dp-delta", "1e-5"], "finite"),
    (
        ["--dp-noise-multiplier", "1", "--dp-clip-loss", "1", "--dp-delta", "1e-5"]
        + ["--dp-clip-probe", "0"],
        "greater",
    ),
    (["--dp-clip-loss", "1"], "without dp_noise_multiplier"),
]


def test_the_dp_options_set_the_gaussian_mechanism_and_bad_ones_create_nothing(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    runner = CliRunner()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    with CoordinatorProcess(tmp_path / "coord") as server:
        env = {"FEDAUDIT_URL": server.url, "FEDAUDIT_ADMIN_TOKEN": server.admin_token}
        for options, message in BAD_DP_OPTIONS:
            refused = runner.invoke(app, ["federation", "create", str(spec), *options], env=env)
            assert refused.exit_code == 2, (options, refused.output)
            assert "privacy policy (config.privacy) is refused" in refused.output, options
            assert message in refused.output, (options, refused.output)
        listed = runner.invoke(app, ["federation", "list", "--json"], env=env)
        assert listed.exit_code == 0, listed.output
        assert json.loads(listed.output) == []  # nothing was created
        created = runner.invoke(
            app,
            ["federation", "create", str(spec), "--dp-noise-multiplier", "2", "--dp-clip-loss"]
            + ["3", "--dp-clip-probe", "0.5", "--dp-delta", "1e-5"],
            env=env,
        )
        assert created.exit_code == 0, created.output
        privacy = json.loads(created.output)["config"]["privacy"]
        assert privacy == {
            "min_class_count": 3,
            "count_bucket": 7,
            "dp_noise_multiplier": 2.0,
            "dp_clip_loss": 3.0,
            "dp_clip_probe": 0.5,
            "dp_delta": 1e-5,
        }
