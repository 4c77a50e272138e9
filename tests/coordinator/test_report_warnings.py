"""The report's warnings (``service.coordinator.report_warnings``) on literal stored audit
results: flags that may be inverted, the FedNoRo recipe with few classes per site, classes where
the sites disagree, sites far below the consensus."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from service.coordinator.report_warnings import label_skew_warnings, report_warnings


def audit(flags: list[bool | None], sizes: list[int], *, in_warmup: bool = False) -> Any:
    return SimpleNamespace(
        round_index=5,
        result={
            "in_warmup": in_warmup,
            "primary_flags": flags,
            "clients": [{"num_samples": n} for n in sizes],
        },
    )


def test_most_clients_holding_most_samples_flagged_warns() -> None:
    # 3 of 4 clients, 20 + 20 + 20 = 60 of 100 samples
    (warning,) = report_warnings(audit([True, True, True, False], [20, 20, 20, 40]))
    assert warning.startswith("3 of the 4 clients, holding 60% of round 5's samples, are flagged")


@pytest.mark.parametrize(
    ("flags", "sizes"),
    [
        ([True, True, False, False], [45, 45, 5, 5]),  # half of the clients (90 % of the data)
        ([True, True, True, False], [10, 10, 10, 70]),  # most clients, 30 % of the data
        ([True, True, True, False], [10, 20, 20, 50]),  # exactly half of the data
        ([True, False, False, False], [70, 10, 10, 10]),  # one dominant client flagged
        ([None, None, None, None], [10, 10, 10, 10]),  # undetermined
    ],
)
def test_no_warning_otherwise(flags: list[bool | None], sizes: list[int]) -> None:
    assert report_warnings(audit(flags, sizes)) == []


def test_warm_up_and_malformed_results_give_no_warning() -> None:
    assert report_warnings(audit([True, True, True, False], [20, 20, 20, 40], in_warmup=True)) == []
    assert report_warnings(audit([True, True, True], [20, 20, 20, 40])) == []
    assert report_warnings(audit([True, True, True, False], [0, 0, 0, 0])) == []


# -- label_skew_warnings: the FedNoRo recipe with sites holding few classes --------------------


def sites(*held: int, num_classes: int = 10) -> list[Any]:
    """One client per entry, holding that many classes (10 samples each)."""
    return [SimpleNamespace(class_counts=[10] * h + [0] * (num_classes - h)) for h in held]


def federation(
    recipe: str, num_classes: int = 10, absent: str | None = "zero", la_tau: float | None = 1.0
) -> Any:
    hyperparameters: dict[str, Any] = {} if absent is None else {"absent_class_prior": absent}
    if la_tau is not None:
        hyperparameters["la_tau"] = la_tau
    return SimpleNamespace(
        num_classes=num_classes, config={"recipe": recipe, "hyperparameters": hyperparameters}
    )


def test_no_logit_adjustment_no_warning() -> None:
    # la_tau 0 (the default) or unset: the absent-class prior does not enter the training.
    for tau in (0.0, None):
        fed = federation("fednoro", la_tau=tau)
        assert label_skew_warnings(fed, sites(2, 2, 2, 10, 2)) == []


def test_two_classes_per_site_under_the_papers_fednoro_warns() -> None:
    (warning,) = label_skew_warnings(federation("fednoro"), sites(2, 2, 2, 10, 2))
    assert warning.startswith("the median site holds 2 of the 10 classes")
    assert 'absent_class_prior "rarest"' in warning


@pytest.mark.parametrize(
    ("fed", "clients", "warns"),
    [
        (federation("fednoro"), sites(5, 5, 6), True),  # the median holds half of the classes
        (federation("fednoro"), sites(6, 6, 2), False),  # the median holds more than half
        # the default prior for absent classes (and an explicit "rarest") trains them
        (federation("fednoro", absent=None), sites(2, 2, 2), False),
        (federation("fednoro", absent="rarest"), sites(2, 2, 2), False),
        (federation("fedavg"), sites(2, 2, 2), False),  # no logit adjustment
        (federation("fedrn"), sites(2, 2, 2), False),
        # binary: every site holds at least half of the classes
        (federation("fednoro", 2), sites(1, 1, 1, num_classes=2), False),
        (federation("fednoro"), [SimpleNamespace(class_counts=None)], False),  # nobody joined
        (federation("fednoro"), [], False),
    ],
)
def test_label_skew_warning_cases(fed: Any, clients: list[Any], warns: bool) -> None:
    assert bool(label_skew_warnings(fed, clients)) is warns


def _stored(primary: str, summary: dict[str, Any], *, in_warmup: bool = False) -> Any:
    from service.coordinator.stored_audit import read_audit

    return read_audit(
        {
            "primary": primary,
            "in_warmup": in_warmup,
            "detections": {primary: {"status": "ok", "summary": summary}},
        }
    )


def test_classes_where_the_sites_disagree_are_named_when_nobody_is_flagged() -> None:
    from service.coordinator.report_warnings import disagreement_warnings

    federation: Any = SimpleNamespace(class_names=["normal", "benign", "malignant"])
    (warning,) = disagreement_warnings(
        7, _stored("evidence", {"disagreeing_classes": [1, 2]}), federation
    )
    assert warning.startswith(
        "round 7 flags nobody, but in class(es) benign, malignant the sites disagree far beyond"
    )
    unnamed: Any = SimpleNamespace(class_names=None)
    assert (
        "in class(es) 2 the sites"
        in disagreement_warnings(7, _stored("evidence", {"disagreeing_classes": [2]}), unnamed)[0]
    )
    for quiet in (
        _stored("evidence", {"disagreeing_classes": []}),
        _stored("evidence", {}),  # an audit stored before the field existed
        _stored("evidence", {"disagreeing_classes": [1]}, in_warmup=True),
        _stored("fednoro", {"disagreeing_classes": [1]}),  # only the evidence detector's
    ):
        assert disagreement_warnings(7, quiet, federation) == []


def test_sites_far_below_the_consensus_beside_flagged_ones_are_warned_of() -> None:
    from service.coordinator.report_warnings import lower_tail_warnings

    (warning,) = lower_tail_warnings(9, _stored("evidence", {"flagged": 1, "significant_low": 2}))
    assert warning.startswith(
        "round 9 flags 1 site(s) above the consensus while 2 other(s) lie significantly below it"
    )
    for quiet in (
        _stored("evidence", {"flagged": 1, "significant_low": 1}),  # one site's word
        _stored("evidence", {"flagged": 0, "significant_low": 3}),  # nobody flagged
        _stored("evidence", {}),  # an audit stored before the fields existed
        _stored("evidence", {"flagged": 1, "significant_low": 2}, in_warmup=True),
        _stored("fednoro", {"flagged": 1, "significant_low": 2}),  # only the evidence detector's
    ):
        assert lower_tail_warnings(9, quiet) == []
