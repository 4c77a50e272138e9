"""``fedaudit prune``: remove the model updates of a federation's old rounds, over HTTP."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from service.cli._app import (
    JsonOption,
    TokenOption,
    UrlOption,
    admin_client,
    app,
    call,
    stdout,
    write_json,
)


def _rounds(indices: list[int]) -> str:
    if not indices:
        return "none"
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(str(i) for i in indices)


@app.command()
def prune(
    federation_id: str,
    keep_rounds: Annotated[
        int | None,
        typer.Option(
            "--keep-rounds",
            min=0,
            help="Keep the updates of the last N finished rounds (default: the coordinator's "
            "retention_rounds setting)",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be pruned; change nothing")
    ] = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Prune a federation's old model updates: the blobs, probe softmax and centroids of the
    updates of rounds older than the last N finished ones. Kept: each site's latest update,
    every global model (initial and per round), the audit results, reports and events."""
    with admin_client(url, token) as admin:
        report = call(admin.prune, federation_id, keep_rounds=keep_rounds, dry_run=dry_run)
    if json_output:
        write_json(report.model_dump(mode="json"))
        return
    pruned, kept = report.pruned, report.kept
    verb = "would prune" if report.dry_run else "pruned"
    stdout().print(
        escape(
            f"federation {report.federation_id}: {verb} {pruned.updates} update(s) of rounds "
            f"{_rounds(pruned.rounds)} ({pruned.blobs} blob(s), {pruned.bytes} bytes; signals "
            f"{', '.join(pruned.signals)} removed from them)"
        )
    )
    stdout().print(
        escape(
            f"kept: the updates of the last {report.keep_rounds} finished round(s) (rounds "
            f"{_rounds(kept.rounds)}), {kept.latest_updates} older site's latest update(s), "
            f"{kept.neighbor_updates} neighbour model(s) of the open round, "
            f"{kept.global_models} global model(s); {kept.already_pruned} update(s) were "
            "pruned before"
        )
    )
