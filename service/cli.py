"""The ``fedaudit`` command line.

Server side: ``serve``, ``db upgrade``, ``openapi``. Operator side, over HTTP against a running
coordinator (``--url`` / ``FEDAUDIT_URL``, ``--token`` / ``FEDAUDIT_ADMIN_TOKEN``):
``federation create/list/show/start/stop``, ``model upload``, ``client add/list/pin/unpin/...``,
``rounds``, ``events``, ``report``; ``model init`` writes the initial model file locally. Whole
runs on one machine: ``simulate`` and ``demo``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from client_sdk.report_table import output_console, render_report

app = typer.Typer(
    name="fedaudit",
    help="Audit label quality in a running federated-learning federation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
federation_app = typer.Typer(help="Federations (admin, over HTTP).", no_args_is_help=True)
client_app = typer.Typer(help="Clients of a federation (admin, over HTTP).", no_args_is_help=True)
model_app = typer.Typer(
    help="The initial model: write it from a torch module (init), send it (upload).",
    no_args_is_help=True,
)
admin_app = typer.Typer(
    help="The admin's credentials (on the coordinator host, against its database).",
    no_args_is_help=True,
)


def _version(value: bool) -> None:
    if value:
        from service import __version__

        typer.echo(f"fedaudit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """Audit label quality in a running federated-learning federation."""


app.add_typer(db_app, name="db")
app.add_typer(admin_app, name="admin")
app.add_typer(federation_app, name="federation")
app.add_typer(client_app, name="client")
app.add_typer(model_app, name="model")

err = Console(stderr=True)


def _stdout() -> Console:
    """Standard output, made at each use: a file or pipe gets 120 columns, as ``simulate``'s."""
    return output_console()


UrlOption = Annotated[str, typer.Option("--url", envvar="FEDAUDIT_URL", help="Coordinator URL")]
TokenOption = Annotated[
    str,
    typer.Option("--token", envvar="FEDAUDIT_ADMIN_TOKEN", help="Admin token", show_default=False),
]


CsvOption = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]


def _fail(message: str, code: int = 1) -> NoReturn:
    # The message is text, not markup: "fedaudit[vision]" or "spec[1].json" print as written.
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


_SERVER_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


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
    workers: Annotated[int, typer.Option(help="Worker processes")] = 1,
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
    import uvicorn

    from service.config import get_settings
    from service.errors import MigrationsNotAtHeadError
    from service.logs import log_config
    from service.main import create_app

    settings = get_settings()
    logs = log_config(settings.log_level, settings.log_format)
    tls = _tls_options(
        tls_cert or settings.tls_certfile,
        tls_key or settings.tls_keyfile,
        tls_client_ca or settings.tls_client_ca,
    )
    if settings.admin_token is None:
        token = settings.admin_secret()
        # worker processes read their settings from the environment: give them the same token
        os.environ["FEDAUDIT_ADMIN_TOKEN"] = token
        err.print(
            f"[yellow]FEDAUDIT_ADMIN_TOKEN is not set; this run's admin token is:[/] {token}",
            soft_wrap=True,
        )
    # From here every line has the configured format, the app's start-up included.
    replaced = _configure_logging(logs)
    try:
        if workers > 1:
            parent = create_app(settings, run_reaper=False)  # fail fast on the migration check
            if settings.startup_sweep:
                # once, here: a worker that uvicorn restarts must not sweep its siblings' uploads
                from service.coordinator.housekeeping import sweep_leftovers

                sweep_leftovers(parent.state.services)
                os.environ["FEDAUDIT_STARTUP_SWEEP"] = "false"
            parent.state.services.close()
            uvicorn.run(
                "service.main:create_app",
                factory=True,
                host=host or settings.host,
                port=port if port is not None else settings.port,
                workers=workers,
                log_config=logs,
                **tls,
            )
        else:
            uvicorn.run(
                create_app(settings),
                host=host or settings.host,
                port=port if port is not None else settings.port,
                log_level=settings.log_level.lower(),
                log_config=logs,
                **tls,
            )
    except MigrationsNotAtHeadError as exc:
        _restore_logging(replaced)
        _fail(str(exc))
    except BaseException:
        _restore_logging(replaced)
        raise


def _tls_options(cert: Path | None, key: Path | None, client_ca: Path | None) -> dict[str, Any]:
    """uvicorn's TLS arguments, or a clear error for an incomplete or unreadable configuration.

    Each file is loaded here, before the server binds, so that a wrong path or a key that does
    not match its certificate stops ``serve`` with the reason instead of a traceback.
    """
    import ssl

    if cert is None and key is None:
        if client_ca is not None:
            _fail("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is on top of https)")
        return {}
    if cert is None or key is None:
        _fail("--tls-cert and --tls-key go together (FEDAUDIT_TLS_CERTFILE, FEDAUDIT_TLS_KEYFILE)")
    for label, path in (("certificate", cert), ("key", key), ("client CA", client_ca)):
        if path is not None and not path.is_file():
            _fail(f"TLS {label} {path}: no such file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
        if client_ca is not None:
            context.load_verify_locations(str(client_ca))
    except (ssl.SSLError, ValueError) as exc:
        _fail(f"TLS: cannot load the certificate, key or client CA: {exc}")
    options: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        options["ssl_ca_certs"] = str(client_ca)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply the database migrations (default: up to head)."""
    from service.config import get_settings
    from service.store.migrate import upgrade

    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url, revision)
    _stdout().print(f"database at {revision}: {_redact(settings.resolved_database_url)}")


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
    _stdout().print(f"wrote {output}")


# --- admin over HTTP -----------------------------------------------------------------------------


def _admin(url: str, token: str) -> Any:
    from client_sdk import AdminClient

    if not token:
        _fail("an admin token is required (--token or FEDAUDIT_ADMIN_TOKEN)")
    return AdminClient(url, token, max_retries=2)


def _call(function: Any, *args: Any, **kwargs: Any) -> Any:
    from client_sdk import APIStatusError, CoordinatorSDKError

    try:
        return function(*args, **kwargs)
    except APIStatusError as exc:
        _fail(f"{exc.status_code}: {exc.problem.detail if exc.problem else exc}")
    except CoordinatorSDKError as exc:
        _fail(str(exc))


def _output_format(csv_output: bool, json_output: bool) -> str:
    """ "table", "csv" or "json"; --csv with --json is refused before any request."""
    if csv_output and json_output:
        _fail("--csv and --json exclude each other: choose one")
    return "csv" if csv_output else "json" if json_output else "table"


def _write_json(items: Any) -> None:
    """Plain JSON on standard output (no console styling or wrapping: it is for programs)."""
    sys.stdout.write(json.dumps(items, indent=2, ensure_ascii=False) + "\n")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    from service.coordinator.reports import csv_text

    return csv_text(str(value))  # a name or a message is not run as a spreadsheet formula


def _write_csv(header: list[str], rows: list[list[Any]]) -> None:
    import csv

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_csv_cell(v) for v in row] for row in rows)


@federation_app.command("create")
def federation_create(
    spec: Annotated[Path, typer.Argument(help="JSON file: name, task, plan, config")],
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the new federation's id")
    ] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Create a federation from a JSON spec (prints it as JSON; --quiet: only its id)."""
    try:
        body = json.loads(spec.read_text(encoding="utf-8"))
    except OSError as exc:
        _fail(f"cannot read the spec {str(spec)!r}: {exc.strerror or exc}", 2)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        _fail(f"the spec {str(spec)!r} is not valid JSON: {exc}", 2)
    if not isinstance(body, dict):
        _fail(
            f"the spec {str(spec)!r} must be a JSON object with name, task, plan and config, "
            f"not a {type(body).__name__}",
            2,
        )
    with _admin(url, token) as admin:
        federation = _call(admin.create_federation, body)
    if quiet:
        typer.echo(str(federation.id))
        return
    _stdout().print_json(federation.model_dump_json())


@federation_app.command("list")
def federation_list(
    csv_output: CsvOption = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """List federations (a table, or --csv, or --json)."""
    fmt = _output_format(csv_output, json_output)
    with _admin(url, token) as admin:
        items = _call(admin.list_federations)
    if fmt == "json":
        _write_json([f.model_dump(mode="json") for f in items])
        return
    if fmt == "csv":
        _write_csv(
            [
                "id",
                "name",
                "status",
                "status_reason",
                "joined_clients",
                "clients",
                "rounds_started",
                "rounds",
                "current_model_id",
                "created_at",
            ],
            [
                [
                    f.id,
                    f.name,
                    f.status,
                    f.status_reason,
                    f.joined_clients,
                    f.clients,
                    f.rounds_started,
                    f.plan.rounds,
                    f.current_model_id,
                    f.created_at,
                ]
                for f in items
            ],
        )
        return
    # Names wrap and an id (what every other command takes) stays on one line: neither is cut
    # short with an ellipsis, whatever the terminal's width.
    table = Table(Column("name", overflow="fold"), "status", "clients", "rounds")
    table.add_column("id", no_wrap=True, min_width=36)
    for f in items:
        table.add_row(
            escape(f.name),
            f.status,
            f"{f.joined_clients}/{f.clients}",
            f"{f.rounds_started}/{f.plan.rounds}",
            str(f.id),
        )
    _stdout().print(table)


@federation_app.command("show")
def federation_show(
    federation_id: str, url: UrlOption = "http://127.0.0.1:8000", token: TokenOption = ""
) -> None:
    """Show one federation."""
    with _admin(url, token) as admin:
        federation = _call(admin.get_federation, federation_id)
    _stdout().print_json(federation.model_dump_json())


@federation_app.command("stop")
def federation_stop(
    federation_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why (told to every site)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Stop a federation for good: its open round fails and every site is told the reason."""
    with _admin(url, token) as admin:
        federation = _call(admin.stop_federation, federation_id, reason)
    _stdout().print(
        escape(f"federation {federation.name} ({federation.id}): {federation.status_reason}")
    )


@federation_app.command("start")
def federation_start(
    federation_id: str, url: UrlOption = "http://127.0.0.1:8000", token: TokenOption = ""
) -> None:
    """Open round 0 now with the sites that have joined (at least the plan's min_clients);
    without it, round 0 opens when every registered site has joined."""
    with _admin(url, token) as admin:
        federation = _call(admin.start_federation, federation_id)
    _stdout().print(
        escape(
            f"federation {federation.name} ({federation.id}) is {federation.status}: round 0 "
            f"open with {federation.joined_clients} of {federation.clients} sites joined"
        )
    )


# --- the initial model ---------------------------------------------------------------------------


def _load_module(target: str, seed: int) -> Any:
    """The torch module named by "package.module:attribute": a module instance, or a callable
    (a class, a function) that returns one when called with no argument."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        _fail(
            f"--module {target!r}: expected MODULE:ATTRIBUTE, e.g. mypackage.models:make_model",
            2,
        )
    import importlib

    import torch
    from torch import nn

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module in the current directory, as `python -m` finds
    torch.manual_seed(seed)  # a module that builds its network when imported gets the seed too
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's import, in one line
        _fail(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}")
    for part in attribute.split("."):
        if not hasattr(found, part):
            _fail(f"{module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, nn.Module):
        if not callable(found):
            _fail(f"{target} ({type(found).__name__}) is neither a torch.nn.Module nor a callable")
        torch.manual_seed(seed)
        try:
            found = found()
        except Exception as exc:  # noqa: BLE001 - the factory's failure, in one line
            _fail(f"calling {target}() failed: {type(exc).__name__}: {exc}")
        if not isinstance(found, nn.Module):
            _fail(f"{target}() returned a {type(found).__name__}, not a torch.nn.Module")
    return found


@model_app.command("init")
def model_init(
    module: Annotated[
        str,
        typer.Option(
            "--module",
            "-m",
            help="MODULE:ATTRIBUTE, a torch.nn.Module or a callable returning one "
            "(e.g. mypackage.models:make_model; the current directory is importable)",
            metavar="MODULE:ATTR",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The file to write")] = Path(
        "initial.safetensors"
    ),
    seed: Annotated[int, typer.Option(help="torch's seed before calling the factory")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out")] = False,
) -> None:
    """Write the initial model file (safetensors) from a torch module, for `model upload`."""
    import hashlib

    if out.exists() and not force:
        _fail(f"{out} exists: choose another --out, or --force to replace it", 2)
    from client_sdk import save_initial_model

    network = _load_module(module, seed)
    try:
        size = save_initial_model(network, out)
    except (TypeError, ValueError) as exc:
        _fail(f"{module}: {exc}")
    except OSError as exc:
        _fail(f"cannot write {out}: {exc.strerror or exc}")
    state = network.state_dict()
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    _stdout().print(
        escape(
            f"wrote {out}: {len(state)} tensors, {sum(t.numel() for t in state.values())} "
            f"values, {size} bytes, sha256 {digest}"
        ),
        soft_wrap=True,
    )


@model_app.command("upload")
def model_upload(
    federation_id: str,
    path: Annotated[Path, typer.Argument(help="The initial model (safetensors)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Upload a federation's initial model (the coordinator checks it is plain safetensors)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read {str(path)!r}: {exc.strerror or exc}", 2)
    with _admin(url, token) as admin:
        model = _call(admin.upload_initial_model, federation_id, data)
    _stdout().print(
        f"model version {model.version} ({model.id}): {model.size_bytes} bytes, "
        f"sha256 {model.sha256}",
        soft_wrap=True,
    )


@client_app.command("add")
def client_add(
    federation_id: str,
    name: str,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Add a client and print its token (shown once)."""
    with _admin(url, token) as admin:
        created = _call(admin.add_client, federation_id, name)
    _stdout().print(escape(f"client {created.name} ({created.id})"))
    _stdout().print(f"token: {created.token}")


@client_app.command("anchor")
def client_anchor(
    federation_id: str,
    client_id: str,
    reason: Annotated[
        str, typer.Option(help="Why this site's labels can be trusted (kept in the event trail)")
    ] = "",
    remove: Annotated[bool, typer.Option("--remove", help="Remove the anchor mark")] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Mark a site as a trust anchor (curated labels) for the evidence detector, or --remove."""
    if remove and reason:
        _fail("--remove and --reason exclude each other: removing the mark takes no reason")
    if not remove and not reason:
        raise typer.BadParameter("a trust anchor needs --reason (or --remove)")
    with _admin(url, token) as admin:
        client = _call(admin.set_anchor, federation_id, client_id, None if remove else reason)
    state = "a trust anchor" if client.anchor else "not a trust anchor"
    _stdout().print(escape(f"client {client.name} ({client.id}) is {state}"))


class PinStatus(StrEnum):
    trusted = "trusted"
    suspect = "suspect"
    noisy = "noisy"


@client_app.command("pin")
def client_pin(
    federation_id: str,
    client_id: str,
    status: Annotated[PinStatus, typer.Option("--status", help="The status to hold")],
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the event trail)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Pin a site's status by hand: the detectors no longer change it until `client unpin`."""
    with _admin(url, token) as admin:
        client = _call(admin.pin_client, federation_id, client_id, status.value, reason)
    _stdout().print(escape(f"client {client.name} ({client.id}) is pinned {client.pinned_status}"))


@client_app.command("unpin")
def client_unpin(
    federation_id: str,
    client_id: str,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Remove a site's pin: the detectors decide its status again."""
    with _admin(url, token) as admin:
        client = _call(admin.unpin_client, federation_id, client_id)
    _stdout().print(
        escape(f"client {client.name} ({client.id}) is unpinned; its status: {client.status}")
    )


@client_app.command("rotate-token")
def client_rotate_token(
    federation_id: str,
    client_id: str,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Give a site a new token (printed once); its old token stops working at once."""
    with _admin(url, token) as admin:
        client = _call(admin.rotate_client_token, federation_id, client_id)
    err.print(escape(f"new token of client {client.name} ({client.id}), shown once:"))
    _stdout().print(client.token, soft_wrap=True)


@client_app.command("revoke-token")
def client_revoke_token(
    federation_id: str,
    client_id: str,
    reason: Annotated[str, typer.Option(help="Why (kept in the event trail)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Revoke a site's token: it is refused until `client rotate-token` gives it a new one."""
    with _admin(url, token) as admin:
        client = _call(admin.revoke_client_token, federation_id, client_id, reason)
    _stdout().print(escape(f"the token of client {client.name} ({client.id}) is revoked"))


@admin_app.command("rotate-token")
def admin_rotate_token() -> None:
    """Set a new admin token in the database (printed once). From then on it is the admin
    token on every replica, with no restart; FEDAUDIT_ADMIN_TOKEN and the previous tokens are
    refused, and every dashboard session ends."""
    from service.config import get_settings
    from service.coordinator import admin_auth
    from service.store.base import utcnow
    from service.store.migrate import check_at_head
    from service.store.session import make_engine, make_sessionmaker

    engine = make_engine(get_settings().resolved_database_url)
    try:
        check_at_head(engine)
        with make_sessionmaker(engine).begin() as session:
            new = admin_auth.rotate_admin_token(session, now=utcnow(), actor="cli")
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        _fail(str(exc))
    finally:
        engine.dispose()
    err.print("the new admin token, shown once (only its hash is stored):")
    _stdout().print(new, soft_wrap=True)


@admin_app.command("logout-everywhere")
def admin_logout_everywhere() -> None:
    """End every dashboard session."""
    from service.config import get_settings
    from service.coordinator import admin_auth
    from service.store.base import utcnow
    from service.store.migrate import check_at_head
    from service.store.session import make_engine, make_sessionmaker

    engine = make_engine(get_settings().resolved_database_url)
    try:
        check_at_head(engine)
        with make_sessionmaker(engine).begin() as session:
            ended = admin_auth.end_all_sessions(session, now=utcnow())
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        _fail(str(exc))
    finally:
        engine.dispose()
    _stdout().print(f"{ended} dashboard session(s) ended")


@client_app.command("list")
def client_list(
    federation_id: str,
    csv_output: CsvOption = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """List the clients of a federation (a table, or --csv, or --json)."""
    fmt = _output_format(csv_output, json_output)
    with _admin(url, token) as admin:
        clients = _call(admin.list_clients, federation_id)
    if fmt == "json":
        _write_json([c.model_dump(mode="json") for c in clients])
        return
    if fmt == "csv":
        _write_csv(
            [
                "id",
                "name",
                "status",
                "pinned_status",
                "pin_reason",
                "anchor",
                "anchor_reason",
                "num_samples",
                "joined_at",
                "last_seen_at",
            ],
            [
                [
                    c.id,
                    c.name,
                    c.status,
                    c.pinned_status,
                    c.pin_reason,
                    c.anchor,
                    c.anchor_reason,
                    c.num_samples,
                    c.joined_at,
                    c.last_seen_at,
                ]
                for c in clients
            ],
        )
        return
    table = Table(Column("name", overflow="fold"), "status", "samples", "joined")
    table.add_column("id", no_wrap=True, min_width=36)
    for c in clients:
        table.add_row(
            escape(c.name),
            c.pinned_status or c.status,
            str(c.num_samples or "-"),
            "yes" if c.joined_at else "no",
            str(c.id),
        )
    _stdout().print(table)


def _time(value: str | None) -> str:
    """ "2026-11-25 09:12:03" from an ISO 8601 timestamp of the API; "-" for none."""
    if not value:
        return "-"
    return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S")


@app.command()
def rounds(
    federation_id: str,
    csv_output: CsvOption = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """List a federation's rounds (a table, or --csv, or --json)."""
    fmt = _output_format(csv_output, json_output)
    with _admin(url, token) as admin:
        items = _call(admin.get_json_pages, f"/federations/{federation_id}/rounds", cursor="offset")
    if fmt == "json":
        _write_json(items)
        return
    if fmt == "csv":
        keys = [
            "index",
            "state",
            "state_reason",
            "opened_at",
            "deadline_at",
            "deadline_extensions",
            "closed_at",
            "selected_clients",
            "submitted_clients",
            "aggregation_rule",
            "coordinator_seconds",
            "model_in_id",
            "model_out_id",
            "id",
        ]
        rows = []
        for r in items:
            row = {**r, "selected_clients": len(r["selected_clients"])}
            row["submitted_clients"] = len(r["submitted_clients"])
            rows.append([row.get(k) for k in keys])
        _write_csv(keys, rows)
        return
    table = Table("round", "state", "opened", "closed", "updates", "aggregation")
    table.add_column("reason", overflow="fold")
    for r in items:
        table.add_row(
            str(r["index"]),
            r["state"],
            _time(r["opened_at"]),
            _time(r.get("closed_at")),
            f"{len(r['submitted_clients'])}/{len(r['selected_clients'])}",
            r.get("aggregation_rule") or "-",
            escape(r.get("state_reason") or ""),
        )
    _stdout().print(table)


@app.command()
def events(
    federation_id: str,
    kind: Annotated[str | None, typer.Option(help="Only this kind (e.g. client.pinned)")] = None,
    client_id: Annotated[str | None, typer.Option("--client", help="Only this client id")] = None,
    csv_output: CsvOption = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Print a federation's audit trail, oldest first (a table, or --csv, or --json)."""
    fmt = _output_format(csv_output, json_output)
    filters = {k: v for k, v in (("kind", kind), ("client_id", client_id)) if v}
    with _admin(url, token) as admin:
        items = _call(
            admin.get_json_pages,
            f"/federations/{federation_id}/events",
            cursor="after_id",
            **filters,
        )
    if fmt == "json":
        _write_json(items)
        return
    if fmt == "csv":
        keys = ["id", "created_at", "kind", "actor", "client_id", "round_id", "message", "data"]
        _write_csv(keys, [[e.get(k) for k in keys] for e in items])
        return
    table = Table("id", "time", "kind", "actor")
    table.add_column("message", overflow="fold")
    for e in items:
        table.add_row(
            str(e["id"]),
            _time(e["created_at"]),
            e["kind"],
            escape(e["actor"]),
            escape(e["message"]),
        )
    _stdout().print(table)


@app.command()
def report(
    federation_id: str,
    csv_output: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the JSON report")] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Print a federation's noisy-client report."""
    _output_format(csv_output, json_output)
    with _admin(url, token) as admin:
        if csv_output:
            sys.stdout.write(
                _call(admin.get_text, f"/federations/{federation_id}/report", format="csv")
            )
            return
        data = _call(admin.get_json, f"/federations/{federation_id}/report")
    if json_output:
        _stdout().print_json(json.dumps(data))
        return
    _stdout().print(render_report(data))


# --- commands of other packages: the simulator's ``simulate`` and ``demo`` -----------------------


def _add_plugin_commands() -> None:
    """Add the commands other installed packages declare in the entry-point group
    ``fedaudit.commands`` (name = the command, object = a typer command function).

    fedaudit's own simulator (``fedaudit_sim``) adds ``simulate`` and ``demo`` this way, so the
    service never imports its client. A declared command that cannot be loaded is an error, not a
    missing command.
    """
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            command = entry.load()
        except Exception as exc:
            raise RuntimeError(
                f"fedaudit command {entry.name!r} ({entry.value}) could not be loaded: {exc}"
            ) from exc
        app.command(entry.name)(command)


PLUGIN_GROUP = "fedaudit.commands"
_add_plugin_commands()


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
