"""`import client_sdk` and the admin client do not load torch (an operator's script that only
reads reports should not pay for a deep-learning stack); the training side loads it when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import client_sdk


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(out.stdout.split())


def test_the_admin_client_does_not_import_torch_or_numpy():
    loaded = _modules_after("from client_sdk import AdminClient, FederationClient, NotFoundError")
    assert "client_sdk._client" in loaded
    assert "torch" not in loaded
    assert "numpy" not in loaded


def test_the_participant_is_still_importable_from_the_package():
    loaded = _modules_after("from client_sdk import Participant, RoundSummary, default_device")
    assert "torch" in loaded
    assert client_sdk.Participant.__module__ == "client_sdk.participant"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = client_sdk.Nope
