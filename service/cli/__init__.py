"""The ``fedaudit`` command line.

Server side (:mod:`service.cli.server`): ``serve``, ``db upgrade``, ``openapi``. Operator side,
over HTTP against a running coordinator (``--url`` / ``FEDAUDIT_URL``, ``--token`` /
``FEDAUDIT_ADMIN_TOKEN``): ``federation create/list/show/start/stop`` and ``model upload``
(:mod:`service.cli.federations`), ``client add/list/pin/unpin/...``
(:mod:`service.cli.clients`), ``rounds``, ``events``, ``report`` (:mod:`service.cli.reading`),
``prune`` (:mod:`service.cli.retention`);
``model init`` writes the initial model file locally. Whole runs on one machine: ``simulate`` and
``demo``, added by the simulator (``fedaudit_sim``) through the entry-point group
``fedaudit.commands``. The command and its groups, and what the modules share, are in
:mod:`service.cli._app`.
"""

from __future__ import annotations

import importlib
import sys

from service.cli._app import app

__all__ = ["PLUGIN_GROUP", "app", "main"]

#: The modules whose decorators register the commands, in the order ``fedaudit --help`` lists them.
COMMAND_MODULES = ("server", "federations", "clients", "reading", "retention")
for _name in COMMAND_MODULES:
    importlib.import_module(f"service.cli.{_name}")


# --- commands of other packages: the simulator's ``simulate`` and ``demo`` -----------------------


def _add_plugin_commands() -> None:
    """Add the commands other installed packages declare in the entry-point group
    ``fedaudit.commands`` (name = the command, object = a typer command function).

    fedaudit's own simulator (``fedaudit_sim``) adds ``simulate`` and ``demo`` this way, so the
    service never imports its client. A declared command that cannot be loaded is left out with
    a warning on standard error that names it and why: a broken plugin must not stop
    ``fedaudit serve`` or ``fedaudit db upgrade``, and its absence must not go unnoticed.
    """
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            command = entry.load()
        except Exception as exc:
            print(
                f"fedaudit: warning: the command {entry.name!r} ({entry.value}) could not be "
                f"loaded and is left out: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            continue
        app.command(entry.name)(command)


PLUGIN_GROUP = "fedaudit.commands"
_add_plugin_commands()


def main() -> None:  # pragma: no cover - entry point
    app()
