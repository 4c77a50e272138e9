"""The update-geometry evidence (service.audit.geometry_evidence): small literal inputs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from service.audit import AuditConfig, ClientRoundData, StatusHistory, run_audit
from service.audit._validation import InvalidInputError, InvalidParameterError
from service.audit.blocks import stream_pass
from service.audit.config_groups import GeometrySettings
from service.audit.detection import ClientVerdict, DetectionResult, EvidenceResult
from service.audit.geometry_evidence import (
    add_geometry,
    carry_flags,
    geometry_evidence,
    leave_one_out_cosines,
    peer_groups,
    site_mix_p_values,
)
from service.audit.geometry_null import critical_z, simulate_critical_z
from service.audit.round_pass import RoundPass
from service.audit.state import DictStateReader
from service.audit.verdict_types import ABSENT, EvidenceSummary, EvidenceVerdictEvidence
from tests.audit._readers import given

# Three updates in the plane: d0 = (1, 0), d1 = (0, 1), d2 = (1, 1); weights 1, 1, 2.
# S = (1,0) + (0,1) + 2 (1,1) = (3, 3).
# d0: others' sum S - d0 = (2, 3): cos = 2 / sqrt(13).
# d1: S - d1 = (3, 2): cos = 2 / sqrt(13).
# d2: S - 2 d2 = (1, 1): cos = 1.
D = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
W = np.array([1.0, 1.0, 2.0])


def test_leave_one_out_cosines_by_hand() -> None:
    s = (W[:, None] * D).sum(axis=0)
    cosines = leave_one_out_cosines((D**2).sum(axis=1), D @ s, float(s @ s), W)
    assert cosines == pytest.approx([2 / math.sqrt(13), 2 / math.sqrt(13), 1.0])


def test_a_zero_update_has_no_direction() -> None:
    d = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    s = d.sum(axis=0)
    cosines = leave_one_out_cosines((d**2).sum(axis=1), d @ s, float(s @ s), np.ones(3))
    assert math.isnan(cosines[0])
    assert cosines[1:] == pytest.approx([1.0, 1.0])


def test_cosines_refuse_mismatched_lengths() -> None:
    with pytest.raises(InvalidInputError, match="entries"):
        leave_one_out_cosines([1.0, 1.0], [1.0], 1.0, [1.0, 1.0])
    with pytest.raises(InvalidInputError, match="total_squared"):
        leave_one_out_cosines([1.0], [1.0], -1.0, [1.0])


def test_the_pass_computes_the_consensus_dots_of_the_updates() -> None:
    g = {"w": np.array([1.0, -1.0], dtype=np.float64)}
    updates = [DictStateReader({"w": g["w"] + row}) for row in D]
    result = stream_pass(DictStateReader(g), updates, consensus=W)
    # S = (3, 3): d0.S = 3, d1.S = 3, d2.S = 6; ||S||^2 = 18.
    assert result.consensus_dots == pytest.approx([3.0, 3.0, 6.0])
    assert result.consensus_norm2 == pytest.approx(18.0)
    # The same through the round's shared pass, together with the squared norms.
    totals = RoundPass(DictStateReader(g), updates, consensus=W).consensus()
    assert totals is not None
    squared, dots, total = totals
    # without consensus weights the pass has none to give
    assert RoundPass(DictStateReader(g), updates).consensus() is None
    assert squared == pytest.approx([1.0, 1.0, 2.0])
    assert dots == pytest.approx([3.0, 3.0, 6.0])
    assert total == pytest.approx(18.0)


def test_the_pass_keeps_the_clients_order_when_pairs_reorder_them() -> None:
    g = {"w": np.zeros(2)}
    updates = [DictStateReader({"w": row.copy()}) for row in D]
    result = stream_pass(DictStateReader(g), updates, consensus=W, pairs=([2], [0]))
    assert result.consensus_dots == pytest.approx([3.0, 3.0, 6.0])


def test_site_mix_p_values_by_hand() -> None:
    # Identical mixes: chi-square 0, p = 1.
    assert site_mix_p_values([[10, 10], [20, 20]]) == pytest.approx([1.0, 1.0])
    # [[10, 0], [0, 10]]: pooled mix (1/2, 1/2), each site E = 5, 5: statistic 25/5 + 25/5 = 10
    # on 1 df, p = 0.0015654.
    assert site_mix_p_values([[10, 0], [0, 10]]) == pytest.approx([0.0015654] * 2, rel=1e-4)
    # A class nobody holds is left out (same answer); one class held: nothing can differ; a
    # site without samples has no p-value.
    assert site_mix_p_values([[10, 0, 0], [0, 10, 0]]) == pytest.approx([0.0015654] * 2, rel=1e-4)
    assert site_mix_p_values([[5, 0], [7, 0]]).tolist() == [1.0, 1.0]
    assert np.isnan(site_mix_p_values([[5, 5], [0, 0], [6, 6]])[1])


def _cosines(low: float) -> np.ndarray:
    # 10 sites: 9 spread evenly around 0.5, one at ``low`` (below 0.46).
    return np.array([0.46, 0.47, 0.48, 0.49, 0.50, 0.50, 0.51, 0.52, 0.53, low])


BALANCED = np.full((10, 3), 30)
SIZES = np.full(10, 90)


def test_a_site_far_below_the_others_is_flagged() -> None:
    cos = _cosines(-0.10)
    # median of the 10 = (0.49 + 0.50) / 2 = 0.495; |deviations| sorted: .005 .005 .005 .015
    # .015 .025 .025 .035 .035 .595: MAD = 0.02, scale 0.029652; z of the last site =
    # (0.495 + 0.10) / 0.029652 = 20.07, p = 1 - Phi(20.07), far inside BH's 0.01 / 10, and
    # above the floor of a 10-site group (16.88, service.audit.geometry_null).
    result = geometry_evidence(cos, BALANCED, SIZES, q=0.01)
    assert result.applies
    assert result.judged.all()
    assert result.z[-1] == pytest.approx(0.595 / (1.4826 * 0.02))
    assert result.z[0] == pytest.approx((0.495 - 0.46) / (1.4826 * 0.02))
    assert result.flags.tolist() == [False] * 9 + [True]
    # At 0.35 (same median and MAD): z = 0.145 / 0.029652 = 4.89, p = 5e-7, significant under
    # BH but below the floor of 10: not flagged.
    below = geometry_evidence(_cosines(0.35), BALANCED, SIZES, q=0.01)
    assert below.z[-1] == pytest.approx(0.145 / (1.4826 * 0.02))
    assert not below.flags.any()
    # At 0.10: z = 0.395 / 0.029652 = 13.32, above min_z (10) but not beyond what chance gives
    # the largest of 10 peers one round in 10,000 (16.88): not flagged; at -0.01 (same median
    # and MAD: z = 0.505 / 0.029652 = 17.03) it is.
    between = geometry_evidence(_cosines(0.10), BALANCED, SIZES, q=0.01)
    assert between.z[-1] == pytest.approx(0.395 / (1.4826 * 0.02))
    assert not between.flags.any()
    beyond = geometry_evidence(_cosines(-0.01), BALANCED, SIZES, q=0.01)
    assert beyond.z[-1] == pytest.approx(0.505 / (1.4826 * 0.02))
    assert beyond.flags.tolist() == [False] * 9 + [True]
    # An anchor is never flagged.
    never = np.zeros(10, dtype=bool)
    never[-1] = True
    assert not geometry_evidence(cos, BALANCED, SIZES, q=0.01, never=never).flags.any()


def test_the_test_is_not_made_where_it_cannot_hold() -> None:
    cos = _cosines(-0.10)
    few = geometry_evidence(cos[:6], BALANCED[:6], SIZES[:6], q=0.01)
    assert not few.applies
    assert "needs 8" in str(few.note)
    assert not few.flags.any()
    skewed = BALANCED.copy()
    skewed[:5] = [60, 20, 10]
    differ = geometry_evidence(cos, skewed, SIZES, q=0.01)
    assert not differ.applies
    assert "class mixes differ" in str(differ.note)
    same = geometry_evidence(np.full(10, 0.5), BALANCED, SIZES, q=0.01)
    assert not same.applies
    assert "same way" in str(same.note)


def test_sites_are_judged_among_peers_of_their_mix_and_size() -> None:
    # 12 sites: 10 of 90 samples and the federation's mix; site 10 holds 27 samples (another
    # power of two: 2^4 <= 27 < 2^5 against 2^6 <= 90 < 2^7); site 11 a skewed mix
    # ([80, 5, 5]: chi-square far beyond sampling against the pooled mix).
    counts = np.vstack([BALANCED, [[9, 9, 9]], [[80, 5, 5]]])
    sizes = counts.sum(axis=1)
    assert peer_groups(counts, sizes).tolist() == [6] * 10 + [-1, -1]
    # Both outsiders point far away (cosine 0.0): neither is judged, so neither is flagged;
    # the ten peers are judged as before (their own median and MAD).
    cos = np.concatenate([_cosines(-0.10), [0.0, 0.0]])
    result = geometry_evidence(cos, counts, sizes, q=0.01)
    assert result.judged.tolist() == [True] * 10 + [False, False]
    assert result.flags.tolist() == [False] * 9 + [True, False, False]
    assert result.z[9] == pytest.approx(0.595 / (1.4826 * 0.02))
    assert np.isnan(result.z[10:]).all()


def test_permuting_the_sites_permutes_the_evidence() -> None:
    cos = _cosines(-0.10)
    order = np.random.default_rng(0).permutation(10)
    base = geometry_evidence(cos, BALANCED, SIZES, q=0.01)
    permuted = geometry_evidence(cos[order], BALANCED[order], SIZES[order], q=0.01)
    assert permuted.z == pytest.approx(base.z[order])
    assert permuted.flags.tolist() == base.flags[order].tolist()


def _result(flags: list[bool], status: str = "ok", mode: str = "consensus") -> EvidenceResult:
    verdicts: list[ClientVerdict[EvidenceVerdictEvidence] | None] = [
        ClientVerdict(
            score=1.0, flag=f if status == "ok" else None, evidence=EvidenceVerdictEvidence()
        )
        for f in flags
    ]
    return DetectionResult(
        method="evidence",
        status=status,  # type: ignore[arg-type]
        reason=None if status == "ok" else "why",
        verdicts=verdicts,
        summary=EvidenceSummary(mode=mode, flagged=sum(flags)),
    )


def test_add_geometry_adds_its_flags_and_shows_its_facts() -> None:
    geometry = geometry_evidence(_cosines(-0.10), BALANCED, SIZES, q=0.01)
    first_flagged = [True] + [False] * 9
    out = add_geometry(_result(first_flagged), geometry, np.full(10, 90.0), 0.5)
    assert out.flags == [True] + [False] * 8 + [True]
    last = out.verdicts[-1]
    assert last is not None
    assert last.evidence.flagged_by_geometry is True
    assert last.score == pytest.approx(0.595 / (1.4826 * 0.02))
    first = out.verdicts[0]
    assert first is not None
    assert first.evidence.flagged_by_geometry is False
    assert out.summary.geometry_flagged == 1
    assert out.summary.flagged == 2


def test_add_geometry_adds_nothing_to_an_abstaining_or_anchored_verdict() -> None:
    geometry = geometry_evidence(_cosines(-0.10), BALANCED, SIZES, q=0.01)
    inconclusive = add_geometry(_result([False] * 10, "inconclusive"), geometry, np.ones(10), 0.5)
    assert inconclusive.flags == [None] * 10
    assert "loss evidence is inconclusive" in given(inconclusive.summary.geometry_note)
    anchored = add_geometry(_result([False] * 10, mode="anchored"), geometry, np.ones(10), 0.5)
    assert anchored.flags == [False] * 10
    assert "in anchored mode" in given(anchored.summary.geometry_note)


def test_add_geometry_is_set_aside_when_it_would_flag_a_majority() -> None:
    geometry = geometry_evidence(_cosines(-0.10), BALANCED, SIZES, q=0.01)
    # 4 sites flagged already, holding 4 x 100 of 4 x 100 + 6 x 1 samples: adding a fifth
    # reaches half of the sites.
    sizes = np.array([100.0] * 4 + [1.0] * 6)
    out = add_geometry(_result([True] * 4 + [False] * 6), geometry, sizes, 0.5)
    assert out.flags == [True] * 4 + [False] * 6
    assert "set aside" in given(out.summary.geometry_note)


def _liar_round(
    counts: list[list[int]] | None = None, liar: bool = True
) -> tuple[DictStateReader, list[ClientRoundData]]:
    """12 sites with the same losses; 11 move along one direction, site 0 against it (or with
    the others when not ``liar``)."""
    rng = np.random.default_rng(3)
    direction = rng.normal(size=40)
    global_state = DictStateReader({"w": np.zeros(40)})
    clients = []
    for k in range(12):
        sign = -1.0 if k == 0 and liar else 1.0
        mix = counts[k] if counts else [25, 25, 25, 25]
        # a site of fewer samples takes fewer, noisier steps: its direction scatters more
        scale = 0.3 * math.sqrt(100 / sum(mix))
        update = sign * direction + rng.normal(scale=scale, size=40)
        clients.append(
            ClientRoundData(
                client_id=f"c{k}",
                num_samples=sum(mix),
                class_counts=mix,
                per_class_loss=rng.normal(0.5, 0.02, 4),
                per_class_loss_sd=[0.3] * 4,
                state=DictStateReader({"w": update}),
            )
        )
    return global_state, clients


def test_the_audit_flags_a_site_whose_update_goes_against_the_others() -> None:
    global_state, clients = _liar_round()
    on = run_audit(global_state, clients, AuditConfig(detectors=("evidence",)), round_index=3)
    evidence = on.detections["evidence"]
    assert evidence.status == "ok"
    assert evidence.flags == [True] + [False] * 11
    first = evidence.verdicts[0]
    assert first is not None
    assert first.evidence.flagged_by_geometry is True
    assert first.evidence.geometry_cosine < 0
    assert evidence.summary.geometry_flagged == 1
    # Switched off, the losses alone see nobody.
    off = AuditConfig(detectors=("evidence",), geometry=GeometrySettings(check=False))
    assert (
        run_audit(global_state, clients, off, round_index=3).detections["evidence"].flags
        == [False] * 12
    )


def test_the_audit_does_not_judge_the_geometry_of_different_class_mixes() -> None:
    counts = [[70, 10, 10, 10] if k % 2 else [10, 10, 10, 70] for k in range(12)]
    global_state, clients = _liar_round(counts)
    outcome = run_audit(global_state, clients, AuditConfig(detectors=("evidence",)), round_index=3)
    evidence = outcome.detections["evidence"]
    assert evidence.flags == [False] * 12
    assert "class mixes differ" in evidence.summary.geometry_note


def test_carried_flags_keep_a_noisy_site_flagged_while_the_losses_reach_a_verdict() -> None:
    carried = np.array([True, True, False, False, False])
    sizes = np.ones(5)
    out = carry_flags(_result([False, True, False, False, False]), carried, sizes, 0.5)
    assert out.flags == [True, True, False, False, False]
    first, second = out.verdicts[0], out.verdicts[1]
    assert first is not None
    assert first.evidence.geometry_carried is True
    assert second is not None
    assert second.evidence.geometry_carried is ABSENT  # flagged anyway: its verdict as it was
    assert out.summary.geometry_carried == 1
    assert out.summary.flagged == 2
    # nothing is carried into an abstaining or anchored verdict
    assert (
        carry_flags(_result([False] * 5, "inconclusive"), carried, sizes, 0.5).flags == [None] * 5
    )
    anchored = carry_flags(_result([False] * 5, mode="anchored"), carried, sizes, 0.5)
    assert anchored.flags == [False] * 5
    # Never to max_flagged_fraction: with site 2 flagged too, 3 of 5 would be.
    capped = carry_flags(_result([False, True, True, False, False]), carried, sizes, 0.5)
    assert capped.flags == [False, True, True, False, False]
    assert "not carried" in given(capped.summary.geometry_carry_note)


def test_the_audit_carries_a_geometry_flag_of_a_noisy_site() -> None:
    # The same round with site 0 moving with the others (it trained in the noisy role): the
    # geometry does not flag it, its history (noisy, last flagged by the geometry) keeps it.
    global_state, clients = _liar_round()
    turned = [
        dataclasses.replace(c, state=clients[1].state) if i == 0 else c
        for i, c in enumerate(clients)
    ]
    config = AuditConfig(detectors=("evidence",))
    history = [StatusHistory(status="noisy", flags=(True, True), by_geometry=True)] + [
        StatusHistory() for _ in range(11)
    ]
    carried = run_audit(global_state, turned, config, round_index=5, status_history=history)
    first = carried.detections["evidence"].verdicts[0]
    assert first is not None
    assert first.flag is True
    assert first.evidence.geometry_carried is True
    assert first.evidence.flagged_by_geometry is False
    # A noisy site whose status rests on its losses is not carried: they speak every round.
    by_losses = [StatusHistory(status="noisy", flags=(True, True))] + history[1:]
    plain = run_audit(global_state, turned, config, round_index=5, status_history=by_losses)
    assert plain.detections["evidence"].flags[0] is False


def test_small_clean_sites_are_not_judged_against_large_ones() -> None:
    # Sites 10 and 11 hold 20 samples (the others 100): their updates scatter sqrt(5) times
    # more, so their cosines fall far below the large sites' (z well above the floor against
    # them); they have no 9 peers of their size, so their updates are not judged.
    counts = [[25, 25, 25, 25]] * 10 + [[5, 5, 5, 5]] * 2
    global_state, clients = _liar_round(counts, liar=False)
    config = AuditConfig(detectors=("evidence",))
    evidence = run_audit(global_state, clients, config, round_index=3).detections["evidence"]
    assert evidence.flags == [False] * 12
    assert evidence.summary.geometry_judged == 10
    small = evidence.verdicts[10]
    assert small is not None
    assert small.evidence.geometry_z is None
    # Judged against the large sites instead (every site one group), they would be flagged:
    # what the peer groups are for.
    squared = np.array([float(np.sum(c.state.get("w") ** 2)) for c in clients])
    updates = np.stack([c.state.get("w") for c in clients])
    sizes = np.array([c.num_samples for c in clients], dtype=float)
    total = (sizes[:, None] * updates).sum(axis=0)
    cos = leave_one_out_cosines(squared, updates @ total, float(total @ total), sizes)
    one_group = geometry_evidence(cos, np.array(counts), np.full(12, 100), q=0.01)
    assert one_group.flags[10:].all()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("geometry_min_sites", 4),
        ("geometry_min_z", 0.0),
        ("geometry_min_homogeneity_p", 1.0),
        ("geometry_check", "yes"),
    ],
)
def test_geometry_settings_are_checked(key: str, value: object) -> None:
    with pytest.raises(InvalidParameterError, match=key):
        AuditConfig.from_flat(**{key: value})


def test_sites_in_the_noisy_role_are_neither_judged_nor_part_of_the_null() -> None:
    # 11 sites: the ten of _cosines(-0.10) and an eleventh at 0.495 in the noisy role. Excluded,
    # it is not judged and the ten are judged exactly as without it (same median and MAD).
    cos = np.append(_cosines(-0.10), 0.495)
    counts = np.vstack([BALANCED, [[30, 30, 30]]])
    exclude = np.array([False] * 10 + [True])
    result = geometry_evidence(cos, counts, np.full(11, 90), q=0.01, exclude=exclude)
    assert result.judged.tolist() == [True] * 10 + [False]
    assert result.z[9] == pytest.approx(0.595 / (1.4826 * 0.02))
    # Included, it sits at the median (0.495) and shrinks the MAD to 0.015 (deviations sorted:
    # 0 .005 .005 .005 .015 .015 .025 .025 .035 .035 .595): every z grows by a third, site 9's
    # to 0.595 / 0.022239 = 26.75, what a group of distilled updates does to a clean site's z.
    included = geometry_evidence(cos, counts, np.full(11, 90), q=0.01)
    assert included.z[9] == pytest.approx(0.595 / (1.4826 * 0.015))


def test_the_floor_grows_as_the_group_shrinks() -> None:
    # The tabulated quantiles: 9 peers 24.88, 10 peers 16.88, 20 peers 8.96 (below min_z), and
    # beyond the table the value at 30; fewer than 5 peers can never stand out.
    assert critical_z(9) == pytest.approx(24.88)
    assert critical_z(10) == pytest.approx(16.88)
    assert critical_z(20) == pytest.approx(8.96)
    assert critical_z(500) == critical_z(30) == pytest.approx(7.30)
    assert critical_z(4) == math.inf
    # Odd and even sizes apart, the floor falls as the group grows.
    odd = [critical_z(n) for n in range(5, 31, 2)]
    even = [critical_z(n) for n in range(6, 31, 2)]
    assert odd == sorted(odd, reverse=True)
    assert even == sorted(even, reverse=True)


@pytest.mark.parametrize("n", [9, 12, 16])
def test_the_table_is_what_the_null_gives(n: int) -> None:
    # A fresh simulation (another seed, 500,000 groups: about 50 exceed the quantile) lands
    # within 20 % of the tabulated 4,000,000-group value; the table is not the code's output for
    # this seed, so a mistyped entry or a statistic other than the one tabulated fails.
    fresh = simulate_critical_z(n, draws=500_000, seed=7)
    assert fresh == pytest.approx(critical_z(n), rel=0.20)


def test_the_nine_site_group_of_a_clean_federation_is_not_flagged() -> None:
    # Round 23 of a clean 9-site BreastMNIST federation (docs/eval/holdout.py, draw 1, scenario
    # 00, seed 0): five of the nine cosines within 0.009 of each other. Median -0.044; absolute
    # deviations sorted 0 .001 .001 .003 .008 .029 .085 .097 .166: MAD 0.008, scale 0.011861,
    # site 3's z = 0.166 / 0.011861 = 14.0 (its MAD collapsed, not its labels): above min_z
    # (10), below what chance gives the largest of 9 peers one round in 10,000 (24.88).
    cos = np.array([-0.052, -0.043, -0.073, -0.210, -0.047, -0.043, 0.041, 0.053, -0.044])
    counts = np.full((9, 2), 30)
    result = geometry_evidence(cos, counts, np.full(9, 60), q=0.01)
    assert result.judged.all()
    assert result.z[3] == pytest.approx(0.166 / (1.4826 * 0.008))
    assert not result.flags.any()
