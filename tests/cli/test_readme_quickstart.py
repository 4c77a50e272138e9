"""The README's operator quickstart runs as written (issue 21, point 1): its shell blocks, from
the setup line to the sites' registration, against a coordinator they start themselves."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = "scripts/setup && source .venv/bin/activate"

pytestmark = pytest.mark.slow


def _operator_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Quickstart: the operator") : text.index("## Quickstart: a site")]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_operator_quickstart_runs_as_written(tmp_path: Path) -> None:
    blocks = _operator_blocks()
    # serve; spec and model; create, upload, register (the last block needs sites: not run)
    assert len(blocks) == 4, blocks
    assert blocks[0].startswith(SETUP), blocks[0]
    port = str(_free_port())
    script = "\n".join(blocks[:3]).replace("8000", port)
    # `scripts/setup` made this environment already: activating it is putting it on the PATH
    # (with this checkout first on the import path, as the editable install has it).
    script = script.replace(
        SETUP, f'export PATH="{Path(sys.executable).parent}:$PATH" PYTHONPATH="{ROOT}"'
    )
    script = (
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
        + script
        + '\necho "$FID" > fid.txt\nfedaudit client list $FID --json > clients.json\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDAUDIT_")}
    run = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\nserve.log:\n{log}"
    fid = (tmp_path / "fid.txt").read_text().strip()
    assert re.fullmatch(r"[0-9a-f-]{36}", fid), fid
    clients = json.loads((tmp_path / "clients.json").read_text())
    assert sorted(c["name"] for c in clients) == ["hospital-a", "hospital-b", "hospital-c"]
    assert (tmp_path / "initial.safetensors").stat().st_size > 0
    assert "model version 0" in run.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/site-guide.md"])
def test_the_site_snippets_use_the_quickstart_coordinators_url(page: str) -> None:
    """The quickstart's coordinator serves plain http on loopback: a site snippet that says
    https:// there fails the TLS handshake (issue 21's walkthrough)."""
    served = re.search(r"export FEDAUDIT_URL=(\S+)", _operator_blocks()[2])
    assert served is not None
    assert served.group(1) == "http://127.0.0.1:8000"
    text = (ROOT / page).read_text(encoding="utf-8")
    urls = re.findall(r'FederationClient\(\s*"([^"]+)"', text)
    urls += re.findall(r"FEDAUDIT_URL=(\S+) FEDAUDIT_TOKEN", text)
    assert urls, page
    assert set(urls) == {served.group(1)}, urls


def test_every_variable_of_the_operator_quickstart_is_set_or_explained() -> None:
    # a `$NAME` in a block is assigned in one (NAME=..., export NAME=...) or said in the prose
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Quickstart: the operator") : text.index("## Quickstart: a site")]
    blocks = _operator_blocks()
    prose = re.sub(r"```bash\n.*?```", "", section, flags=re.S)
    used = {name for block in blocks for name in re.findall(r"\$([A-Z_]+)\b", block)}
    assigned = {name for block in blocks for name in re.findall(r"\b([A-Z_]+)=", block)}
    shell = {"PWD", "HOME", "PATH"}  # the shell's own
    unexplained = {name for name in used - assigned - shell if f"`${name}`" not in prose}
    assert unexplained == set(), unexplained
