"""``fedaudit serve``, ``db upgrade`` and ``openapi``: the coordinator's side."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.markup import escape

from service.cli._app import (
    app,
    db_app,
    env_settings,
    err,
    fail,
    stdout,
)

_SERVER_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
WORKERS_HELP = (
    "Worker processes. With more than one, /metrics sums the HTTP metrics of all of them "
    f"(prometheus_client's multiprocess mode, its files in {METRICS_DIR_VARIABLE}: a private "
    "temporary directory unless set) and has no process_* metrics"
)


def _configure_logging(config: dict[str, Any]) -> list[tuple[str, list[Any], int, bool]]:
    """Configure this process's logging (service.logs) for ``serve``; returns what it replaced
    (handlers, level, propagation of the root and uvicorn's loggers) for :func:`_restore_logging`.
    """
    import logging.config

    before = []
    for name in _SERVER_LOGGERS:
        logger = logging.getLogger(name)
        before.append((name, list(logger.handlers), logger.level, logger.propagate))
    logging.config.dictConfig(config)
    return before


def _restore_logging(before: list[tuple[str, list[Any], int, bool]]) -> None:
    """Put back the logging :func:`_configure_logging` replaced: a ``serve`` that stops on an
    error (a database not migrated, a port in use) leaves its caller's logging as it was."""
    for name, handlers, level, propagate in before:
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (FEDAUDIT_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (FEDAUDIT_PORT)")] = None,
    workers: Annotated[int, typer.Option(help=WORKERS_HELP)] = 1,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="PEM certificate: serve https (FEDAUDIT_TLS_CERTFILE)", metavar="FILE"),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(help="PEM private key of --tls-cert (FEDAUDIT_TLS_KEYFILE)", metavar="FILE"),
    ] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(
            help="PEM CA bundle: require client certificates it signed, mutual TLS "
            "(FEDAUDIT_TLS_CLIENT_CA)",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """Run the coordinator (the database must be migrated: `fedaudit db upgrade`)."""
    _check_metrics_directory()
    import uvicorn

    from service.errors import MigrationsNotAtHeadError, StartupError
    from service.logs import log_config
    from service.main import create_app

    settings = env_settings()
    logs = log_config(settings.log_level, settings.log_format)
    tls = _tls_options(
        tls_cert or settings.tls_certfile,
        tls_key or settings.tls_keyfile,
        tls_client_ca or settings.tls_client_ca,
    )
    bind_host, bind_port = host or settings.host, settings.port if port is None else port
    _check_port_free(bind_host, bind_port)
    if settings.admin_token is None:
        token = settings.admin_secret()
        # worker processes read their settings from the environment: give them the same token
        os.environ["FEDAUDIT_ADMIN_TOKEN"] = token
        err.print(
            f"[yellow]FEDAUDIT_ADMIN_TOKEN is not set; this run's admin token is:[/] {token}",
            soft_wrap=True,
        )
    loop, http = server_stack()
    # From here every line has the configured format, the app's start-up included.
    replaced = _configure_logging(logs)
    try:
        with _metrics_directory(workers):
            if workers > 1:
                _prepare_workers(settings)
                uvicorn.run(
                    "service.main:create_app",
                    factory=True,
                    workers=workers,
                    host=bind_host,
                    port=bind_port,
                    log_config=logs,
                    loop=loop,
                    http=http,
                    **tls,
                )
            else:
                uvicorn.run(
                    create_app(settings),
                    log_level=settings.log_level.lower(),
                    host=bind_host,
                    port=bind_port,
                    log_config=logs,
                    loop=loop,
                    http=http,
                    **tls,
                )
    except (MigrationsNotAtHeadError, StartupError) as exc:
        _restore_logging(replaced)
        fail(str(exc))
    except BaseException:
        _restore_logging(replaced)
        raise


def _check_port_free(host: str, port: int) -> None:
    """Refuse at once, before any start-up work or log line, an address another process holds
    (uvicorn would run the app's start-up first and then fail to bind). Bound and closed as
    uvicorn binds (SO_REUSEADDR), so a port in TIME_WAIT passes; port 0 (any free) and the
    empty host (every interface) are not checked.
    """
    import errno
    import socket

    if port == 0 or not host:  # "" binds every interface, as uvicorn does with it
        return
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        # every address the name gives, as asyncio binds them (an IPv6 one IPv6 only)
        for family, address in {(info[0], info[4][:2]) for info in found}:
            with socket.create_server(address, family=family):
                pass
    except socket.gaierror as exc:
        fail(f"cannot serve on {host}:{port}: the host does not resolve ({exc.strerror})")
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            fail(
                f"cannot serve on {host}:{port}: address already in use (another fedaudit "
                "serve, or another program): stop it, or serve on another --port (FEDAUDIT_PORT)"
            )
        fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


def _prepare_workers(settings: Any) -> None:
    """Before the workers start: the migration check (fail fast, here) and the start-up sweep,
    once (a worker that uvicorn restarts must not sweep its siblings' uploads)."""
    from service.main import create_app

    parent = create_app(settings, run_reaper=False)
    if settings.startup_sweep:
        from service.coordinator.housekeeping import DataDirectoryLease, sweep_leftovers

        lease = DataDirectoryLease(settings.data_dir)
        sweep_leftovers(parent.state.services, lease=lease)
        lease.release()  # each worker holds its own shared lock while it serves
        os.environ["FEDAUDIT_STARTUP_SWEEP"] = "false"
    parent.state.services.close()


def _check_metrics_directory() -> None:
    """A ``PROMETHEUS_MULTIPROC_DIR`` the user set must be an existing directory (else
    prometheus_client fails at the first request); one with files in it is used with a warning
    (an earlier run's counts would be summed in)."""
    given = os.environ.get(METRICS_DIR_VARIABLE)
    if given is None:
        return
    if not given or not Path(given).is_dir():
        fail(
            f"{METRICS_DIR_VARIABLE}={given} is not an existing directory: create it (empty) "
            "or unset the variable"
        )
    if any(Path(given).iterdir()):
        err.print(
            f"[yellow]{METRICS_DIR_VARIABLE}={escape(given)} is not empty:[/] /metrics sums "
            "the counts its files hold from earlier runs too; empty it before starting the "
            "coordinator",
            soft_wrap=True,
        )


@contextmanager
def _metrics_directory(workers: int) -> Iterator[None]:
    """prometheus_client's multiprocess mode for several workers: a fresh private directory in
    ``PROMETHEUS_MULTIPROC_DIR`` while they run (the workers inherit it), removed after. A
    directory the user set is kept and used as it is, with one worker too."""
    if METRICS_DIR_VARIABLE in os.environ or workers <= 1:
        yield
        return
    path = tempfile.mkdtemp(prefix="fedaudit-metrics-")
    os.environ[METRICS_DIR_VARIABLE] = path
    try:
        yield
    finally:
        os.environ.pop(METRICS_DIR_VARIABLE, None)
        shutil.rmtree(path, ignore_errors=True)


def server_stack() -> tuple[Literal["uvloop", "asyncio"], type[asyncio.Protocol] | Literal["h11"]]:
    """uvicorn's event loop and HTTP protocol: uvloop and httptools (dependencies of fedaudit;
    uvloop not on Windows), httptools with a cap on a request's head
    (:class:`service.http_protocol.BoundedHttpToolsProtocol`); where one does not import, asyncio
    or h11, said on stderr rather than chosen silently (on Windows, asyncio without a word)."""
    import importlib

    missing: list[str] = []
    loop: Literal["uvloop", "asyncio"] = "asyncio"
    try:
        importlib.import_module("uvloop")
        loop = "uvloop"
    except ImportError as exc:
        if sys.platform != "win32":
            missing.append(f"uvloop ({exc})")
    http: type[asyncio.Protocol] | Literal["h11"] = "h11"
    try:
        from service.http_protocol import BoundedHttpToolsProtocol

        http = BoundedHttpToolsProtocol
    except ImportError as exc:
        missing.append(f"httptools ({exc})")
    if missing:
        err.print(
            f"[yellow]serving with {loop} and {'h11' if http == 'h11' else 'httptools'}:[/] "
            f"{escape('; '.join(missing))} (slower requests; docs/performance.md)",
            soft_wrap=True,
        )
    return loop, http


def _tls_options(cert: Path | None, key: Path | None, client_ca: Path | None) -> dict[str, Any]:
    """uvicorn's TLS arguments, or a clear error for an incomplete or unreadable configuration.

    Each file is loaded here, before the server binds, so that a wrong path or a key that does
    not match its certificate stops ``serve`` with the reason instead of a traceback.
    """
    import ssl

    if cert is None and key is None:
        if client_ca is not None:
            fail("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is on top of https)")
        return {}
    if cert is None or key is None:
        fail("--tls-cert and --tls-key go together (FEDAUDIT_TLS_CERTFILE, FEDAUDIT_TLS_KEYFILE)")
    for label, path in (("certificate", cert), ("key", key), ("client CA", client_ca)):
        if path is not None and not path.is_file():
            fail(f"TLS {label} {path}: no such file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
        if client_ca is not None:
            context.load_verify_locations(str(client_ca))
    except (ssl.SSLError, ValueError) as exc:
        fail(f"TLS: cannot load the certificate, key or client CA: {exc}")
    options: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        options["ssl_ca_certs"] = str(client_ca)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply the database migrations (default: up to head)."""
    from service.store.migrate import upgrade

    settings = env_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url, revision)
    stdout().print(f"database at {revision}: {_redact(settings.resolved_database_url)}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@app.command()
def openapi(
    output: Annotated[Path, typer.Option(help="Where to write the spec")] = Path(
        "openapi/openapi.json"
    ),
) -> None:
    """Write the OpenAPI spec of the HTTP API."""
    from service.openapi_spec import write_spec

    write_spec(output)
    stdout().print(f"wrote {output}")
