"""Client noise levels for the simulator: the papers' protocols for each client's target rate.

:func:`noise_levels` draws each client's *target* noise rate, reproducibly from an explicit
``numpy.random.Generator`` (or int seed):

- ``none``: every rate 0.
- ``linear(lo, hi)`` (FedRN): rate_u = lo + u * (hi - lo) / K for client u = 0..K-1,
  so the last client gets just under ``hi`` (FedRN's "0.0-0.4" is 0.0 ... 0.396 with K = 100).
- ``rho_tau(rho, tau, exact_count=True)`` (FedCorr, as FLR uses it): floor(rho * K) noisy clients
  drawn without replacement (FedNoRo's exact fraction), or with ``exact_count=False`` each client
  noisy with probability rho independently (FedCorr's own rule); noisy rates ~ U(tau, 1).
- ``rho_range(rho, lo, hi)`` (FedNoRo): exactly floor(rho * K) noisy clients, rates
  ~ U(lo, hi).
- ``bernoulli(p)`` (Fed-NCL): each client clean with probability p, else rate 1.0.
- ``truncated_gaussian(mu, sigma)`` (Fed-NCL): N(mu, sigma^2) redrawn until it lies in [0, 1]
  (a truncated, not clipped, Gaussian; Fed-NCL's code neither truncates nor clips). No value
  sits exactly at 0 or 1 (a continuous draw hits them with probability 0).
- ``clipped_gaussian(mu, sigma, lo=0, hi=1)``: N(mu, sigma^2) drawn once per client and clipped
  to [lo, hi]: a draw below ``lo`` becomes exactly ``lo``, one above ``hi`` exactly ``hi``, so
  the mass of the tails accumulates at the bounds (with lo = 0, a share of the clients is
  exactly clean) instead of being spread over the interval as truncation does.
- ``uniform_all(eps)`` (RoFL): every client has rate eps.

``rho_tau``, ``rho_range`` and ``bernoulli`` also take ``noisy_clients=N`` instead of ``rho``
(resp. ``p``): exactly N noisy clients, drawn without replacement from the seed (the same draw
as floor(rho * K) = N would use); their rates as the protocol draws them (U(tau, 1),
U(lo, hi), 1.0). N must lie in [0, K].

Every count floor(r * n) of the noise modules (here and ``fedaudit_sim.label_flips``) is taken
as floor(r * n + 1e-9) (:func:`floor_count`), so that a product such as 0.29 * 100 =
28.999999999999996 counts as 29, not 28.

The protocols split in two groups for the ground truth (``fedaudit_sim.noise``):
:data:`TWO_GROUP_PROTOCOLS` and :data:`CONTINUOUS_PROTOCOLS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from fedaudit_sim.partition import RngLike, as_generator

__all__ = [
    "CONTINUOUS_PROTOCOLS",
    "NOISE_PROTOCOLS",
    "TWO_GROUP_PROTOCOLS",
    "NoiseError",
    "noise_levels",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

TWO_GROUP_PROTOCOLS: Final = frozenset({"none", "rho_tau", "rho_range", "bernoulli", "uniform_all"})
CONTINUOUS_PROTOCOLS: Final = frozenset({"linear", "truncated_gaussian", "clipped_gaussian"})

_COUNT_EPS: Final = 1e-9
_MIN_TRUNCATION_MASS: Final = 1e-6
_MAX_REJECTION_ROUNDS: Final = 100_000


class NoiseError(ValueError):
    """A noise protocol or label flip was asked for with invalid arguments."""


def floor_count(value: float) -> int:
    """floor(value), a product within 1e-9 below an integer counting as that integer."""
    return int(math.floor(value + _COUNT_EPS))


def check_rate(name: str, value: float) -> float:
    """``value`` as a float, or a :class:`NoiseError` naming ``name`` unless it is in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise NoiseError(f"{name}={value!r} must be a number in [0, 1]")
    if not 0.0 <= float(value) <= 1.0:
        raise NoiseError(f"{name}={value!r} must lie in [0, 1]")
    return float(value)


def _check_range(lo: float, hi: float) -> tuple[float, float]:
    """``lo`` and ``hi`` as rates with lo <= hi."""
    lo_f, hi_f = check_rate("lo", lo), check_rate("hi", hi)
    if lo_f > hi_f:
        raise NoiseError(f"lo={lo} must not exceed hi={hi}")
    return lo_f, hi_f


# --------------------------------------------------------------------------------------------
# client noise levels


def _levels_none(k: int, gen: np.random.Generator) -> FloatArray:
    """Protocol ``none``: every client clean."""
    return np.zeros(k)


def _levels_linear(
    k: int, gen: np.random.Generator, *, lo: float = 0.0, hi: float = 0.4
) -> FloatArray:
    """Protocol ``linear`` (FedRN): rates evenly spaced from ``lo`` towards ``hi``."""
    lo_f, hi_f = _check_range(lo, hi)
    return lo_f + np.arange(k, dtype=np.float64) * (hi_f - lo_f) / k


def _exact_subset(k: int, count: int, gen: np.random.Generator) -> IntArray:
    """``count`` of the ``k`` clients, drawn without replacement, in index order."""
    return np.sort(gen.permutation(k)[:count]).astype(np.int64)


def _check_count(k: int, noisy_clients: Any, rate_name: str, rate_given: bool) -> int:
    """Validate ``noisy_clients`` (an exact count of noisy clients) against ``k``."""
    if rate_given:
        raise NoiseError(f"give {rate_name} or noisy_clients, not both")
    if isinstance(noisy_clients, bool) or not isinstance(noisy_clients, int | np.integer):
        raise NoiseError(f"noisy_clients={noisy_clients!r} must be an int")
    if not 0 <= int(noisy_clients) <= k:
        raise NoiseError(f"noisy_clients={noisy_clients} must lie in [0, {k}] (the clients)")
    return int(noisy_clients)


def _noisy_subset(k: int, rho: float, gen: np.random.Generator, exact_count: bool) -> IntArray:
    """The noisy clients: exactly floor(rho * k) of them, or each with probability rho."""
    if exact_count:
        return _exact_subset(k, floor_count(rho * k), gen)
    return np.flatnonzero(gen.random(k) < rho).astype(np.int64)


def _levels_rho_tau(
    k: int,
    gen: np.random.Generator,
    *,
    rho: float | None = None,
    tau: float = 0.5,
    exact_count: bool = True,
    noisy_clients: int | None = None,
) -> FloatArray:
    """Protocol ``rho_tau`` (FedCorr): noisy clients with rates ~ U(tau, 1)."""
    tau_f = check_rate("tau", tau)
    if not isinstance(exact_count, bool):
        raise NoiseError(f"exact_count={exact_count!r} must be a bool")
    if noisy_clients is not None:
        count = _check_count(k, noisy_clients, "rho", rho is not None)
        if not exact_count:
            raise NoiseError("noisy_clients is an exact count: it cannot go with exact_count=false")
        noisy = _exact_subset(k, count, gen)
    else:
        rho_f = check_rate("rho", 0.4 if rho is None else rho)
        noisy = _noisy_subset(k, rho_f, gen, exact_count)
    rates = np.zeros(k)
    rates[noisy] = tau_f + (1.0 - tau_f) * gen.random(noisy.size)
    return rates


def _levels_rho_range(
    k: int,
    gen: np.random.Generator,
    *,
    rho: float | None = None,
    lo: float = 0.5,
    hi: float = 0.7,
    noisy_clients: int | None = None,
) -> FloatArray:
    """Protocol ``rho_range`` (FedNoRo): exactly floor(rho * k) noisy clients, rates ~ U(lo, hi)."""
    lo_f, hi_f = _check_range(lo, hi)
    if noisy_clients is not None:
        noisy = _exact_subset(k, _check_count(k, noisy_clients, "rho", rho is not None), gen)
    else:
        rho_f = check_rate("rho", 0.4 if rho is None else rho)
        noisy = _noisy_subset(k, rho_f, gen, exact_count=True)
    rates = np.zeros(k)
    rates[noisy] = gen.uniform(lo_f, hi_f, size=noisy.size)
    return rates


def _levels_bernoulli(
    k: int, gen: np.random.Generator, *, p: float | None = None, noisy_clients: int | None = None
) -> FloatArray:
    """Protocol ``bernoulli`` (Fed-NCL): each client clean with probability p, else rate 1."""
    if noisy_clients is not None:
        noisy = _exact_subset(k, _check_count(k, noisy_clients, "p", p is not None), gen)
        rates = np.zeros(k)
        rates[noisy] = 1.0
        return rates
    p_f = check_rate("p", 0.7 if p is None else p)
    clean = gen.random(k) < p_f
    return np.where(clean, 0.0, 1.0)


def _normal_cdf(z: float) -> float:
    """The standard normal distribution function at ``z``."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _levels_truncated_gaussian(
    k: int, gen: np.random.Generator, *, mu: float = 0.3, sigma: float = 0.4
) -> FloatArray:
    """Protocol ``truncated_gaussian`` (Fed-NCL): N(mu, sigma^2) redrawn until in [0, 1]."""
    if isinstance(mu, bool) or not math.isfinite(mu):
        raise NoiseError(f"mu={mu!r} must be a finite number")
    if isinstance(sigma, bool) or not math.isfinite(sigma) or sigma <= 0:
        raise NoiseError(f"sigma={sigma!r} must be a finite number > 0")
    mass = _normal_cdf((1.0 - mu) / sigma) - _normal_cdf((0.0 - mu) / sigma)
    if mass < _MIN_TRUNCATION_MASS:
        raise NoiseError(
            f"N(mu={mu}, sigma={sigma}) puts only {mass:.2e} of its mass in [0, 1]; redrawing "
            "until a value lands there would not finish"
        )
    rates = np.empty(k)
    todo = np.arange(k)
    for _ in range(_MAX_REJECTION_ROUNDS):
        if todo.size == 0:
            break
        draws = gen.normal(mu, sigma, size=todo.size)
        accepted = (draws >= 0.0) & (draws <= 1.0)
        rates[todo[accepted]] = draws[accepted]
        todo = todo[~accepted]
    else:  # pragma: no cover - needs an acceptance probability the guard above refuses
        raise NoiseError("truncated Gaussian rejection sampling did not finish")
    return rates


def _levels_clipped_gaussian(
    k: int,
    gen: np.random.Generator,
    *,
    mu: float = 0.3,
    sigma: float = 0.4,
    lo: float = 0.0,
    hi: float = 1.0,
) -> FloatArray:
    """Protocol ``clipped_gaussian``: N(mu, sigma^2) drawn once, clipped to [lo, hi]."""
    if isinstance(mu, bool) or not isinstance(mu, int | float) or not math.isfinite(mu):
        raise NoiseError(f"mu={mu!r} must be a finite number")
    if (
        isinstance(sigma, bool)
        or not isinstance(sigma, int | float)
        or not math.isfinite(sigma)
        or sigma <= 0
    ):
        raise NoiseError(f"sigma={sigma!r} must be a finite number > 0")
    lo_f, hi_f = _check_range(lo, hi)
    clipped: FloatArray = np.clip(gen.normal(mu, sigma, size=k), lo_f, hi_f)
    return clipped


def _levels_uniform_all(k: int, gen: np.random.Generator, *, eps: float = 0.2) -> FloatArray:
    """Protocol ``uniform_all`` (RoFL): every client at rate eps."""
    return np.full(k, check_rate("eps", eps))


_PROTOCOLS: Final[dict[str, tuple[Callable[..., FloatArray], frozenset[str]]]] = {
    "none": (_levels_none, frozenset()),
    "linear": (_levels_linear, frozenset({"lo", "hi"})),
    "rho_tau": (_levels_rho_tau, frozenset({"rho", "tau", "exact_count", "noisy_clients"})),
    "rho_range": (_levels_rho_range, frozenset({"rho", "lo", "hi", "noisy_clients"})),
    "bernoulli": (_levels_bernoulli, frozenset({"p", "noisy_clients"})),
    "truncated_gaussian": (_levels_truncated_gaussian, frozenset({"mu", "sigma"})),
    "clipped_gaussian": (_levels_clipped_gaussian, frozenset({"mu", "sigma", "lo", "hi"})),
    "uniform_all": (_levels_uniform_all, frozenset({"eps"})),
}
NOISE_PROTOCOLS: Final[tuple[str, ...]] = tuple(_PROTOCOLS)


def noise_levels(num_clients: int, protocol: str, rng: RngLike, **params: Any) -> FloatArray:
    """Draw each client's target noise rate.

    Parameters
    ----------
    num_clients : int
        Number of clients K >= 1.
    protocol : str
        One of :data:`NOISE_PROTOCOLS` (see the module docstring for each definition).
    rng : numpy.random.Generator or int
        Random source or seed.
    **params
        The protocol's parameters. Defaults are the papers' values: ``linear`` lo=0.0, hi=0.4
        (FedRN); ``rho_tau`` rho=0.4, tau=0.5, exact_count=True (FedCorr); ``rho_range`` rho=0.4,
        lo=0.5, hi=0.7 (FedNoRo); ``bernoulli`` p=0.7 and ``truncated_gaussian`` mu=0.3,
        sigma=0.4 (Fed-NCL); ``clipped_gaussian`` mu=0.3, sigma=0.4, lo=0.0,
        hi=1.0; ``uniform_all`` eps=0.2 (RoFL). ``noisy_clients=N`` replaces ``rho``
        (``rho_tau``, ``rho_range``) or ``p`` (``bernoulli``) by an exact count of noisy clients.

    Returns
    -------
    numpy.ndarray
        float64 rates in [0, 1], shape (K,).

    Raises
    ------
    NoiseError
        Unknown protocol or parameter, or an invalid value.
    """
    if protocol not in _PROTOCOLS:
        raise NoiseError(
            f"protocol={protocol!r} is not a noise protocol; choose one of "
            f"{', '.join(NOISE_PROTOCOLS)}"
        )
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer):
        raise NoiseError(f"num_clients={num_clients!r} must be an int")
    if num_clients < 1:
        raise NoiseError(f"num_clients={num_clients} must be at least 1")
    func, allowed = _PROTOCOLS[protocol]
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise NoiseError(
            f"noise protocol {protocol!r} has no parameter(s) {unknown}; "
            f"it accepts {sorted(allowed) or 'none'}"
        )
    rates = func(int(num_clients), as_generator(rng), **params)
    return np.asarray(rates, dtype=np.float64)
