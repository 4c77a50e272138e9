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
* **A first layer that cannot take the task's samples**, checked only where the names tell
  the first layer: the state of an ``nn.Sequential`` (names ``0.weight``, ``1.0.bias``, ...;
  nested ones too) applies its modules in index order. Its first module with tensors must be a
  single layer (``weight``, and ``bias`` or not); any other first module (a block with its own
  names, a batch norm with its running statistics) is not checked. Then:

  - a ``Linear`` (a 2-D weight ``[out, in]`` with a bias of ``out``; an ``Embedding``'s
    ``[vocab, dim]`` has no bias and is not checked) that is the very first module reads the
    sample's last dimension, so ``in`` must be ``input_shape[-1]``; after modules without tensors
    (``Flatten``, pooling, ...) it reads at most the sample's ``prod(input_shape)`` values
    (flattening keeps them, pooling and cropping drop some), so ``in`` may not exceed that (the
    one layout refused wrongly: padding or upsampling, which add values, before the first
    ``Linear`` of a Sequential; such a model can wrap them with the ``Linear`` in a block);
  - a convolution that is the very first module (a weight ``[out, in/groups, k...]`` with one
    more dimension than ``input_shape``) reads ``input_shape[0]`` channels, which ``in`` must
    divide (some ``groups``), unless it is a transposed convolution (``[in, out/groups, k...]``)
    reading ``input_shape[0]`` channels.

  Any other layout (names of the model's own attributes such as ``fc1``, whose order the file
  does not keep; an LSTM; an embedding) is not checked: such a model that does not take the
  task's samples fails at the sites, which report the error to the coordinator (``site.error``
  events).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from service.coordinator.tensors import Manifest
from service.errors import Problem

SHOWN = 5
"""How many tensors a refusal lists."""


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _shape(manifest: Manifest, name: str) -> list[int]:
    return [int(d) for d in manifest[name]["shape"]]


def fit_problems(
    manifest: Manifest,
    *,
    num_classes: int,
    hyperparameters: Mapping[str, Any] | None = None,
    input_shape: Sequence[int] | None = None,
) -> list[Problem]:
    """The reasons the model cannot fit a ``num_classes`` task whose samples have
    ``input_shape``, each ``{"loc", "msg", "type"}`` with ``loc`` naming the tensor; empty when
    nothing is certainly wrong."""
    problems: list[Problem] = []
    if input_shape:
        problems += input_problems(manifest, [int(d) for d in input_shape])
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


def _first_layer(manifest: Manifest) -> tuple[str, bool] | None:
    """The prefix (``"0."``, ``"1.0."``) of an ``nn.Sequential``'s first layer with tensors,
    and whether it is the very first module (index 0 at every level); None when the names are
    not a Sequential's or the first module with tensors is not a single layer."""
    names = list(manifest)
    prefix, at_start = "", True
    while True:
        rest = [name[len(prefix) :] for name in names if name.startswith(prefix)]
        heads = {part.split(".", 1)[0] for part in rest}
        if rest and all("." in part for part in rest) and all(h.isdigit() for h in heads):
            first = min(heads, key=int)
            at_start = at_start and first == "0"
            prefix += first + "."
            continue
        if prefix and set(rest) in ({"weight"}, {"weight", "bias"}):
            return prefix, at_start
        return None


def input_problems(manifest: Manifest, input_shape: list[int]) -> list[Problem]:
    """A first layer that certainly cannot take samples of ``input_shape`` (see the module's
    docstring for when that is certain); empty otherwise."""
    found = _first_layer(manifest)
    if found is None:
        return []
    prefix, at_start = found
    weight = _shape(manifest, prefix + "weight")
    bias = _shape(manifest, prefix + "bias") if prefix + "bias" in manifest else None
    values = math.prod(input_shape)
    layer, shape = prefix.rstrip("."), list(input_shape)
    msg: str | None = None
    if len(weight) == 2 and bias == weight[:1]:
        features = weight[1]
        if at_start and features != input_shape[-1]:
            msg = (
                f"the first layer {layer!r} (weight {weight}) takes {features} input features, "
                f"but the task's samples of shape {shape} end in {input_shape[-1]} (flattened: "
                f"{values}; a Flatten before it makes them {values} features)"
            )
        elif not at_start and features > values:
            msg = (
                f"the first layer with weights {layer!r} (weight {weight}) takes {features} input "
                f"features, more than the {values} values of a sample of shape {shape}"
            )
    elif at_start and len(weight) == len(input_shape) + 1 >= 3:
        channels = input_shape[0]
        if channels % weight[1] != 0 and channels != weight[0]:
            msg = (
                f"the first layer {layer!r} (weight {weight}) is a convolution over {weight[1]} "
                f"input channels (per group), but the task's samples of shape {shape} have "
                f"{channels}"
            )
    if msg is None:
        return []
    return [{"loc": ["model", prefix + "weight"], "msg": msg, "type": "input_shape"}]
