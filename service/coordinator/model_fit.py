"""Whether an initial model can fit the federation's task, from its tensor names and shapes.

The coordinator sees a safetensors file: names, dtypes and shapes, in no particular order (the
header is not the module order, so "the last layer" cannot be read off it). It refuses a model
only where the shapes make the task impossible:

* **No tensor has a dimension of ``num_classes``.** Whatever layer produces the logits (a
  ``Linear`` ``[num_classes, in]``, a ``Conv`` ``[num_classes, C, k, k]``, a bias
  ``[num_classes]``, a custom ``[in, num_classes]`` matrix) holds a tensor with a dimension of
  ``num_classes``. When none does, the model cannot output one logit per class. (A model whose
  logits come from no parameter at all, e.g. slicing a larger output, would be refused too;
  such a model should declare its own output layer of ``num_classes``.)
* **A declared head that does not output ``num_classes``.** When the hyper-parameters name the
  head (``head_name``, the FedRN and RoFL recipes), its ``<head>.weight`` (when it has two or
  more dimensions, torch's ``[out, in, ...]`` layout) must have ``num_classes`` rows and its
  ``<head>.bias`` (one dimension) ``num_classes`` entries.

No input-size check: the first layer cannot be told from the file (no module order), and a
first layer whose input is not the flattened sample is common and legitimate (convolutions, an
embedding of token ids, an LSTM reading ``input_shape[-1]`` features per step, pooling before a
``Linear``). A model that does not take the task's samples fails at the sites, which report the
error to the coordinator (``site.error`` events).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from service.coordinator.tensors import Manifest

SHOWN = 5
"""How many tensors a refusal lists."""


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _shape(manifest: Manifest, name: str) -> list[int]:
    return [int(d) for d in manifest[name]["shape"]]


def fit_problems(
    manifest: Manifest, *, num_classes: int, hyperparameters: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The reasons the model cannot fit a ``num_classes`` task, each ``{"loc", "msg", "type"}``
    with ``loc`` naming the tensor; empty when nothing is certainly wrong."""
    problems: list[dict[str, Any]] = []
    head = (hyperparameters or {}).get("head_name")
    if isinstance(head, str):
        weight, bias = f"{head}.weight", f"{head}.bias"
        if weight in manifest and len(_shape(manifest, weight)) >= 2:
            rows = _shape(manifest, weight)[0]
            if rows != num_classes:
                problems.append(
                    {
                        "loc": ["model", weight],
                        "msg": f"the declared head {head!r} has weight shape "
                        f"{_shape(manifest, weight)}: {rows} outputs, but the task has "
                        f"{num_classes} classes",
                        "type": "head_outputs",
                    }
                )
        if bias in manifest and len(_shape(manifest, bias)) == 1:
            length = _shape(manifest, bias)[0]
            if length != num_classes:
                problems.append(
                    {
                        "loc": ["model", bias],
                        "msg": f"the declared head {head!r} has a bias of {length} entries, "
                        f"but the task has {num_classes} classes",
                        "type": "head_outputs",
                    }
                )
    if not any(num_classes in _shape(manifest, name) for name in manifest):
        layers = sorted(
            (name for name in manifest if len(_shape(manifest, name)) >= 2), key=_natural
        )
        last = layers[-SHOWN:]
        shown = ", ".join(f"{name} {_shape(manifest, name)}" for name in last)
        problems.append(
            {
                "loc": ["model", last[-1] if last else "*"],
                "msg": f"no tensor of the model has a dimension of {num_classes} (num_classes), "
                f"so no layer can output one logit per class"
                + (f"; its weights include {shown}" if shown else ""),
                "type": "num_classes",
            }
        )
    return problems
