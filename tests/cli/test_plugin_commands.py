"""``fedaudit`` gets the simulator's commands through the entry-point group ``fedaudit.commands``.

Both tests run a fresh interpreter, so the entry points are read from the installed metadata as
they are on a user's machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _run(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(extra_path), *filter(None, [env.get("PYTHONPATH")])]
        )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_simulator_commands_are_added_and_the_service_does_not_import_it_for_them() -> None:
    out = _run(
        "import sys, service.cli as c\n"
        "names = [cmd.name for cmd in c.app.registered_commands]\n"
        "print('simulate' in names, 'demo' in names, 'fedaudit_sim.runner' in sys.modules)"
    )
    assert out.returncode == 0, out.stderr
    # The commands are there; the simulator itself (runner, torch models) is loaded only when
    # one of them runs.
    assert out.stdout.split() == ["True", "True", "False"]


def test_a_declared_command_that_cannot_be_loaded_is_left_out_with_a_warning(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[fedaudit.commands]\nzzz-broken = no_such_module_here:command\n"
    )
    out = _run(
        "import service.cli as c\n"
        "names = [cmd.name or cmd.callback.__name__ for cmd in c.app.registered_commands]\n"
        "print('zzz-broken' in names, 'serve' in names, 'simulate' in names)",
        extra_path=tmp_path,
    )
    # The rest of the command works (serve, and the simulator's commands) ...
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]
    # ... and the broken one is named, with why.
    assert (
        "fedaudit: warning: the command 'zzz-broken' (no_such_module_here:command) could not be "
        "loaded and is left out: ModuleNotFoundError" in out.stderr
    )
