"""Export the OpenAPI spec: ``fedaudit openapi`` or ``python -m service.openapi_spec``.

It builds the whole app (``service.main``), so it sits beside ``main`` and not in ``service.api``,
which never imports the module that assembles it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from service.config import Settings

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def build_spec() -> dict[str, Any]:
    """The app's schema, built with throw-away settings (nothing is written but a temp dir)."""
    from service.main import create_app

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            _env_file=None,
            data_dir=Path(tmp),
            admin_token=SecretStr("openapi-export-token"),
            check_migrations=False,
        )
        return create_app(settings, run_reaper=False).openapi()


def render(spec: dict[str, Any]) -> str:
    """The spec as the committed file holds it: sorted keys, two-space indent, final newline."""
    return json.dumps(spec, sort_keys=True, indent=2) + "\n"


def write_spec(output: Path = DEFAULT_OUTPUT) -> None:
    """Write the spec to ``output`` (the committed ``openapi/openapi.json`` by default)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(build_spec()), encoding="utf-8")


if __name__ == "__main__":
    write_spec()
