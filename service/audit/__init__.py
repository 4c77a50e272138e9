"""Pure audit algorithms (no I/O)."""
