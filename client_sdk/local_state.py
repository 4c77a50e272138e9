"""Per-client state that survives a restart of the training script.

Several recipes keep information on the client between rounds:

- FLR (section 3.2, Algorithm 1 lines 15-17) keeps per-sample running averages
  ``s_i`` and ``m_i`` of the global and local predictions, for every round the client takes part in.
- FedRN (section 4.2) selects samples with the client's *own previous local model*,
  which is the model it trained the last time it was selected.
- Fed-NCL (section V-C) label correction status.

A cross-silo participant is a long-running script that may be restarted (a crash, a reboot, a
new release). :class:`LocalStateStore` keeps these values in memory and writes them under one
directory on :meth:`LocalStateStore.flush`: all tensors in one safetensors file, all JSON values
in one JSON file, each written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash leaves either the old or the new file, never a torn one. Nothing is
pickled. The two files are replaced one after the other (tensors first); a crash between the two
renames leaves new tensors with the previous JSON values, which every recipe tolerates (each
checks the shapes of what it reads and starts afresh on a mismatch).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

__all__ = [
    "LocalStateCorruptError",
    "LocalStateError",
    "LocalStateKeyError",
    "LocalStateStore",
]

_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.:/\-]{1,200}$")
_FORMAT = "fedaudit-local-state/1"


class LocalStateError(ValueError):
    """Base class of the errors raised by :class:`LocalStateStore`."""


class LocalStateKeyError(LocalStateError):
    """A key is not a simple string (letters, digits and ``_.:/-``, 1 to 200 characters)."""


class LocalStateCorruptError(LocalStateError):
    """A state file exists but cannot be read back (truncated, foreign or hand-edited)."""


def _check_key(key: object) -> str:
    if not isinstance(key, str) or _KEY_PATTERN.fullmatch(key) is None:
        raise LocalStateKeyError(
            f"key: {key!r} is not a simple string (letters, digits and '_.:/-', 1-200 chars)"
        )
    return key


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write(path: Path, payload: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            tmp.unlink()
        raise
    _fsync_directory(path.parent)


class LocalStateStore:
    """Key-value store for a client's state between rounds, optionally persisted to a directory.

    Parameters
    ----------
    directory : str or os.PathLike or None
        Where the state lives. ``None`` keeps it in memory only (simulations, tests). When the
        directory holds files written by an earlier :meth:`flush`, they are loaded now.

    Raises
    ------
    LocalStateCorruptError
        If a state file exists but cannot be read.

    Notes
    -----
    Tensors are stored as detached, contiguous CPU copies, and :meth:`get_tensor` returns a copy,
    so a caller can never change the stored value by mutating a tensor in place. Changes reach the
    disk only on :meth:`flush`.
    """

    TENSORS_FILE = "state.safetensors"
    JSON_FILE = "state.json"

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._directory = None if directory is None else Path(directory)
        self._tensors: dict[str, torch.Tensor] = {}
        self._json: dict[str, Any] = {}
        self._dirty = False
        if self._directory is not None:
            self._load(self._directory)

    @property
    def directory(self) -> Path | None:
        """The directory the state is flushed to (``None`` for an in-memory store)."""
        return self._directory

    @property
    def dirty(self) -> bool:
        """Whether there are changes that :meth:`flush` has not written yet."""
        return self._dirty

    def scratch_copy(self) -> LocalStateStore:
        """An in-memory copy (``directory`` None, so :meth:`flush` writes nothing): what a dry
        run (``Participant.preview``) trains with, leaving this store as it was."""
        copy = LocalStateStore(None)
        copy._tensors = {key: value.clone() for key, value in self._tensors.items()}
        copy._json = json.loads(json.dumps(self._json))
        return copy

    # -- tensors -------------------------------------------------------------------------
    def get_tensor(self, key: str) -> torch.Tensor | None:
        """Return a copy of the tensor stored under ``key``, or ``None`` when there is none."""
        value = self._tensors.get(_check_key(key))
        return None if value is None else value.clone()

    def put_tensor(self, key: str, tensor: torch.Tensor) -> None:
        """Store a CPU copy of ``tensor`` under ``key`` (replacing any previous value).

        Raises
        ------
        LocalStateKeyError
            If ``key`` is not a simple string.
        LocalStateError
            If ``tensor`` is not a ``torch.Tensor``.
        """
        _check_key(key)
        if not isinstance(tensor, torch.Tensor):
            raise LocalStateError(
                f"tensor: expected a torch.Tensor for {key!r}, got {type(tensor)}"
            )
        self._tensors[key] = tensor.detach().to("cpu", copy=True).contiguous()
        self._dirty = True

    def get_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Return copies of every tensor whose key starts with ``prefix``, prefix removed."""
        return {
            key[len(prefix) :]: value.clone()
            for key, value in self._tensors.items()
            if key.startswith(prefix)
        }

    def put_tensors(self, prefix: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Replace every tensor under ``prefix`` by ``tensors`` (keys are ``prefix + name``)."""
        for name in tensors:
            _check_key(prefix + name)
        self.delete_prefix(prefix)
        for name, tensor in tensors.items():
            self.put_tensor(prefix + name, tensor)

    # -- JSON ----------------------------------------------------------------------------
    def get_json(self, key: str, default: Any = None) -> Any:
        """Return a copy of the JSON value stored under ``key``, or ``default``."""
        if _check_key(key) not in self._json:
            return default
        return json.loads(json.dumps(self._json[key]))

    def put_json(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable ``value`` (finite numbers only) under ``key``.

        Raises
        ------
        LocalStateError
            If ``value`` cannot be written as strict JSON.
        """
        _check_key(key)
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise LocalStateError(f"value: not strict JSON for {key!r}: {exc}") from exc
        self._json[key] = json.loads(text)
        self._dirty = True

    # -- both ----------------------------------------------------------------------------
    def keys(self) -> Iterator[str]:
        """Iterate over every stored key, tensors first, each group sorted."""
        yield from sorted(self._tensors)
        yield from sorted(self._json)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` holds a tensor or a JSON value."""
        return key in self._tensors or key in self._json

    def delete(self, key: str) -> None:
        """Remove ``key`` (tensor or JSON); a missing key is not an error."""
        _check_key(key)
        if self._tensors.pop(key, None) is not None or self._json.pop(key, None) is not None:
            self._dirty = True

    def delete_prefix(self, prefix: str) -> None:
        """Remove every key (tensor or JSON) that starts with ``prefix``."""
        doomed = [k for k in (*self._tensors, *self._json) if k.startswith(prefix)]
        for key in doomed:
            self._tensors.pop(key, None)
            self._json.pop(key, None)
        if doomed:
            self._dirty = True

    def flush(self) -> None:
        """Write the state to the directory atomically; a no-op in memory or when unchanged."""
        if self._directory is None or not self._dirty:
            return
        self._directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(
            self._directory / self.TENSORS_FILE,
            save_safetensors(self._tensors, metadata={"format": _FORMAT}),
        )
        document = {"format": _FORMAT, "values": self._json}
        _atomic_write(
            self._directory / self.JSON_FILE,
            (json.dumps(document, allow_nan=False, sort_keys=True, indent=1) + "\n").encode(),
        )
        self._dirty = False

    def _load(self, directory: Path) -> None:
        tensors_path = directory / self.TENSORS_FILE
        json_path = directory / self.JSON_FILE
        if tensors_path.exists():
            try:
                loaded = load_safetensors(tensors_path.read_bytes())
            except (SafetensorError, ValueError, OSError) as exc:
                raise LocalStateCorruptError(f"{tensors_path}: cannot be read: {exc}") from exc
            for key in loaded:
                _check_key(key)
            self._tensors = dict(loaded)
        if json_path.exists():
            try:
                document = json.loads(json_path.read_text(encoding="utf-8"))
            except (ValueError, OSError) as exc:
                raise LocalStateCorruptError(f"{json_path}: cannot be read: {exc}") from exc
            if (
                not isinstance(document, dict)
                or document.get("format") != _FORMAT
                or not isinstance(document.get("values"), dict)
            ):
                raise LocalStateCorruptError(f"{json_path}: not a {_FORMAT} document")
            for key in document["values"]:
                _check_key(key)
            self._json = document["values"]
