"""Client partitions of a labelled data set (the partitions of the five papers).

Every function returns one sorted int64 index array per client. The arrays are disjoint and cover
every sample, and every client gets at least one sample. All randomness comes from the
``numpy.random.Generator`` (or integer seed) passed in: the same seed gives the same partition.

Methods and their sources:

- ``iid``: a uniform random split into near-equal parts (sizes differ by at most one). FedCorr's
  IID sampler gives every client floor(N/K) samples and drops the remainder; we keep it.
- ``shards`` (FedRN; McMahan et al.): sort by label, cut into K*S near-equal shards, deal
  S random shards to each client. Ties in the label sort are broken randomly. S is the number of
  *shards*, not of classes: a client may get two shards of one class (fewer than S classes), and a
  shard that straddles a class boundary adds a class (more than S). ``k_classes`` is the
  partition with an exact number of classes per client.
- ``k_classes``: every client holds exactly ``k`` distinct classes and every class is held by some
  client (needs k <= C <= K * k). Clients, in a random order, each take the k classes with the
  fewest holders so far (ties broken at random), so the holder counts of the classes differ by at
  most one; each class's shuffled samples are then split into near-equal parts among its
  holders (so a class needs at least as many samples as it has holders).
- ``dirichlet`` (FedRN): for each class c, proportions q_c ~ Dirichlet(beta * 1_K); class
  c's shuffled samples are cut at floor(cumsum(q_c) * n_c).
- ``bernoulli_dirichlet`` (FedCorr, used by FLR and FedNoRo): class presence
  Phi[k, c] ~ Bernoulli(p); rows with no class are redrawn; each class's samples are assigned one by
  one to its holders by a categorical draw with Dirichlet(alpha * 1) proportions.
- ``lognormal_quantity`` (Fed-NCL): client sizes proportional to lognormal(0, sigma)
  draws (rounded by largest remainder), then an IID assignment of those counts.

Guarantees the reference code lacks (the authors' public code):

- ``bernoulli_dirichlet``: a class that no client holds after the Bernoulli draw is given to one
  uniformly drawn client, so every class has a holder.
- ``dirichlet`` and ``bernoulli_dirichlet``: when a client ends up empty, the random assignment is
  redrawn (``max_redraws`` times at most; for ``bernoulli_dirichlet`` only the Dirichlet and
  categorical part, Phi is kept); if a client is still empty after that, one uniformly drawn sample
  of the currently largest client (lowest index on ties) is moved to it, client by client in index
  order. The largest client always has at least two samples then, because N >= K.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "PARTITION_METHODS",
    "PARTITION_PARAMS",
    "PartitionError",
    "RngLike",
    "as_generator",
    "bernoulli_dirichlet",
    "dirichlet",
    "iid",
    "k_classes",
    "lognormal_quantity",
    "partition",
    "shards",
]

IntArray = npt.NDArray[np.int64]
RngLike = np.random.Generator | int

_MAX_ROW_REDRAWS: Final = 100_000


class PartitionError(ValueError):
    """A partition was asked for with invalid arguments or cannot be built."""


def as_generator(rng: RngLike) -> np.random.Generator:
    """Return ``rng`` itself, or a new ``numpy.random.Generator`` seeded with the int ``rng``.

    ``None`` is refused on purpose: every random draw of the simulator must be reproducible.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, bool) or not isinstance(rng, int | np.integer) or rng < 0:
        raise PartitionError(
            f"rng={rng!r} must be a numpy.random.Generator or a non-negative int seed"
        )
    return np.random.default_rng(int(rng))


def _check_labels(labels: npt.ArrayLike) -> IntArray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0:
        raise PartitionError(f"labels must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise PartitionError(f"labels must have an integer dtype, got {arr.dtype}")
    if int(arr.min()) < 0:
        raise PartitionError("labels must be non-negative class indices")
    return arr.astype(np.int64, copy=False)


def _check_num_clients(num_clients: int, n: int) -> int:
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer):
        raise PartitionError(f"num_clients={num_clients!r} must be an int")
    if num_clients < 1:
        raise PartitionError(f"num_clients={num_clients} must be at least 1")
    if num_clients > n:
        raise PartitionError(
            f"num_clients={num_clients} exceeds the {n} samples: every client needs one sample"
        )
    return int(num_clients)


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not np.isfinite(value) or value <= 0:
        raise PartitionError(f"{name}={value!r} must be a finite number > 0")
    return float(value)


def _check_redraws(max_redraws: int) -> int:
    if isinstance(max_redraws, bool) or not isinstance(max_redraws, int) or max_redraws < 0:
        raise PartitionError(f"max_redraws={max_redraws!r} must be an int >= 0")
    return max_redraws


def _to_lists(owner: IntArray, num_clients: int) -> list[IntArray]:
    """Turn a per-sample owner array into sorted per-client index arrays."""
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return [np.sort(part).astype(np.int64) for part in np.split(order, bounds)]


def _fill_empty_clients(owner: IntArray, num_clients: int, rng: np.random.Generator) -> None:
    """Move one random sample of the largest client to each empty client (in place)."""
    sizes = np.bincount(owner, minlength=num_clients)
    for client in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        moved = rng.choice(np.flatnonzero(owner == donor))
        owner[moved] = client
        sizes[donor] -= 1
        sizes[client] += 1


def iid(labels: npt.ArrayLike, num_clients: int, rng: RngLike) -> list[IntArray]:
    """Split the samples uniformly at random into near-equal client shares.

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample (only N is used).
    num_clients : int
        Number of clients K, at most N.
    rng : numpy.random.Generator or int
        Random source or seed.

    Returns
    -------
    list of numpy.ndarray
        K sorted index arrays; sizes floor(N/K) or floor(N/K) + 1.
    """
    y = _check_labels(labels)
    k = _check_num_clients(num_clients, y.size)
    gen = as_generator(rng)
    perm = gen.permutation(y.size)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, k)]


def shards(
    labels: npt.ArrayLike, num_clients: int, rng: RngLike, *, num_shards_per_client: int = 2
) -> list[IntArray]:
    """Label-sorted shards, ``num_shards_per_client`` random shards per client (FedRN, S = 2).

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample.
    num_clients : int
        Number of clients K.
    rng : numpy.random.Generator or int
        Random source or seed.
    num_shards_per_client : int
        Shards per client S; K * S must not exceed N.

    Returns
    -------
    list of numpy.ndarray
        K sorted index arrays.
    """
    y = _check_labels(labels)
    k = _check_num_clients(num_clients, y.size)
    s = num_shards_per_client
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise PartitionError(f"num_shards_per_client={s!r} must be an int >= 1")
    if k * s > y.size:
        raise PartitionError(
            f"num_clients * num_shards_per_client = {k * s} shards exceed the {y.size} samples"
        )
    gen = as_generator(rng)
    perm = gen.permutation(y.size)
    # Shuffling before a stable sort makes the order inside each class random.
    order = perm[np.argsort(y[perm], kind="stable")]
    pieces = np.array_split(order, k * s)
    dealt = gen.permutation(k * s)
    return [
        np.sort(np.concatenate([pieces[j] for j in dealt[c * s : (c + 1) * s]])).astype(np.int64)
        for c in range(k)
    ]


def k_classes(
    labels: npt.ArrayLike, num_clients: int, rng: RngLike, *, k: int = 2
) -> list[IntArray]:
    """Exactly ``k`` classes per client, every class held (module docstring).

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample; the classes are the labels present.
    num_clients : int
        Number of clients K.
    rng : numpy.random.Generator or int
        Random source or seed.
    k : int
        Classes per client, 1 <= k <= C, with K * k >= C so that every class has a holder.

    Returns
    -------
    list of numpy.ndarray
        K sorted index arrays; client i's samples cover exactly k classes.

    Raises
    ------
    PartitionError
        k out of range, too few clients to hold every class, or a class with fewer samples than
        holders.
    """
    y = _check_labels(labels)
    n_clients = _check_num_clients(num_clients, y.size)
    classes = np.unique(y)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise PartitionError(f"k={k!r} must be an int >= 1")
    if k > classes.size:
        raise PartitionError(f"k={k} exceeds the {classes.size} classes of the labels")
    if n_clients * k < classes.size:
        raise PartitionError(
            f"{n_clients} clients with k={k} classes each hold at most {n_clients * k} of the "
            f"{classes.size} classes; every class needs a holder"
        )
    gen = as_generator(rng)
    holders: list[list[int]] = [[] for _ in range(classes.size)]
    for client in gen.permutation(n_clients):
        counts = np.asarray([len(h) for h in holders])
        # Fewest holders first, ties in a random order.
        order = np.lexsort((gen.random(classes.size), counts))
        for j in order[:k]:
            holders[int(j)].append(int(client))
    owner = np.empty(y.size, dtype=np.int64)
    for j, c in enumerate(classes):
        members = gen.permutation(np.flatnonzero(y == c))
        if members.size < len(holders[j]):
            raise PartitionError(
                f"class {int(c)} has {members.size} sample(s) but {len(holders[j])} holders; "
                "with k_classes every holder needs one sample of each of its classes"
            )
        for client, part in zip(holders[j], np.array_split(members, len(holders[j])), strict=True):
            owner[part] = client
    return _to_lists(owner, n_clients)


def dirichlet(
    labels: npt.ArrayLike,
    num_clients: int,
    rng: RngLike,
    *,
    beta: float = 0.5,
    max_redraws: int = 100,
) -> list[IntArray]:
    """Per-class Dirichlet(beta) proportions over clients (FedRN, beta = 0.5).

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample.
    num_clients : int
        Number of clients K, at most N.
    rng : numpy.random.Generator or int
        Random source or seed.
    beta : float
        Dirichlet concentration; small values give strong label skew.
    max_redraws : int
        How many times the whole draw is repeated while some client is empty before the
        move-one-sample repair (module docstring).

    Returns
    -------
    list of numpy.ndarray
        K sorted index arrays, each non-empty.
    """
    y = _check_labels(labels)
    k = _check_num_clients(num_clients, y.size)
    b = _check_positive("beta", beta)
    redraws = _check_redraws(max_redraws)
    gen = as_generator(rng)
    classes = np.unique(y)
    owner = np.empty(y.size, dtype=np.int64)
    for _ in range(redraws + 1):
        for c in classes:
            members = gen.permutation(np.flatnonzero(y == c))
            share = gen.dirichlet(np.full(k, b))
            cuts = (np.cumsum(share) * members.size).astype(np.int64)[:-1]
            for client, part in enumerate(np.split(members, cuts)):
                owner[part] = client
        if np.all(np.bincount(owner, minlength=k) > 0):
            break
    else:
        _fill_empty_clients(owner, k, gen)
    return _to_lists(owner, k)


def bernoulli_dirichlet(
    labels: npt.ArrayLike,
    num_clients: int,
    rng: RngLike,
    *,
    p: float = 0.9,
    alpha: float = 2.0,
    max_redraws: int = 100,
) -> list[IntArray]:
    """FedCorr's non-IID sampler: Bernoulli(p) class presence, Dirichlet(alpha) shares.

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample.
    num_clients : int
        Number of clients K, at most N.
    rng : numpy.random.Generator or int
        Random source or seed.
    p : float
        Probability that a client holds a class, in (0, 1].
    alpha : float
        Dirichlet concentration of each class's split among its holders.
    max_redraws : int
        How many times the Dirichlet/categorical assignment is redrawn (Phi kept) while some
        client is empty, before the move-one-sample repair.

    Returns
    -------
    list of numpy.ndarray
        K sorted index arrays, each non-empty; every class is held by some client.
    """
    y = _check_labels(labels)
    k = _check_num_clients(num_clients, y.size)
    if isinstance(p, bool) or not 0.0 < float(p) <= 1.0:
        raise PartitionError(f"p={p!r} must lie in (0, 1]")
    a = _check_positive("alpha", alpha)
    redraws = _check_redraws(max_redraws)
    gen = as_generator(rng)
    classes = np.unique(y)
    phi = gen.random((k, classes.size)) < p
    for _ in range(_MAX_ROW_REDRAWS):
        empty_rows = np.flatnonzero(~phi.any(axis=1))
        if empty_rows.size == 0:
            break
        phi[empty_rows] = gen.random((empty_rows.size, classes.size)) < p
    else:
        raise PartitionError(
            f"p={p} is too small: some client still holds no class after {_MAX_ROW_REDRAWS} redraws"
        )
    # Guarantee (not in FedCorr): every class has a holder.
    for orphan in np.flatnonzero(~phi.any(axis=0)):
        phi[gen.integers(k), orphan] = True

    owner = np.empty(y.size, dtype=np.int64)
    for _ in range(redraws + 1):
        for j, c in enumerate(classes):
            holders = np.flatnonzero(phi[:, j])
            members = np.flatnonzero(y == c)
            share = gen.dirichlet(np.full(holders.size, a))
            owner[members] = gen.choice(holders, size=members.size, p=share)
        if np.all(np.bincount(owner, minlength=k) > 0):
            break
    else:
        _fill_empty_clients(owner, k, gen)
    return _to_lists(owner, k)


def lognormal_quantity(
    labels: npt.ArrayLike, num_clients: int, rng: RngLike, *, sigma: float = 0.3
) -> list[IntArray]:
    """Quantity skew: client sizes ~ lognormal(0, sigma), IID contents (Fed-NCL, sigma = 0.3).

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample (only N is used).
    num_clients : int
        Number of clients K, at most N.
    rng : numpy.random.Generator or int
        Random source or seed.
    sigma : float
        Standard deviation of the underlying normal; 0 gives near-equal sizes.

    Returns
    -------
    list of numpy.ndarray
        K sorted index arrays, each non-empty, sizes summing to N.
    """
    y = _check_labels(labels)
    k = _check_num_clients(num_clients, y.size)
    if isinstance(sigma, bool) or not np.isfinite(sigma) or sigma < 0:
        raise PartitionError(f"sigma={sigma!r} must be a finite number >= 0")
    gen = as_generator(rng)
    weights = gen.lognormal(mean=0.0, sigma=float(sigma), size=k)
    exact = weights / weights.sum() * y.size
    counts = np.floor(exact).astype(np.int64)
    # Largest remainder: the leftover samples go to the largest fractional parts.
    leftover = int(y.size - counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:leftover]] += 1
    while np.any(counts == 0):
        counts[int(np.argmax(counts))] -= 1
        counts[int(np.flatnonzero(counts == 0)[0])] += 1
    perm = gen.permutation(y.size)
    return [np.sort(part).astype(np.int64) for part in np.split(perm, np.cumsum(counts)[:-1])]


_METHODS: Final[dict[str, tuple[Callable[..., list[IntArray]], frozenset[str]]]] = {
    "iid": (iid, frozenset()),
    "shards": (shards, frozenset({"num_shards_per_client"})),
    "k_classes": (k_classes, frozenset({"k"})),
    "dirichlet": (dirichlet, frozenset({"beta", "max_redraws"})),
    "bernoulli_dirichlet": (bernoulli_dirichlet, frozenset({"p", "alpha", "max_redraws"})),
    "lognormal_quantity": (lognormal_quantity, frozenset({"sigma"})),
}
PARTITION_METHODS: Final[tuple[str, ...]] = tuple(_METHODS)
#: The keyword parameters each partition method accepts.
PARTITION_PARAMS: Final[dict[str, frozenset[str]]] = {
    name: params for name, (_, params) in _METHODS.items()
}


def partition(
    labels: npt.ArrayLike, num_clients: int, method: str, rng: RngLike, **params: Any
) -> list[IntArray]:
    """Partition samples among clients with the named method.

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class label of every sample.
    num_clients : int
        Number of clients K, at most N.
    method : str
        One of :data:`PARTITION_METHODS`.
    rng : numpy.random.Generator or int
        Random source or seed.
    **params
        The method's keyword parameters (see each function).

    Returns
    -------
    list of numpy.ndarray
        K sorted, disjoint, non-empty index arrays covering every sample.

    Raises
    ------
    PartitionError
        Unknown method, unknown parameter, invalid value, or an impossible request.
    """
    if method not in _METHODS:
        raise PartitionError(
            f"method={method!r} is not a partition method; choose one of "
            f"{', '.join(PARTITION_METHODS)}"
        )
    func, allowed = _METHODS[method]
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise PartitionError(
            f"partition method {method!r} has no parameter(s) {unknown}; "
            f"it accepts {sorted(allowed) or 'none'}"
        )
    return func(labels, num_clients, rng, **params)
