"""``fedaudit rounds``, ``events`` and ``report``: what an operator reads back, over HTTP."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from client_sdk.flower_report import (
    FlowerReportError,
    flower_report_csv,
    read_flower_report,
    render_flower_report,
)
from client_sdk.report_table import render_report
from service.cli._app import (
    CsvOption,
    JsonOption,
    TokenOption,
    UrlOption,
    admin_client,
    app,
    call,
    fail,
    output_format,
    stdout,
    write_csv,
    write_json,
)


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
    fmt = output_format(csv_output, json_output)
    with admin_client(url, token) as admin:
        items = call(admin.get_json_pages, f"/federations/{federation_id}/rounds", cursor="offset")
    if fmt == "json":
        write_json(items)
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
        write_csv(keys, rows)
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
    stdout().print(table)


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
    fmt = output_format(csv_output, json_output)
    filters = {k: v for k, v in (("kind", kind), ("client_id", client_id)) if v}
    with admin_client(url, token) as admin:
        items = call(
            admin.get_json_pages,
            f"/federations/{federation_id}/events",
            cursor="after_id",
            **filters,
        )
    if fmt == "json":
        write_json(items)
        return
    if fmt == "csv":
        keys = ["id", "created_at", "kind", "actor", "client_id", "round_id", "message", "data"]
        write_csv(keys, [[e.get(k) for k in keys] for e in items])
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
    stdout().print(table)


@app.command()
def report(
    federation_id: Annotated[
        str | None, typer.Argument(help="The federation (on the coordinator at --url)")
    ] = None,
    report_file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="Read a Flower run's report file (FedAuditStrategy's report_path) instead",
            dir_okay=False,
        ),
    ] = None,
    csv_output: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the JSON report")] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Print a federation's noisy-client report, or a Flower run's (--file)."""
    output_format(csv_output, json_output)
    if (federation_id is None) == (report_file is None):
        fail("give a FEDERATION_ID (a coordinator's federation) or --file (a Flower run's report)")
    if report_file is not None:
        try:
            document = read_flower_report(report_file)
        except FlowerReportError as exc:
            fail(str(exc))
        if json_output:
            write_json(document)
        elif csv_output:
            sys.stdout.write(flower_report_csv(document))
        else:
            stdout().print(render_flower_report(document))
        return
    with admin_client(url, token) as admin:
        if csv_output:
            sys.stdout.write(
                call(admin.get_text, f"/federations/{federation_id}/report", format="csv")
            )
            return
        data = call(admin.get_json, f"/federations/{federation_id}/report")
    if json_output:
        stdout().print_json(json.dumps(data))
        return
    stdout().print(render_report(data))
