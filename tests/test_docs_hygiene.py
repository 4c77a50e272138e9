"""The user documentation carries no commit hashes and no paths of one machine.

Docs are read by users on their own machines, long after a commit was current: a figure carries
the command that reproduces it, not the commit it ran on, and a path names a file in the
repository (relative) or a placeholder, not someone's home or scratch directory. This scans
README.md, CHANGELOG.md, mkdocs.yml, benchmarks/README.md and every text file under docs/ (the
pages, and the scripts and scenario files they cite as reproduction commands).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".sh", ".json", ".yaml", ".yml", ".txt"}

# A commit-like token: 7-40 hex digits with at least one letter and one digit, standing alone
# (not part of a longer word, a number, a sha256 of 64 digits, or a #colour).
COMMIT_LIKE = re.compile(
    r"(?<![0-9A-Za-z_#/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])"
)
# An absolute path into a machine's own directories.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|tmp|root|Users|mnt|scratch)/[\w.-]")

# Tokens that match the shape but are not commits; each says why.
ALLOWED: dict[str, str] = {}


def _files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml"]
    files.append(ROOT / "benchmarks" / "README.md")
    files += sorted(
        p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
    )
    return files


def _hits(pattern: re.Pattern[str]) -> list[str]:
    hits = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in pattern.finditer(line):
                if match.group(0) not in ALLOWED:
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    return hits


def test_the_scan_covers_the_docs() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert {"README.md", "docs/index.md", "docs/evaluation.md", "docs/algorithms.md"} <= names


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("at commit ef567b3 the presets", ["ef567b3"]),
        ("migration 7c3e5a2b9d14 writes", ["7c3e5a2b9d14"]),
        ("a sha256 of 64: " + "ab12" * 16, []),
        ("seed 1234567 and round 20260101", []),
        ("the word deadbeef alone has no digit", []),
        ("colour #a1b2c3d and path runs/eval/V1", []),
    ],
)
def test_commit_pattern(text: str, found: list[str]) -> None:
    assert COMMIT_LIKE.findall(text) == found


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("written to /work/eval-runs/V1", True),
        ("cd /tmp/docs && ls", True),
        ("in /home/alice/x", True),
        ("runs/eval/V1 and docs/eval/tables.py", False),
        ("/var/lib/fedaudit and /data", False),
        ("https://coordinator:8000/api/v1/models/x", False),
    ],
)
def test_machine_path_pattern(text: str, found: bool) -> None:
    assert bool(MACHINE_PATH.search(text)) == found


def test_no_commit_hashes_in_docs() -> None:
    assert _hits(COMMIT_LIKE) == []


def test_no_machine_paths_in_docs() -> None:
    assert _hits(MACHINE_PATH) == []


PLACEHOLDER_HTTPS = re.compile(r"https://coordinator\b")
"""A made-up https coordinator URL: an example a user copies then fails against the quickstart's
plain-http coordinator."""


def test_examples_use_the_quickstarts_url() -> None:
    """Examples and guides use README's quickstart URL, http://127.0.0.1:8000 (and say where
    https applies); only the deployment guide's TLS section shows an https coordinator."""
    files = [ROOT / "README.md", ROOT / "client_sdk" / "__init__.py"]
    files += sorted((ROOT / "examples").glob("*.py"))
    files += sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "deployment.md")
    hits = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PLACEHOLDER_HTTPS.search(line)
    ]
    assert hits == []
    assert "http://127.0.0.1:8000" in (ROOT / "examples" / "hospital_client.py").read_text()


# A test the docs cite as showing a claim: `tests/<path>.py` or `tests/<path>.py::<name>`.
CITED_TEST = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?")


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(path: Path) -> None:
    """A page that names a test as its evidence (docs/security.md's threat model, the operator
    guide) names one that is there: the file, and the test or class in it."""
    for match in CITED_TEST.finditer(path.read_text(encoding="utf-8")):
        cited, name = ROOT / match.group(1), match.group(2)
        assert cited.is_file(), f"{path.name} cites {match.group(1)}, which does not exist"
        if name is not None:
            defined = re.compile(rf"^\s*(?:async def|def|class) {name}\b", re.MULTILINE)
            assert defined.search(cited.read_text(encoding="utf-8")), (
                f"{path.name} cites {match.group(0).strip('`')}, which is not in that file"
            )
