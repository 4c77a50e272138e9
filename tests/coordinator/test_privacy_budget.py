"""The coordinator's privacy accounting (service/coordinator/privacy_budget.py) against bounds
derived here independently of dp-accounting, and the policy's DP settings."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import norm

from service.coordinator.privacy_budget import (
    epsilon,
    releases_per_update,
    report_privacy,
    round_privacy,
)
from service.coordinator.signal_policy import SignalPolicy, dp_problems

pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")


def exact_gaussian_epsilon(sigma: float, delta: float, releases: int) -> float:
    """The tight epsilon of ``releases`` Gaussian mechanisms of noise multiplier ``sigma``.

    Their composition is one Gaussian mechanism of multiplier sigma / sqrt(T), i.e. mu-GDP with
    mu = sqrt(T) / sigma (Dong, Roth & Su 2022, "Gaussian differential privacy", JRSS-B,
    Corollary 3.3), whose exact privacy profile is the analytic Gaussian mechanism's (Balle &
    Wang 2018, "Improving the Gaussian mechanism for differential privacy", Theorem 8; Dong et
    al., Corollary 2.13): delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).
    """
    mu = math.sqrt(releases) / sigma

    def gap(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))

    return float(brentq(lambda eps: gap(eps) - delta, 0.0, 500.0))


def rdp_epsilon(sigma: float, delta: float, releases: int) -> float:
    """The RDP bound minimised over real orders alpha > 1: the Gaussian's RDP is
    T alpha / (2 sigma^2) (Mironov 2017, "Renyi differential privacy", Proposition 7, composed
    by Proposition 1), converted by eps = rdp + log((alpha - 1) / alpha)
    - (log delta + log alpha) / (alpha - 1) (Canonne, Kamath & Steinke 2020, "The discrete
    Gaussian for differential privacy", Proposition 12)."""

    def bound(alpha: float) -> float:
        rdp = releases * alpha / (2 * sigma**2)
        return (
            rdp + math.log((alpha - 1) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
        )

    return float(minimize_scalar(bound, bounds=(1.0001, 10_000.0), method="bounded").fun)


@pytest.mark.parametrize(
    ("sigma", "delta", "releases"),
    [(1.0, 1e-5, 1), (1.0, 1e-5, 20), (4.0, 1e-6, 2), (10.0, 1e-5, 200), (0.7, 1e-3, 6)],
)
def test_the_accountants_epsilon_lies_between_the_exact_one_and_the_rdp_bound(
    sigma: float, delta: float, releases: int
) -> None:
    reported = epsilon(sigma, delta, releases)
    exact = exact_gaussian_epsilon(sigma, delta, releases)
    bound = rdp_epsilon(sigma, delta, releases)
    # An accountant's epsilon is an upper bound: never below the exact one ...
    assert reported >= exact * (1 - 1e-6)
    # ... and RDP is close to it for the Gaussian (within 15 % here) ...
    assert reported <= exact * 1.15
    # ... and equals the RDP bound, up to dp-accounting's finite grid of orders.
    assert reported == pytest.approx(bound, rel=0.02)


def test_a_known_value() -> None:
    # sigma = 1, delta = 1e-5, one release: the exact epsilon is 4.38 (Balle & Wang's analytic
    # Gaussian mechanism, computed above); RDP's bound is 4.73.
    assert exact_gaussian_epsilon(1.0, 1e-5, 1) == pytest.approx(4.377, abs=0.01)
    assert epsilon(1.0, 1e-5, 1) == pytest.approx(4.73, abs=0.02)
    assert epsilon(1.0, 1e-5, 0) == 0.0


def test_a_sites_epsilon_composes_its_updates_releases() -> None:
    policy = SignalPolicy(dp_noise_multiplier=2.0, dp_clip_loss=3.0, dp_delta=1e-5)
    signals = ["class_counts", "per_class_loss", "probe_softmax", "train_loss"]
    assert releases_per_update(signals) == 2
    assert releases_per_update(["train_loss", "per_class_loss"]) == 1
    stored = round_privacy(policy, signals, ["a", "b"], {"a": 3, "b": 1})
    assert stored is not None
    assert stored["releases_per_update"] == 2
    assert stored["releases_total"] == [6, 2]
    assert stored["epsilon_round"] == pytest.approx(epsilon(2.0, 1e-5, 2))
    assert stored["epsilon_total"][1] == pytest.approx(stored["epsilon_round"])
    assert stored["epsilon_total"][0] == pytest.approx(epsilon(2.0, 1e-5, 6))
    assert stored["epsilon_total"][0] > stored["epsilon_total"][1]
    assert round_privacy(SignalPolicy(), signals, ["a"], {"a": 1}) is None
    report = report_privacy({"privacy": policy.model_dump(), "signals": signals})
    assert report is not None
    assert report.epsilon_per_round == pytest.approx(stored["epsilon_round"])


@pytest.mark.parametrize(
    "settings",
    [
        {"dp_noise_multiplier": -1.0, "dp_clip_loss": 1.0, "dp_delta": 1e-5},
        {"dp_noise_multiplier": 1.0, "dp_delta": 1e-5},  # no clip
        {"dp_noise_multiplier": 1.0, "dp_clip_loss": 1.0},  # no delta
        {"dp_noise_multiplier": 1.0, "dp_clip_loss": 0.0, "dp_delta": 1e-5},
        {"dp_noise_multiplier": 1.0, "dp_clip_loss": 1.0, "dp_delta": 1.0},
        {"dp_noise_multiplier": 1.0, "dp_clip_loss": 1.0, "dp_delta": 1e-5, "dp_clip_probe": 0},
        {"dp_noise_multiplier": float("inf"), "dp_clip_loss": 1.0, "dp_delta": 1e-5},
        {"dp_clip_loss": 1.0},  # a clip without the mechanism
        {"dp_noise_multiplier": 0.0, "dp_delta": 1e-5},
    ],
)
def test_the_policy_refuses_invalid_dp_settings(settings: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        SignalPolicy.model_validate(settings)


def test_null_noise_is_off() -> None:
    assert not SignalPolicy.model_validate({"dp_noise_multiplier": None}).dp_active


def test_what_the_mechanism_forbids_in_an_update() -> None:
    policy = SignalPolicy(dp_noise_multiplier=1.0, dp_clip_loss=2.0, dp_delta=1e-5)
    good = {"class_counts": [4, 4], "per_class_loss": [0.0, 2.0]}
    assert dp_problems(good, policy) == []
    bad = {**good, "per_class_loss": [2.5, 1.0], "per_class_errors": [1, 0]}
    locs = [p["loc"] for p in dp_problems(bad, policy)]
    assert locs == [
        ["metadata", "signals", "per_class_errors"],
        ["metadata", "signals", "per_class_loss", 0],
    ]
    assert dp_problems(bad, SignalPolicy()) == []
