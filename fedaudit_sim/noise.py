"""Label noise for the simulator: the papers' protocols applied to a whole federation.

Two steps, both reproducible from an explicit ``numpy.random.Generator`` (or int seed):

1. :func:`noise_levels` draws each client's *target* noise rate (the protocols ``none``,
   ``linear``, ``rho_tau``, ``rho_range``, ``bernoulli``, ``truncated_gaussian``,
   ``clipped_gaussian``, ``uniform_all``; defined in ``fedaudit_sim.noise_protocols``).
2. :func:`flip_labels` flips one client's labels (the flip types ``symmetric``,
   ``symmetric_any``, ``pairflip``, ``asymmetric``, ``instance``; defined in
   ``fedaudit_sim.label_flips``, with :func:`instance_probabilities`); :func:`inject_noise`, here,
   applies it to every client of a partition and records, per client, the target rate, the
   realised rate (fraction of the client's labels that changed), the ground-truth noisy flag and
   the flipped mask (:class:`NoiseReport`).

This module is the noise API of docs/design/simulation-api.md: it re-exports the names of both
modules, so ``from fedaudit_sim.noise import noise_levels, flip_labels`` keeps working.

Ground-truth noisy flags come from the *realised* flips, never from the target rate alone: for
the two-group protocols (``none``, ``rho_tau``, ``rho_range``, ``bernoulli``, ``uniform_all``) a
client is noisy iff at least one of its labels changed (realised rate > 0); for the continuous ones
(``linear``, ``truncated_gaussian``, ``clipped_gaussian``) iff its realised rate is > 0 and >=
``threshold`` (default 0.1). A client with a positive target rate whose flips realise nothing (an
asymmetric class map whose source classes the client does not hold, or floor(rate * n) = 0) is
clean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedaudit_sim.label_flips import (
    FLIP_TYPES,
    InstanceProbabilities,
    check_instance_probs,
    check_labels,
    flip_labels,
    instance_probabilities,
)
from fedaudit_sim.noise_protocols import (
    CONTINUOUS_PROTOCOLS,
    NOISE_PROTOCOLS,
    TWO_GROUP_PROTOCOLS,
    NoiseError,
    check_rate,
    noise_levels,
)
from fedaudit_sim.partition import RngLike, as_generator

__all__ = [
    "CONTINUOUS_PROTOCOLS",
    "FLIP_TYPES",
    "NOISE_PROTOCOLS",
    "TWO_GROUP_PROTOCOLS",
    "InstanceProbabilities",
    "NoiseError",
    "NoiseReport",
    "flip_labels",
    "inject_noise",
    "instance_probabilities",
    "noise_levels",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


# eq=False: the fields hold numpy arrays, whose == is elementwise (no usable equality/hash).
@dataclass(frozen=True, eq=False)
class NoiseReport:
    """Noisy labels of a federation and the per-client ground truth.

    Attributes
    ----------
    noisy_labels : numpy.ndarray
        int64 (N,): the labels clients train on.
    flipped : numpy.ndarray
        bool (N,): True where the noisy label differs from the true one.
    target_rates : numpy.ndarray
        float64 (K,): the rates the protocol asked for.
    realised_rates : numpy.ndarray
        float64 (K,): fraction of each client's samples whose label changed.
    noisy_clients : numpy.ndarray
        bool (K,): ground-truth noisy flag, from the realised rates (rule in the module
        docstring).
    client_flipped : tuple of numpy.ndarray
        Per client, the flipped mask aligned with that client's index array.
    protocol, flip : str
        The client-level protocol and the flip type.
    threshold : float
        Realised-rate threshold used for the continuous protocols.
    notes : tuple of str
        Fallbacks taken (empty clients, non-converged instance models, ...).
    """

    noisy_labels: IntArray
    flipped: BoolArray
    target_rates: FloatArray
    realised_rates: FloatArray
    noisy_clients: BoolArray
    client_flipped: tuple[BoolArray, ...]
    protocol: str
    flip: str
    threshold: float
    notes: tuple[str, ...] = ()


def _check_partition(client_indices: Sequence[npt.ArrayLike], n: int) -> list[IntArray]:
    """Each client's sample indices as int64 arrays, checked: 1-D, in [0, n), disjoint."""
    parts: list[IntArray] = []
    seen = np.zeros(n, dtype=bool)
    for k, idx in enumerate(client_indices):
        arr = np.asarray(idx)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise NoiseError(f"client_indices[{k}] must be a 1-D integer array")
        arr = arr.astype(np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
            raise NoiseError(f"client_indices[{k}] has indices outside [0, {n})")
        if np.unique(arr).size != arr.size or np.any(seen[arr]):
            raise NoiseError(f"client_indices[{k}] repeats a sample: clients must be disjoint")
        seen[arr] = True
        parts.append(arr)
    return parts


def inject_noise(
    labels: npt.ArrayLike,
    client_indices: Sequence[npt.ArrayLike],
    levels: npt.ArrayLike,
    num_classes: int,
    flip: str,
    rng: RngLike,
    *,
    protocol: str,
    threshold: float = 0.1,
    class_map: Mapping[int, int] | None = None,
    instance_probs: npt.ArrayLike | None = None,
    x: npt.ArrayLike | None = None,
) -> NoiseReport:
    """Flip every client's labels at its target rate and record the ground truth.

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        True labels of all samples.
    client_indices : sequence of array_like of int
        Disjoint sample indices of each client (a partition); samples of no client keep their
        labels.
    levels : array_like of float, shape (K,)
        Target rate of each client (from :func:`noise_levels`).
    num_classes : int
        Number of classes C.
    flip : str
        One of :data:`FLIP_TYPES`.
    rng : numpy.random.Generator or int
        Random source or seed. Clients are processed in index order; a client with rate 0 draws
        nothing.
    protocol : str
        The protocol that produced ``levels``; it decides the ground-truth rule (a realised rate
        > 0, and >= ``threshold`` for a continuous protocol).
    threshold : float
        Realised rate at and above which a client counts as noisy under a continuous protocol.
    class_map : mapping, optional
        For ``asymmetric``.
    instance_probs : array_like, shape (N, C), optional
        For ``instance``: per-sample class probabilities. When omitted, ``x`` must be given and
        :func:`instance_probabilities` is fitted on each noisy client's own clean data.
    x : array_like, shape (N, ...), optional
        Features, used only for ``instance`` without ``instance_probs``.

    Returns
    -------
    NoiseReport
    """
    y = check_labels(labels, num_classes)
    parts = _check_partition(client_indices, y.size)
    rates, thr = _check_injection(levels, len(parts), protocol, threshold, flip)
    global_probs, feats = _instance_source(flip, instance_probs, x, y.size, num_classes)
    gen = as_generator(rng)
    noisy = y.copy()
    realised = np.zeros(len(parts))
    client_flipped: list[BoolArray] = []
    notes: list[str] = []
    for k, idx in enumerate(parts):
        if idx.size == 0:
            notes.append(f"client {k} has no samples: realised rate reported as 0")
            client_flipped.append(np.zeros(0, dtype=bool))
            continue
        if rates[k] == 0.0:
            client_flipped.append(np.zeros(idx.size, dtype=bool))
            continue
        probs: FloatArray | None = None
        if flip == "instance":
            probs = _client_probs(k, idx, y, num_classes, global_probs, feats, gen, notes)
        client_noisy, mask = flip_labels(
            y[idx],
            float(rates[k]),
            num_classes,
            flip,
            gen,
            class_map=class_map,
            instance_probs=probs,
        )
        noisy[idx] = client_noisy
        realised[k] = float(mask.sum()) / idx.size
        client_flipped.append(mask)
    return NoiseReport(
        noisy_labels=noisy,
        flipped=noisy != y,
        target_rates=rates.copy(),
        realised_rates=realised,
        noisy_clients=_ground_truth(realised, protocol, thr),
        client_flipped=tuple(client_flipped),
        protocol=protocol,
        flip=flip,
        threshold=thr,
        notes=tuple(notes),
    )


def _check_injection(
    levels: npt.ArrayLike, num_clients: int, protocol: str, threshold: float, flip: str
) -> tuple[FloatArray, float]:
    """The clients' target rates and the threshold, checked with the protocol and flip type."""
    rates = np.asarray(levels, dtype=np.float64)
    if rates.shape != (num_clients,):
        raise NoiseError(
            f"levels has shape {rates.shape}, expected ({num_clients},): one per client"
        )
    if not np.all(np.isfinite(rates)) or np.any(rates < 0) or np.any(rates > 1):
        raise NoiseError("levels must be rates in [0, 1]")
    if protocol not in NOISE_PROTOCOLS:
        raise NoiseError(
            f"protocol={protocol!r} is not a noise protocol; choose one of "
            f"{', '.join(NOISE_PROTOCOLS)}"
        )
    thr = check_rate("threshold", threshold)
    if flip not in FLIP_TYPES:
        raise NoiseError(f"flip={flip!r} is not a flip type; choose one of {', '.join(FLIP_TYPES)}")
    return rates, thr


def _instance_source(
    flip: str,
    instance_probs: npt.ArrayLike | None,
    x: npt.ArrayLike | None,
    n: int,
    num_classes: int,
) -> tuple[FloatArray | None, npt.NDArray[Any] | None]:
    """For ``instance`` flips, the given probabilities (N, C) or else the features to fit them
    on, client by client; ``(None, None)`` for the other flip types."""
    if flip != "instance":
        return None, None
    if instance_probs is not None:
        return check_instance_probs(instance_probs, n, num_classes), None
    if x is None:
        raise NoiseError("flip='instance' needs instance_probs or x")
    feats = np.asarray(x)
    if feats.shape[0] != n:
        raise NoiseError(f"x has {feats.shape[0]} rows, labels have {n}")
    return None, feats


def _client_probs(
    k: int,
    idx: IntArray,
    y: IntArray,
    num_classes: int,
    global_probs: FloatArray | None,
    feats: npt.NDArray[Any] | None,
    gen: np.random.Generator,
    notes: list[str],
) -> FloatArray:
    """Client ``k``'s class probabilities for the ``instance`` flip: its rows of the given ones,
    or :func:`instance_probabilities` fitted on its clean data (fallbacks noted in ``notes``)."""
    if global_probs is not None:
        return global_probs[idx]
    assert feats is not None  # _instance_source gives one or the other
    fitted = instance_probabilities(feats[idx], y[idx], num_classes, gen)
    if not fitted.converged:
        notes.append(f"client {k}: instance model did not converge (max_iter reached)")
    if fitted.note is not None:
        notes.append(f"client {k}: {fitted.note}")
    return fitted.probs


def _ground_truth(realised: FloatArray, protocol: str, threshold: float) -> BoolArray:
    """The ground-truth noisy flags from the realised rates (module docstring)."""
    # The truth is what was realised: a positive target rate that flipped nothing leaves the
    # client clean.
    noisy_clients: BoolArray = realised > 0
    if protocol not in TWO_GROUP_PROTOCOLS:
        # Tolerance so that a realised 3/30 counts as >= 0.1 whatever the float rounding.
        noisy_clients &= realised >= threshold - 1e-12
    return noisy_clients
