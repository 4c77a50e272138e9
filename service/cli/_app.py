"""The ``fedaudit`` command and its groups, and what the command modules share: the output
(standard output and error, CSV and JSON), errors, and the admin client over HTTP."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup

from client_sdk.report_table import output_console


class _ReadableArgument(TyperArgument):
    """An argument whose help row shows its name, not also ``<str>`` beside it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        shown = self.display_type(ctx)
        return None if shown == "<str>" else shown


def _named(params: list[Any]) -> list[Any]:
    """``params`` with readable metavars where they have none: ``FEDERATION_ID`` for an
    argument or an option's value (``--url URL``), nothing for a flag; an option's choices stay
    as typer prints them (``trusted|suspect|noisy``)."""
    for param in params:
        if isinstance(param, TyperArgument):
            param.__class__ = _ReadableArgument  # a subclass that adds no state: only its help
        descriptor = getattr(param, "type_descriptor", None)
        if param.metavar is None and not (descriptor is not None and descriptor.is_choice):
            flag = bool(getattr(param, "is_flag", False))
            param.metavar = "" if flag else (param.name or "").upper()
    return params


class _ReadableCommand(TyperCommand):
    """A command whose help names its parameters plainly (`_named`) and whose usage line reads
    ``FEDERATION_ID NAME`` (optional ones in brackets) instead of typer's ``{federation_id}``."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _named(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                name = name if param.required else f"[{name}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


class _ReadableGroup(TyperGroup):
    """The ``fedaudit`` group: once every command (the plugins' too) is built, each group and
    command prints its help as `_ReadableCommand` does (typer would print ``<str>``,
    ``<bool>`` and ``{federation_id}``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable(self)

    def get_params(self, ctx: Any) -> list[Any]:
        return _named(super().get_params(ctx))


def _readable(command: Any) -> None:
    if isinstance(command, TyperGroup):
        command.__class__ = _ReadableGroup  # subclasses that add no state: only their help
        for sub in command.commands.values():
            _readable(sub)
    elif isinstance(command, TyperCommand):
        command.__class__ = _ReadableCommand


app = typer.Typer(
    name="fedaudit",
    help="Audit label quality in a running federated-learning federation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=_ReadableGroup,
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


def stdout() -> Console:
    """Standard output, made at each use: a file or pipe gets 120 columns, as ``simulate``'s."""
    return output_console()


UrlOption = Annotated[str, typer.Option("--url", envvar="FEDAUDIT_URL", help="Coordinator URL")]
TokenOption = Annotated[
    str,
    typer.Option("--token", envvar="FEDAUDIT_ADMIN_TOKEN", help="Admin token", show_default=False),
]


CsvOption = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]


def fail(message: str, code: int = 1) -> NoReturn:
    # The message is text, not markup: "fedaudit[vision]" or "spec[1].json" print as written.
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def env_settings() -> Any:
    """The coordinator's settings from the environment, or the CLI's error saying which value
    is not valid (instead of pydantic's traceback)."""
    from service.config import SettingsError, get_settings

    try:
        return get_settings()
    except SettingsError as exc:
        fail(str(exc))


class _RetryNotice(logging.Handler):
    """Says on stderr when the SDK waits before retrying a request (a 429 with its
    Retry-After, a 5xx, no answer): the CLI would otherwise sit silent for up to a minute."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(f"[yellow]waiting:[/] {escape(record.getMessage())}", soft_wrap=True)


def _announce_retries() -> None:
    sdk_log = logging.getLogger("client_sdk")
    if not any(isinstance(h, _RetryNotice) for h in sdk_log.handlers):
        handler = _RetryNotice(logging.INFO)
        handler.addFilter(lambda record: record.getMessage().startswith("retrying"))
        sdk_log.addHandler(handler)
        sdk_log.setLevel(min(sdk_log.getEffectiveLevel(), logging.INFO))


def admin_client(url: str, token: str) -> Any:
    from client_sdk import AdminClient

    if not token:
        fail("an admin token is required (--token or FEDAUDIT_ADMIN_TOKEN)")
    _announce_retries()
    return AdminClient(url, token, max_retries=2)


def call(function: Any, *args: Any, **kwargs: Any) -> Any:
    from client_sdk import APIStatusError, CoordinatorSDKError

    try:
        return function(*args, **kwargs)
    except APIStatusError as exc:
        fail(f"{exc.status_code}: {exc.problem.detail if exc.problem else exc}")
    except CoordinatorSDKError as exc:
        fail(str(exc))


def output_format(csv_output: bool, json_output: bool) -> str:
    """ "table", "csv" or "json"; --csv with --json is refused before any request."""
    if csv_output and json_output:
        fail("--csv and --json exclude each other: choose one")
    return "csv" if csv_output else "json" if json_output else "table"


def write_json(items: Any) -> None:
    """Plain JSON on standard output (no console styling or wrapping: it is for programs)."""
    sys.stdout.write(json.dumps(items, indent=2, ensure_ascii=False) + "\n")


def csv_cell(value: Any) -> str:
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
    from service.coordinator.report_csv import csv_text

    return csv_text(str(value))  # a name or a message is not run as a spreadsheet formula


def write_csv(header: list[str], rows: list[list[Any]]) -> None:
    import csv

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([csv_cell(v) for v in row] for row in rows)
