"""``fedaudit serve``'s event loop and HTTP parser: uvloop and httptools (dependencies), else
asyncio and h11 with a notice on stderr, never a silent fallback."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from service.cli import server
from service.http_protocol import BoundedHttpToolsProtocol


def _without(monkeypatch: pytest.MonkeyPatch, *absent: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name in absent else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_fast_stack_is_installed_and_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    assert importlib.util.find_spec("httptools") is not None  # a dependency of fedaudit
    if sys.platform != "win32":
        assert importlib.util.find_spec("uvloop") is not None
        assert server.server_stack() == ("uvloop", BoundedHttpToolsProtocol)
        assert capsys.readouterr().err == ""


def test_a_missing_package_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without(monkeypatch, "uvloop", "httptools")
    assert server.server_stack() == ("asyncio", "h11")
    said = " ".join(capsys.readouterr().err.split())
    assert "serving with asyncio and h11: uvloop and httptools not installed" in said


def test_one_missing_package_is_named_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without(monkeypatch, "httptools")
    loop, http = server.server_stack()
    assert http == "h11"
    said = " ".join(capsys.readouterr().err.split())
    assert f"serving with {loop} and h11: httptools not installed" in said
