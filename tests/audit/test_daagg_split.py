"""DaAgg's split of the round's first pass (service.audit.round_pass.NoisySplit).

Before the detectors run, the status rule and the pins already say which clients DaAgg may treat
as noisy this round (``possible_noisy``). The first pass then computes the distances between each
of them and every client, and the mean of the others; DaAgg reads the updates again only for the
clients outside that mean. Checked here: the pairs against hand-worked distances, the possible
noisy set on literal histories, and DaAgg through a split against the float64 reference of
``test_blocks`` with the reads each client gets.
"""

from __future__ import annotations

import gc
import math
import weakref
from dataclasses import replace

import numpy as np
import pytest

from service.audit import (
    AggregationSettings,
    AuditConfig,
    DictStateReader,
    InvalidInputError,
    StatusHistory,
    aggregate_daagg,
    fedncl_divergences,
    round_pass,
    run_audit,
)
from service.audit.aggregators.daagg import daagg_split
from service.audit.noisy_set import possible_noisy
from service.audit.round_pass import NoisySplit
from tests.audit.test_blocks import (
    GLOBAL,
    A,
    B,
    C,
    CountingReader,
    assert_states_close,
    random_states,
    readers,
    ref_weighted,
)
from tests.audit.test_pipeline_overrides import clients

NEW = StatusHistory()


def test_split_pairs_come_from_the_first_pass_and_the_rows() -> None:
    # A = (1, 2, 2), B = (1, 2, 5), C = (4, 6, 2), the global model 0:
    # |A - B|^2 = 0 + 0 + 9 = 9, |A - C|^2 = 9 + 16 + 0 = 25
    g = DictStateReader(GLOBAL)
    one = round_pass.RoundPass(g, readers(A, B, C), split=NoisySplit((0,), None))
    pairs, part = one.pair_squared([0], [1, 2])
    assert pairs.tolist() == [[[9.0, 25.0]]]
    assert part is None  # no mean was asked for
    assert one.passes == 1
    # rows A and C, C found clean: |A - B|^2 from the first pass, |A - C|^2 from the rows' pass
    two = round_pass.RoundPass(g, readers(A, B, C), split=NoisySplit((0, 2), None))
    pairs, _ = two.pair_squared([0], [1, 2])
    assert pairs.tolist() == [[[9.0, 25.0]]]
    assert two.passes == 2
    # a noisy client outside the rows: a pass of DaAgg's own over every client
    three = round_pass.RoundPass(g, readers(A, B, C), split=NoisySplit((0,), None))
    pairs, _ = three.pair_squared([2], [0, 1])
    assert pairs.tolist() == [[[25.0, 34.0]]]  # |C - B|^2 = 9 + 16 + 9 = 34
    assert three.passes == 1  # its own pass; the first pass was never asked for


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        (NEW, False),  # one flag makes a new client suspect, not noisy
        (StatusHistory(status="suspect", flags=[True]), True),  # a second flag: noisy
        (StatusHistory(flags=[True, False, False]), False),  # the window then holds one flag
        # not flagged now: T, F, F holds one flag, not w clean rounds: noisy stays noisy
        (StatusHistory(status="noisy", flags=[True, True, False]), True),
        # not flagged now: F, F, F: trusted; flagged now: F, F, T, noisy stays noisy
        (StatusHistory(status="noisy", flags=[True, False, False]), True),
        (StatusHistory(status="noisy", flags=[False, False, False]), True),
        (StatusHistory(status="trusted", flags=[False, False, True]), True),  # F, T, T
    ],
)
def test_possible_noisy_follows_the_status_rule(history: StatusHistory, expected: bool) -> None:
    result = possible_noisy(AuditConfig(), [history, NEW], None, 2)
    assert result is not None
    assert result.tolist() == [expected, False]


def test_possible_noisy_with_pins_and_round_flags() -> None:
    suspect = StatusHistory(status="suspect", flags=[True])
    pinned = possible_noisy(AuditConfig(), [suspect, NEW, suspect], [False, True, None], 3)
    assert pinned is not None
    assert pinned.tolist() == [False, True, True]
    # the round's own flags decide: any client may be noisy, nothing is known before
    by_round = AuditConfig(aggregation_settings=AggregationSettings(flags="round"))
    assert possible_noisy(by_round, [NEW, NEW], None, 2) is None
    # a history the audit will refuse: no plan (the audit raises its own error later)
    assert possible_noisy(AuditConfig(), [NEW], None, 2) is None
    assert possible_noisy(AuditConfig(), [NEW, StatusHistory(status="calm")], None, 2) is None


def test_the_split_covers_at_most_half_of_the_clients() -> None:
    g = DictStateReader(GLOBAL)
    split = daagg_split(g, [1.0, 3.0, 4.0, 2.0], [True, False, False, True])
    assert split is not None
    assert split.rows == (0, 3)
    assert split.base_weights is not None
    assert split.base_weights.tolist() == [0.0, 3 / 7, 4 / 7, 0.0]
    assert daagg_split(g, [1.0, 1.0, 1.0], [True, True, False]) is None
    assert daagg_split(g, [1.0, 1.0], None) is None
    half = DictStateReader({"w": np.zeros(2, dtype=np.float16)})
    no_mean = daagg_split(half, [1.0, 1.0], [False, False])
    assert no_mean is not None
    assert no_mean.base_weights is None  # float16 sums overflow: no mean


def reference_daagg(updates: list, noisy: np.ndarray, n: np.ndarray) -> np.ndarray:
    """DaAgg's weights in float64 (the paper variant), before the cap."""
    floats = [name for name, v in updates[0].items() if v.dtype.kind == "f"]
    distances = np.zeros(len(updates))
    for i in np.flatnonzero(noisy):
        distances[i] = min(
            math.sqrt(
                sum(
                    float(np.sum((updates[i][f].astype(np.float64) - updates[j][f]) ** 2))
                    for f in floats
                )
            )
            for j in np.flatnonzero(~noisy)
        )
    raw = n * np.exp(-distances / distances.max()) if distances.max() > 0 else n.copy()
    return raw / raw.sum()


def float32_states(k: int, seed: int) -> tuple[dict, list[dict]]:
    """test_blocks' random states without their float16 tensor (a float16 model makes no mean:
    its own test above)."""
    base, updates = random_states(k, seed)
    base.pop("half")
    return base, [{name: v for name, v in u.items() if name != "half"} for u in updates]


ROWS = (0, 1, 5)


@pytest.mark.parametrize(
    ("noisy", "rows", "extra_reads"),
    [
        ([0, 1, 5], ROWS, {0: 1, 1: 1, 5: 1}),  # the rows are the noisy set: they are read again
        # client 1 found clean: its distances to 0 and 5 from a pass over the rows, then the
        # rows again for the weighted sum (client 1 is outside the mean)
        ([0, 5], ROWS, {0: 2, 1: 2, 5: 2}),
        ([], ROWS, {0: 1, 1: 1, 5: 1}),  # nobody noisy: FedAvg's weights, the rows read again
        ([], (), {}),  # nothing possible, nobody noisy: one pass in all
        # client 3 was not thought possible: DaAgg's own pass over every client, then the noisy
        ([0, 3], ROWS, dict.fromkeys(range(8), 1) | {0: 2, 3: 2}),
    ],
)
def test_daagg_through_a_split_equals_float64(
    noisy: list[int], rows: tuple[int, ...], extra_reads: dict[int, int]
) -> None:
    base, updates = float32_states(8, 21)
    n = np.arange(1.0, 9.0)
    flags = np.zeros(8, dtype=bool)
    flags[noisy] = True
    g = DictStateReader(base)
    counted = [CountingReader(u) for u in updates]
    possible = np.zeros(8, dtype=bool)
    possible[list(rows)] = True
    split = daagg_split(g, n, possible)
    assert split is not None
    shared = round_pass.RoundPass(g, counted, split=split)
    fedncl_divergences(g, counted, shared=shared)  # a detector asks first: the first pass
    result = aggregate_daagg(g, counted, n, flags, shared=shared, max_client_weight_factor=None)
    expected = reference_daagg(updates, flags, n)
    np.testing.assert_allclose(result.weights, expected, rtol=1e-6)
    chosen = int(np.argmax(result.weights))
    assert_states_close(result.state, ref_weighted(updates, result.weights, chosen), 1e-6)
    assert [c.reads - 1 for c in counted] == [extra_reads.get(i, 0) for i in range(8)]


def test_a_cap_that_binds_reads_every_client_again() -> None:
    base, updates = float32_states(6, 3)
    n = np.array([1.0, 1, 1, 1, 1, 60])  # client 5 holds most samples: the cap binds
    flags = np.array([True, False, False, False, False, False])
    g = DictStateReader(base)
    counted = [CountingReader(u) for u in updates]
    split = daagg_split(g, n, flags)
    assert split is not None
    shared = round_pass.RoundPass(g, counted, split=split)
    result = aggregate_daagg(g, counted, n, flags, shared=shared)
    assert result.weight_cap is not None
    assert result.weight_cap["capped"]
    assert [c.reads for c in counted] == [2] * 6
    # the weights as without a shared pass (that path is checked against float64 in test_blocks)
    plain = aggregate_daagg(g, readers(*updates), n, flags)
    np.testing.assert_allclose(result.weights, plain.weights, rtol=1e-6)
    assert max(result.weights) == pytest.approx(4 / 6)  # the cap, min(1, 4 / K)
    chosen = int(np.argmax(result.weights))
    assert_states_close(result.state, ref_weighted(updates, result.weights, chosen), 1e-6)


def counted_clients() -> tuple[list, list[CountingReader]]:
    """test_pipeline_overrides' four clients (client 0 flagged by Fed-NCL) on counting readers."""
    out, counted = [], []
    for client in clients():
        reader = CountingReader({"conv": client.state.get("w")})
        counted.append(reader)
        out.append(replace(client, state=reader))
    return out, counted


def test_run_audit_plans_the_split_from_the_status_history() -> None:
    config = AuditConfig(detectors=("fedncl",), primary_detector="fedncl", aggregation="daagg")
    g = DictStateReader({"conv": np.zeros(4, dtype=np.float32)})
    history = [StatusHistory(status="suspect", flags=[True]), NEW, NEW, NEW]
    round_clients, counted = counted_clients()
    outcome = run_audit(g, round_clients, config, round_index=4, status_history=history)
    assert outcome.aggregation_flags == [True, False, False, False]
    # d_0 = |3 - 1| over 4 coordinates = 4 -> D_0 = 1: w_0 = e^-1 / (e^-1 + 3)
    assert outcome.aggregation.weights[0] == pytest.approx(math.exp(-1) / (math.exp(-1) + 3))
    # the state: (3 e^-1 + 1 + 1 + 1) / (e^-1 + 3) in every coordinate
    mean = (3 * math.exp(-1) + 3) / (math.exp(-1) + 3)
    np.testing.assert_allclose(outcome.aggregation.state["conv"], [mean] * 4, rtol=1e-6)
    # client 0 alone may be noisy: the others are read once, client 0 once more
    assert [c.reads for c in counted] == [2, 1, 1, 1]


def test_the_largest_weight_inside_the_rows_gives_the_state_its_integer_tensors() -> None:
    # client 1 holds the most samples and may be noisy (a row) but is not: the completion pass
    # reads it, and its non-float tensors (the counter "steps") are the state's
    base, updates = float32_states(6, 5)
    n = np.array([1.0, 9.0, 2.0, 3.0, 2.0, 1.0])
    flags = np.array([True, False, False, False, False, False])
    g = DictStateReader(base)
    split = daagg_split(g, n, np.array([True, True, False, False, False, False]))
    assert split is not None
    states = readers(*updates)
    shared = round_pass.RoundPass(g, states, split=split)
    result = aggregate_daagg(g, states, n, flags, shared=shared, max_client_weight_factor=None)
    np.testing.assert_allclose(result.weights, reference_daagg(updates, flags, n), rtol=1e-6)
    assert int(np.argmax(result.weights)) == 1
    assert_states_close(result.state, ref_weighted(updates, result.weights, 1), 1e-6)
    assert result.state["steps"] == updates[1]["steps"]


def test_the_split_mean_is_held_by_its_taker_only() -> None:
    # handed out, the mean (a full state) is no longer referenced by the round's pass: a
    # fallback that makes another state does not hold two
    base, updates = float32_states(5, 7)
    g = DictStateReader(base)
    split = daagg_split(g, np.ones(5), np.array([True, False, False, False, False]))
    assert split is not None
    shared = round_pass.RoundPass(g, readers(*updates), split=split)
    part = shared.clean_part()
    assert part is not None
    assert shared.clean_part() is None  # handed out once
    alive = weakref.ref(part.state["conv"])
    del part
    gc.collect()
    assert alive() is None
    # a weighting the mean cannot serve drops it before its own pass
    other = round_pass.RoundPass(g, readers(*updates), split=split)
    other.squared()
    assert other.clean_part() is not None  # still there before any other use
    again = round_pass.RoundPass(g, readers(*updates), split=split)
    again.squared()
    again.weighted(np.full(5, 0.2), 0)
    assert again.clean_part() is None  # released for the weighted pass


class _NaNAfterFirstRead(DictStateReader):
    """Finite on the first read of each tensor, NaN afterwards (an update changed on disk)."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        super().__init__(tensors)
        self.seen: set[str] = set()

    def get(self, name: str) -> np.ndarray:
        value = super().get(name)
        if name in self.seen and value.dtype.kind == "f":
            value = value.copy()
            value.reshape(-1)[0] = np.nan
        self.seen.add(name)
        return value


def test_an_error_in_the_rows_pass_is_named_by_the_pass_over_every_client() -> None:
    # client 2 may be noisy but is not: the rows' pass reads it again and finds a NaN; DaAgg's
    # own pass over every client then names it by its place among all clients
    rng = np.random.default_rng(1)
    g = {"w": rng.normal(size=8).astype(np.float32)}
    ups = [{"w": (g["w"] + rng.normal(scale=0.05, size=8)).astype(np.float32)} for _ in range(6)]
    states: list[DictStateReader] = [DictStateReader(u) for u in ups]
    states[2] = _NaNAfterFirstRead(ups[2])
    gs = DictStateReader(g)
    split = daagg_split(gs, np.ones(6), np.array([True, False, True, False, False, False]))
    assert split is not None
    shared = round_pass.RoundPass(gs, states, split=split)
    shared.squared()  # the first pass: client 2 read once, finite
    with pytest.raises(InvalidInputError, match=r"updates\[2\]: tensor 'w' contains NaN"):
        aggregate_daagg(
            gs, states, np.ones(6), [True, False, False, False, False, False], shared=shared
        )
