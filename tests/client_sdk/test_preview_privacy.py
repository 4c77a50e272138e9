"""What `Participant.preview()` shows of the privacy policy and its cost
(client_sdk/privacy_budget.py, `preview_privacy`), on literal policies.

The expected epsilons were computed independently of dp-accounting, with the two formulas of
tests/coordinator/test_privacy_budget.py: the Renyi-DP bound of T Gaussian releases of noise
multiplier sigma, min over alpha of T alpha / (2 sigma^2) + log((alpha - 1) / alpha)
- (log delta + log alpha) / (alpha - 1), which an RDP accountant reports up to its grid of orders,
and the exact (analytic Gaussian) epsilon of mu-GDP with mu = sqrt(T) / sigma, which no valid
accountant goes below. For sigma = 2, delta = 1e-5:

======  ==========  =====
T       RDP bound   exact
======  ==========  =====
2       3.189       2.943
20      12.300      11.480
======  ==========  =====
"""

from __future__ import annotations

import json
import sys

import pytest

from client_sdk._responses import SignalPolicy
from client_sdk.privacy_budget import preview_privacy

DP = SignalPolicy(
    min_class_count=5, count_bucket=10, dp_noise_multiplier=2.0, dp_clip_loss=3.0, dp_delta=1e-5
)
SIGNALS = ["class_counts", "per_class_loss", "per_class_loss_sd", "train_loss", "probe_softmax"]


def test_without_the_mechanism_the_preview_shows_the_counts_policy_only() -> None:
    shown = preview_privacy(SignalPolicy(min_class_count=5, count_bucket=10), SIGNALS, 10)
    assert shown == {"min_class_count": 5, "count_bucket": 10, "mechanism": None}


def test_the_preview_states_the_rounds_and_the_plans_epsilon() -> None:
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    shown = preview_privacy(DP, SIGNALS, 10)
    json.dumps(shown)  # plain JSON
    assert shown["mechanism"] == "gaussian"
    assert shown["noise_multiplier"] == 2.0
    assert shown["clip_loss"] == 3.0
    assert shown["clip_probe"] is None
    assert shown["delta"] == 1e-5
    assert shown["accountant"] == "dp-accounting RDP"
    # per_class_loss and probe_softmax are noised: 2 releases per update, 20 in 10 rounds
    assert shown["releases_per_update"] == 2
    assert shown["rounds"] == 10
    assert shown["epsilon_round"] == pytest.approx(3.189, abs=0.01)
    assert shown["epsilon_round"] >= 2.943
    assert shown["epsilon_total"] == pytest.approx(12.300, abs=0.02)
    assert shown["epsilon_total"] >= 11.480
    assert shown["epsilon_unavailable"] is None


def test_one_noised_signal_is_one_release() -> None:
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    # sigma = 1, delta = 1e-5, one release: 4.73 (the value the coordinator's tests pin)
    policy = SignalPolicy(dp_noise_multiplier=1.0, dp_clip_loss=1.0, dp_delta=1e-5)
    shown = preview_privacy(policy, ["class_counts", "per_class_loss"], 1)
    assert shown["releases_per_update"] == 1
    assert shown["epsilon_round"] == pytest.approx(4.73, abs=0.02)
    assert shown["epsilon_total"] == pytest.approx(4.73, abs=0.02)


def test_the_preview_and_the_coordinator_account_alike() -> None:
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    from service.coordinator.privacy_budget import report_privacy, round_privacy
    from service.coordinator.signal_policy import SignalPolicy as CoordinatorPolicy

    coordinator_policy = CoordinatorPolicy.model_validate(DP.model_dump())
    report = report_privacy({"privacy": DP.model_dump(), "signals": SIGNALS})
    # a site that sent an update in each of the 10 rounds, at the 10th round's audit
    stored = round_privacy(coordinator_policy, SIGNALS, ["a"], {"a": 10})
    assert report is not None
    assert stored is not None
    shown = preview_privacy(DP, SIGNALS, 10)
    assert shown["epsilon_round"] == report.epsilon_per_round == stored["epsilon_round"]
    assert shown["epsilon_total"] == stored["epsilon_total"][0]


def test_before_a_round_is_open_the_epsilon_is_not_known_and_says_why() -> None:
    shown = preview_privacy(DP)  # the task's policy: no signals, no plan
    assert shown["mechanism"] == "gaussian"
    assert shown["releases_per_update"] is None
    assert shown["epsilon_round"] is None
    assert shown["epsilon_total"] is None
    assert "round's instructions" in shown["epsilon_unavailable"]


def test_without_the_accountant_the_preview_says_epsilon_cannot_be_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The package absent: importing it fails (None in sys.modules makes `import` raise).
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    shown = preview_privacy(DP, SIGNALS, 10)
    assert shown["mechanism"] == "gaussian"
    assert shown["releases_per_update"] == 2
    assert shown["epsilon_round"] is None
    assert shown["epsilon_total"] is None
    assert "cannot be computed" in shown["epsilon_unavailable"]
    assert "fedaudit[dp]" in shown["epsilon_unavailable"]
