"""What the coordinator hands the audit from a stored update (service.coordinator.audits)."""

from __future__ import annotations

import uuid

import numpy as np

from service.coordinator.audits import client_round_data, counts_are_exact
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
    }
    exact = client_round_data(_update(signals), reader=None)
    assert exact.per_class_errors is not None
    assert np.array_equal(np.asarray(exact.per_class_errors), [1.0, np.nan, 2.0], equal_nan=True)
    assert exact.class_counts.tolist() == [10, 0, 10]  # a suppressed class is not held
    rounded = client_round_data(_update(signals), reader=None, exact_counts=False)
    assert rounded.per_class_errors is None
    assert rounded.per_class_loss is not None
