"""The compose file's replica profile holds together (CI has no Docker engine to run it).

What is checked here is what would only show when someone runs the stack: services that depend
on services outside their profile, replicas that would not find each other (the PostgreSQL
notifier), blobs that would not be shared, a proxy whose upstream names other services, a
mounted file that does not exist. The proxy file itself runs in nginx in
``tests/e2e/test_proxy_replicas.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def services() -> dict[str, Any]:
    loaded = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    result: dict[str, Any] = loaded["services"]
    return result


def in_profile(profile: str) -> dict[str, Any]:
    return {n: s for n, s in services().items() if profile in s.get("profiles", [])}


def test_every_dependency_of_the_replicas_profile_is_in_it() -> None:
    chosen = in_profile("replicas")
    assert {"proxy", "coordinator-r1", "coordinator-r2", "db-s3", "minio"} <= set(chosen)
    for name, service in chosen.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in chosen, f"{name} depends on {dependency}, not in the profile"


def test_the_replicas_share_database_and_blobs_and_notify_each_other() -> None:
    chosen = in_profile("replicas")
    replicas = [chosen["coordinator-r1"], chosen["coordinator-r2"]]
    envs = [r["environment"] for r in replicas]
    assert envs[0] == envs[1]
    env = envs[0]
    assert env["FEDAUDIT_CHANGE_NOTIFIER"] == "postgres"
    assert env["FEDAUDIT_BLOB_BACKEND"] in {"s3", "database"}
    assert "@db-s3:" in env["FEDAUDIT_DATABASE_URL"]
    # their own data volumes (a cache and temporary uploads), no published port: only the proxy
    assert replicas[0]["volumes"] != replicas[1]["volumes"]
    assert all("ports" not in r for r in replicas)
    # the migrations run once, before either replica serves
    for replica in replicas:
        assert replica["command"] == ["fedaudit", "serve"]
        assert replica["depends_on"]["migrate-replicas"]["condition"] == (
            "service_completed_successfully"
        )


def test_the_proxy_mounts_its_file_and_names_the_replicas() -> None:
    proxy = in_profile("replicas")["proxy"]
    mounts = [v.split(":") for v in proxy["volumes"]]
    assert len(mounts) == 1
    source = (DOCKER / mounts[0][0]).resolve()
    assert source.is_file(), source
    upstream = re.findall(r"^\s*server (\S+):8000 resolve;", source.read_text(), flags=re.M)
    assert sorted(upstream) == ["coordinator-r1", "coordinator-r2"]
    assert proxy["ports"] == ["8002:8080"]
    assert "listen 8080;" in source.read_text()
