"""``fedaudit federation ...`` and ``model init/upload``: federations and their initial model, over
HTTP (``model init`` writes the file locally)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Column, Table

from service.cli._app import (
    CsvOption,
    JsonOption,
    TokenOption,
    UrlOption,
    admin_client,
    call,
    fail,
    federation_app,
    model_app,
    output_format,
    stdout,
    write_csv,
    write_json,
)
from service.coordinator.signal_policy import SignalPolicy

# The privacy policy's options of `federation create` (config.privacy over the spec's).
MinClassCountOption = Annotated[
    int | None,
    typer.Option(
        "--min-class-count",
        min=0,
        help="Privacy policy: a class a site holds fewer samples of is sent as 'fewer "
        "than N' with no per-class loss (sets config.privacy.min_class_count; 0: off)",
    ),
]
CountBucketOption = Annotated[
    int | None,
    typer.Option(
        "--count-bucket",
        min=1,
        help="Privacy policy: sites send their sample and class counts rounded up to a "
        "multiple of N (sets config.privacy.count_bucket; 1: exact)",
    ),
]
NoiseMultiplierOption = Annotated[
    float | None,
    typer.Option(
        "--dp-noise-multiplier",
        help="Privacy policy: sigma of the Gaussian mechanism on the per-class loss and "
        "the probe softmax (sets config.privacy.dp_noise_multiplier; 0: off; needs "
        "--dp-clip-loss and --dp-delta, here or in the spec)",
    ),
]
ClipLossOption = Annotated[
    float | None,
    typer.Option(
        "--dp-clip-loss",
        help="Privacy policy: B, each per-sample loss clipped to [0, B] before the "
        "per-class mean (sets config.privacy.dp_clip_loss; > 0)",
    ),
]
ClipProbeOption = Annotated[
    float | None,
    typer.Option(
        "--dp-clip-probe",
        help="Privacy policy: R, each probe softmax row clipped to L2 distance R from the "
        "uniform row (sets config.privacy.dp_clip_probe; > 0; unset: no clipping)",
    ),
]
DeltaOption = Annotated[
    float | None,
    typer.Option(
        "--dp-delta",
        help="Privacy policy: the delta of the (epsilon, delta) the coordinator accounts "
        "(sets config.privacy.dp_delta; between 0 and 1, well below 1 / a site's samples)",
    ),
]


@federation_app.command("create")
def federation_create(
    spec: Annotated[Path, typer.Argument(help="JSON file: name, task, plan, config")],
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the new federation's id")
    ] = False,
    min_class_count: MinClassCountOption = None,
    count_bucket: CountBucketOption = None,
    dp_noise_multiplier: NoiseMultiplierOption = None,
    dp_clip_loss: ClipLossOption = None,
    dp_clip_probe: ClipProbeOption = None,
    dp_delta: DeltaOption = None,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Create a federation from a JSON spec (prints it as JSON; --quiet: only its id).

    --min-class-count, --count-bucket and the --dp-* options set the federation's signal
    privacy policy over the spec's config.privacy; the policy is checked as the coordinator
    checks it before anything is sent (a bad one: exit status 2, nothing created)."""
    try:
        body = json.loads(spec.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"cannot read the spec {str(spec)!r}: {exc.strerror or exc}", 2)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        fail(f"the spec {str(spec)!r} is not valid JSON: {exc}", 2)
    if not isinstance(body, dict):
        fail(
            f"the spec {str(spec)!r} must be a JSON object with name, task, plan and config, "
            f"not a {type(body).__name__}",
            2,
        )
    _set_privacy(
        body,
        spec,
        min_class_count=min_class_count,
        count_bucket=count_bucket,
        dp_noise_multiplier=dp_noise_multiplier,
        dp_clip_loss=dp_clip_loss,
        dp_clip_probe=dp_clip_probe,
        dp_delta=dp_delta,
    )
    with admin_client(url, token) as admin:
        federation = call(admin.create_federation, body)
    if quiet:
        typer.echo(str(federation.id))
        return
    stdout().print_json(federation.model_dump_json())


def _set_privacy(body: dict[str, Any], spec: Path, **settings: float | None) -> None:
    """Put the options given (not None) into the spec's config.privacy, and check the result
    with the coordinator's own model of the policy (exit status 2 when it refuses it)."""
    given = {key: value for key, value in settings.items() if value is not None}
    if not given:
        return
    config = body.setdefault("config", {})
    if not isinstance(config, dict):
        fail(f"the spec {str(spec)!r}: config must be a JSON object", 2)
    privacy = config.setdefault("privacy", {})
    if not isinstance(privacy, dict):
        fail(f"the spec {str(spec)!r}: config.privacy must be a JSON object", 2)
    privacy.update(given)
    try:
        SignalPolicy.model_validate(privacy)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'privacy'}: {error['msg']}"
            for error in exc.errors()
        )
        fail(f"the federation's privacy policy (config.privacy) is refused: {problems}", 2)


@federation_app.command("list")
def federation_list(
    csv_output: CsvOption = False,
    json_output: JsonOption = False,
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """List federations (a table, or --csv, or --json)."""
    fmt = output_format(csv_output, json_output)
    with admin_client(url, token) as admin:
        items = call(admin.list_federations)
    if fmt == "json":
        write_json([f.model_dump(mode="json") for f in items])
        return
    if fmt == "csv":
        write_csv(
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
    stdout().print(table)


@federation_app.command("show")
def federation_show(
    federation_id: str, url: UrlOption = "http://127.0.0.1:8000", token: TokenOption = ""
) -> None:
    """Show one federation."""
    with admin_client(url, token) as admin:
        federation = call(admin.get_federation, federation_id)
    stdout().print_json(federation.model_dump_json())


@federation_app.command("stop")
def federation_stop(
    federation_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why (told to every site)")],
    url: UrlOption = "http://127.0.0.1:8000",
    token: TokenOption = "",
) -> None:
    """Stop a federation for good: its open round fails and every site is told the reason."""
    with admin_client(url, token) as admin:
        federation = call(admin.stop_federation, federation_id, reason)
    stdout().print(
        escape(f"federation {federation.name} ({federation.id}): {federation.status_reason}")
    )


@federation_app.command("start")
def federation_start(
    federation_id: str, url: UrlOption = "http://127.0.0.1:8000", token: TokenOption = ""
) -> None:
    """Open round 0 now with the sites that have joined (at least the plan's min_clients);
    without it, round 0 opens when every registered site has joined."""
    with admin_client(url, token) as admin:
        federation = call(admin.start_federation, federation_id)
    stdout().print(
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
        fail(
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
        fail(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}")
    for part in attribute.split("."):
        if not hasattr(found, part):
            fail(f"{module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, nn.Module):
        if not callable(found):
            fail(f"{target} ({type(found).__name__}) is neither a torch.nn.Module nor a callable")
        torch.manual_seed(seed)
        try:
            found = found()
        except Exception as exc:  # noqa: BLE001 - the factory's failure, in one line
            fail(f"calling {target}() failed: {type(exc).__name__}: {exc}")
        if not isinstance(found, nn.Module):
            fail(f"{target}() returned a {type(found).__name__}, not a torch.nn.Module")
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
        fail(f"{out} exists: choose another --out, or --force to replace it", 2)
    from client_sdk import save_initial_model

    network = _load_module(module, seed)
    try:
        size = save_initial_model(network, out)
    except (TypeError, ValueError) as exc:
        fail(f"{module}: {exc}")
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    state = network.state_dict()
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    stdout().print(
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
        fail(f"cannot read {str(path)!r}: {exc.strerror or exc}", 2)
    with admin_client(url, token) as admin:
        model = call(admin.upload_initial_model, federation_id, data)
    stdout().print(
        f"model version {model.version} ({model.id}): {model.size_bytes} bytes, "
        f"sha256 {model.sha256}",
        soft_wrap=True,
    )
