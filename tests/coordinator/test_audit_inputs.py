"""What the coordinator hands the audit from a stored update (service.coordinator.audits)."""

from __future__ import annotations

import uuid

import numpy as np

from service.coordinator.audits import client_round_data, counts_are_exact, mechanism_scale
from service.store.tables import Federation, ModelUpdate


def _update(signals: dict[str, object]) -> ModelUpdate:
    return ModelUpdate(client_id=uuid.uuid4(), num_samples=20, signals=signals)


def _federation(privacy: dict[str, object] | None) -> Federation:
    config: dict[str, object] = {"signals": []}
    if privacy is not None:
        config["privacy"] = privacy
    return Federation(name="f", num_classes=3, config=config)


def test_counts_are_exact_unless_the_policy_rounds_them() -> None:
    assert counts_are_exact(_federation(None))  # created before the privacy policy
    assert counts_are_exact(_federation({"min_class_count": 5, "count_bucket": 1}))
    assert not counts_are_exact(_federation({"min_class_count": 0, "count_bucket": 10}))


def test_rounded_counts_leave_the_error_counts_out() -> None:
    # Counts rounded up to 10: 20 samples reported for what may be 11; an expected error count
    # from them would be too high here and the pooled rate too low elsewhere.
    signals = {
        "class_counts": [10, None, 10],
        "per_class_loss": [0.2, None, 0.4],
        "per_class_errors": [1, None, 2],
        "per_class_confident_errors": [0, None, 2],
    }
    exact = client_round_data(_update(signals), reader=None)
    assert exact.per_class_errors is not None
    assert np.array_equal(np.asarray(exact.per_class_errors), [1.0, np.nan, 2.0], equal_nan=True)
    assert exact.class_counts.tolist() == [10, 0, 10]  # a suppressed class is not held
    rounded = client_round_data(_update(signals), reader=None, exact_counts=False)
    assert rounded.per_class_errors is None
    assert exact.per_class_confident_errors is not None
    assert np.array_equal(
        np.asarray(exact.per_class_confident_errors), [0.0, np.nan, 2.0], equal_nan=True
    )
    assert rounded.per_class_confident_errors is None
    assert rounded.per_class_loss is not None


def test_the_mechanisms_noise_is_given_to_the_audit_as_the_spread() -> None:
    # sigma B = 2: a class mean of 4 samples carries noise of sd 2 / 4 = 0.5, the mean of a
    # per-sample spread of 2 / sqrt(4) = 1; of 16 samples 2 / 16 = 0.125, a spread of 0.5.
    signals = {"class_counts": [4, 0, 16], "per_class_loss": [0.9, None, 0.3]}
    data = client_round_data(_update(signals), reader=None, mechanism=2.0)
    assert data.per_class_loss_sd is not None
    assert np.array_equal(np.asarray(data.per_class_loss_sd), [1.0, np.nan, 0.5], equal_nan=True)
    assert client_round_data(_update(signals), reader=None).per_class_loss_sd is None


def test_the_mechanism_scale_is_sigma_times_the_clip() -> None:
    dp: dict[str, object] = {"dp_noise_multiplier": 1.5, "dp_clip_loss": 4.0, "dp_delta": 1e-5}
    assert mechanism_scale(_federation(dp)) == 6.0
    assert mechanism_scale(_federation({"min_class_count": 5})) is None
    assert mechanism_scale(_federation(None)) is None
