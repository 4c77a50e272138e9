"""``fedaudit client ...`` (over HTTP) and ``admin rotate-token/logout-everywhere`` (on the
coordinator host, against its database): sites, anchors, pins and credentials."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from service.cli._app import (
    CsvOption,
    JsonOption,
    TokenOption,
    UrlOption,
    admin_app,
    admin_client,
    call,
    client_app,
    env_settings,
    err,
    fail,
    output_format,
    stdout,
    write_csv,
    write_json,
)


@client_app.command("add")
def client_add(
    federation_id: str,
    name: str,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the new site's token")
    ] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Add a client and print its token (shown once; --quiet: only the token)."""
    with admin_client(url, token) as admin:
        created = call(admin.add_client, federation_id, name)
    if quiet:
        typer.echo(created.token)
        return
    stdout().print(escape(f"client {created.name} ({created.id})"))
    stdout().print(f"token: {created.token}")


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
        fail("--remove and --reason exclude each other: removing the mark takes no reason")
    if not remove and not reason:
        raise typer.BadParameter("a trust anchor needs --reason (or --remove)")
    with admin_client(url, token) as admin:
        client = call(admin.set_anchor, federation_id, client_id, None if remove else reason)
    state = "a trust anchor" if client.anchor else "not a trust anchor"
    stdout().print(escape(f"client {client.name} ({client.id}) is {state}"))


@client_app.command("suspend")
def client_suspend(
    federation_id: str,
    client_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the event trail)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Suspend a site: it is not selected for rounds (and leaves the open round unless its
    update is in) until `client resume`."""
    with admin_client(url, token) as admin:
        client = call(admin.suspend_client, federation_id, client_id, reason)
    stdout().print(escape(f"client {client.name} ({client.id}) is suspended"))


@client_app.command("resume")
def client_resume(
    federation_id: str,
    client_id: str,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Resume a suspended site: it can be selected again from the next round."""
    with admin_client(url, token) as admin:
        client = call(admin.suspend_client, federation_id, client_id, None)
    stdout().print(escape(f"client {client.name} ({client.id}) is resumed ({client.attendance})"))


# The API's attendance values as the table shows them.
ATTENDANCE_WORDS = {
    "not_joined": "not joined",
    "present": "yes",
    "absent": "absent",
    "suspended": "suspended",
    "token_revoked": "token revoked",
}


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
    with admin_client(url, token) as admin:
        client = call(admin.pin_client, federation_id, client_id, status.value, reason)
    stdout().print(escape(f"client {client.name} ({client.id}) is pinned {client.pinned_status}"))


@client_app.command("unpin")
def client_unpin(
    federation_id: str,
    client_id: str,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Remove a site's pin: the detectors decide its status again."""
    with admin_client(url, token) as admin:
        client = call(admin.unpin_client, federation_id, client_id)
    stdout().print(
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
    with admin_client(url, token) as admin:
        client = call(admin.rotate_client_token, federation_id, client_id)
    err.print(escape(f"new token of client {client.name} ({client.id}), shown once:"))
    stdout().print(client.token, soft_wrap=True)


@client_app.command("revoke-token")
def client_revoke_token(
    federation_id: str,
    client_id: str,
    reason: Annotated[str, typer.Option(help="Why (kept in the event trail)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Revoke a site's token: it is refused until `client rotate-token` gives it a new one."""
    with admin_client(url, token) as admin:
        client = call(admin.revoke_client_token, federation_id, client_id, reason)
    stdout().print(escape(f"the token of client {client.name} ({client.id}) is revoked"))


@admin_app.command("rotate-token")
def admin_rotate_token() -> None:
    """Set a new admin token in the database (printed once). From then on it is the admin
    token on every replica, with no restart; FEDAUDIT_ADMIN_TOKEN and the previous tokens are
    refused, and every dashboard session ends."""
    from service.coordinator import admin_auth
    from service.store.base import utcnow
    from service.store.migrate import check_at_head
    from service.store.session import DatabaseMissingError, make_engine, make_sessionmaker

    try:
        engine = make_engine(env_settings().resolved_database_url, must_exist=True)
    except DatabaseMissingError as exc:
        fail(str(exc))
    try:
        check_at_head(engine)
        with make_sessionmaker(engine).begin() as session:
            new = admin_auth.rotate_admin_token(session, now=utcnow(), actor="cli")
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        fail(str(exc))
    finally:
        engine.dispose()
    err.print("the new admin token, shown once (only its hash is stored):")
    stdout().print(new, soft_wrap=True)


@admin_app.command("logout-everywhere")
def admin_logout_everywhere() -> None:
    """End every dashboard session."""
    from service.coordinator import admin_auth
    from service.store.base import utcnow
    from service.store.migrate import check_at_head
    from service.store.session import DatabaseMissingError, make_engine, make_sessionmaker

    try:
        engine = make_engine(env_settings().resolved_database_url, must_exist=True)
    except DatabaseMissingError as exc:
        fail(str(exc))
    try:
        check_at_head(engine)
        with make_sessionmaker(engine).begin() as session:
            ended = admin_auth.end_all_sessions(session, now=utcnow())
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        fail(str(exc))
    finally:
        engine.dispose()
    stdout().print(f"{ended} dashboard session(s) ended")


@client_app.command("list")
def client_list(
    federation_id: str,
    csv_output: CsvOption = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """List the clients of a federation (a table, or --csv, or --json)."""
    fmt = output_format(csv_output, json_output)
    with admin_client(url, token) as admin:
        clients = call(admin.list_clients, federation_id)
    if fmt == "json":
        write_json([c.model_dump(mode="json") for c in clients])
        return
    if fmt == "csv":
        write_csv(
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
                "attendance",
                "missed_rounds",
                "suspend_reason",
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
                    c.attendance,
                    c.missed_rounds,
                    c.suspend_reason,
                ]
                for c in clients
            ],
        )
        return
    table = Table(Column("name", overflow="fold"), "status", "samples", "takes part")
    table.add_column("id", no_wrap=True, min_width=36)
    for c in clients:
        table.add_row(
            escape(c.name),
            # as the report's table: the pin wins and says so (--csv/--json: both columns)
            f"{c.pinned_status} (pinned)" if c.pinned_status else c.status,
            str(c.num_samples or "-"),
            ATTENDANCE_WORDS.get(c.attendance, c.attendance),
            str(c.id),
        )
    stdout().print(table)
