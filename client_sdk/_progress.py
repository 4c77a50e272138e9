"""What a site says while it takes part: the default progress printer and the lines it prints
about a round (the `Participant`, ``client_sdk.participant``, decides when to say them).

Light on purpose (no torch): `RoundSummary` lives here, importable from
``client_sdk.participant`` and ``client_sdk`` as before.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

__all__ = ["RoundSummary", "print_progress", "round_line"]


def print_progress(line: str) -> None:
    """The default printer: one line on standard error."""
    print(f"fedaudit site: {line}", file=sys.stderr, flush=True)


@dataclass
class RoundSummary:
    """What one round did on this client (passed to `on_round`)."""

    round_index: int
    recipe: str
    train_loss: float
    train_seconds: float
    signal_seconds: float
    upload_bytes: int
    download_bytes: int
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    accepted: bool = True
    train_accuracy: float | None = None
    """The locally trained model's accuracy on this site's own training labels, when the
    federation's detectors asked for it (the ``train_accuracy`` signal, measured before any
    privacy noise); None otherwise."""


def round_line(summary: RoundSummary) -> str:
    """The progress line of an accepted round: time, local loss (and accuracy), upload size."""
    accuracy = (
        f", accuracy {summary.train_accuracy:.3f}" if summary.train_accuracy is not None else ""
    )
    return (
        f"round {summary.round_index}: trained in {summary.train_seconds:.1f} s, loss "
        f"{summary.train_loss:.4f}{accuracy}, uploaded {summary.upload_bytes / 1e3:.0f} kB"
    )
