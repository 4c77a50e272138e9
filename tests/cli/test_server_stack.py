"""``fedaudit serve``'s event loop and HTTP parser: uvloop and httptools (dependencies), httptools
with a cap on a request's head; where one does not import, asyncio or h11 with a notice on
stderr, never a silent fallback."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from service.cli import server
from service.http_protocol import BoundedHttpToolsProtocol


def _without(monkeypatch: pytest.MonkeyPatch, *absent: str) -> None:
    """Make ``absent`` fail to import (a missing or broken install), and the modules that
    import httptools be imported again."""
    for name in absent:
        monkeypatch.setitem(sys.modules, name, None)
    if "httptools" in absent:
        for name in ("service.http_protocol", "uvicorn.protocols.http.httptools_impl"):
            monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_fast_stack_is_installed_and_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    assert importlib.util.find_spec("httptools") is not None  # a dependency of fedaudit
    loop, http = server.server_stack()
    assert http is BoundedHttpToolsProtocol
    if sys.platform != "win32":
        assert loop == "uvloop"
        assert capsys.readouterr().err == ""


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not a dependency on Windows")
def test_missing_packages_are_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without(monkeypatch, "uvloop", "httptools")
    assert server.server_stack() == ("asyncio", "h11")
    said = " ".join(capsys.readouterr().err.split())
    assert "serving with asyncio and h11: uvloop (" in said
    assert "; httptools (" in said


def test_one_missing_package_is_named_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without(monkeypatch, "httptools")
    loop, http = server.server_stack()
    assert http == "h11"
    said = " ".join(capsys.readouterr().err.split())
    assert f"serving with {loop} and h11: httptools (" in said
    assert "uvloop (" not in said  # not among the missing
