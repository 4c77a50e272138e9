"""The coordinator's privacy accounting does not load the SDK or its HTTP client: it imports the
shared accounting (fedaudit_privacy), which the SDK's preview imports too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fedaudit_privacy.accounting as shared
from client_sdk import privacy_budget as sdk_budget
from service.coordinator import privacy_budget as coordinator_budget
from service.coordinator import signal_policy

ROOT = Path(__file__).resolve().parents[2]


def _modules_after(statement: str) -> set[str]:
    """The modules loaded by ``statement`` in a fresh interpreter (a fresh ``sys.modules``)."""
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    return set(out.stdout.split())


def _sdk_or_http(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m.split(".")[0] in ("httpx", "client_sdk")}


def test_the_coordinators_privacy_modules_load_neither_the_sdk_nor_httpx():
    loaded = _modules_after(
        "import service.coordinator.privacy_budget, service.coordinator.signal_policy"
    )
    assert "service.coordinator.privacy_budget" in loaded
    assert "fedaudit_privacy.accounting" in loaded
    assert _sdk_or_http(loaded) == set()


def test_the_shared_accounting_loads_nothing_of_fedaudit_or_the_web():
    loaded = _modules_after("import fedaudit_privacy.accounting")
    tops = {m.split(".")[0] for m in loaded}
    assert not tops & {"service", "client_sdk", "httpx", "pydantic", "torch", "numpy"}


def test_the_sdk_and_the_coordinator_account_with_the_same_functions():
    assert sdk_budget.epsilon is shared.epsilon
    assert coordinator_budget.releases_per_update is shared.releases_per_update
    assert signal_policy.NOISED_SIGNALS is shared.NOISED_SIGNALS
    assert shared.NOISED_SIGNALS == ("per_class_loss", "probe_softmax")
