"""Trust anchors: the anchored audit's error counts and anchor-led aggregation (beyond the papers).

**Trust anchors** are sites an admin marks as curated (``fedaudit client anchor``,
``PUT .../clients/{id}/anchor``). Anchors are never flagged. When the consensus verdict is
inconclusive, or the anchors look noisy against the consensus (each anchor's site-level z
(Stouffer's below 10 sites) positive and its site p-value passing BH at ``q`` among the anchors),
the evidence detector (:mod:`service.audit.evidence`) takes the anchors as its reference: each
class's centre is the anchors' precision-weighted mean loss, the noisy direction is away from the
anchors (*lower* loss than the anchors when the anchors look noisy to the consensus: the global
model learned inverted labels), and the sites significantly away from the anchors in that
direction are flagged by the same rule (no minority rule: with the orientation settled by the
anchors, a noisy majority can be flagged). The verdict stays inconclusive when some anchors look
noisy and others do not, when the spreads were not sent, or when no anchor holds a class. The
admin's word is the only thing that tells an inverted consensus from a noisy anchor (the labels
are the mirror image of each other): **a mistaken anchor, noisy itself, turns the audit upside
down** and flags the clean sites. Limits: with fewer than three anchors holding a class, the
between-site spread ``tau_c`` is not estimable from clean sites and is taken as 0, so sites whose
data differ from the anchors' (not only their labels) can look noisy; a class no anchor holds
gives no evidence in anchored mode.

**Error counts against the anchors** (:func:`anchored_error_evidence`). In anchored mode, oriented
as the consensus (not inverted), a site's errors (the samples the global model assigns to
another class than their label) are compared with what the anchors' error rates predict for its
class mix: per class, the anchors' pooled rate ``(T + 1/2) / (N + 1)``; the site's total over the
classes an anchor holds is negative binomial (the gamma-Poisson mixture of
:mod:`service.audit.error_evidence`) with dispersion ``min_dispersion`` (the anchors are too
few to fit one) plus the estimated rates' own variance; the exact upper tail; and a floor: the
site's error rate must exceed the expected one by at least ``min_excess`` (default 0.10, twice
the consensus mode's). The floor is the generalisation gap allowed: under an anchor-led model
(below) the anchors' errors are measured on the data the model was trained on, a clean site's on
data it has not seen. Combined with the loss evidence as in consensus mode, ``p = min(1, 2
min(p_loss, p_errors))``. The loss evidence alone cannot find a noisy site against an anchor whose
losses are near zero: a noisy site's own spread is large because of its wrong labels, and its
z is bounded by about ``sqrt(n r / (1 - r))`` per class (docs/algorithms.md, "Error counts").

**Anchor-led aggregation** (:func:`anchor_led_clients`). An anchor can orient only an audit whose
model learned something: in a corrupted consensus (several sites above 0.5 on a binary task) the
global model fits the mixture of the sites' labels, the anchors' curated labels are as poorly
predicted as the noisy sites', and the anchored test has nothing to read (measured:
docs/evaluation.md, "One trust anchor in the corrupted consensus"). So, from the first round
after the warm-up in which the evidence detector had to take the anchors as its reference, the
aggregate is no longer the configured rule over every site but FedAvg over the anchors alone for
``only_rounds`` rounds (default 2: the model learns the anchors' labels), then over the anchors
and the sites the round's anchored audit (the evidence detector, whatever the primary detector
is) cleared, its flag ``False``; an admin's pin wins: a site pinned noisy is never aggregated,
an anchor included, one pinned trusted counts as cleared. The lead lasts while the anchors take
part in every round: once the consensus has contradicted the curated labels, the federation does
not go back to it by itself; a round without a led aggregate (the admin removed the anchors, or
none took part) ends it, and it starts again only where the evidence detector takes the anchors
as its reference once more. In led rounds the evidence detector takes the anchors as its
reference wherever it can (spreads sent, anchors that agree). The weight cap applies over the
sites aggregated. Limits: the model is then only as good as the anchors'
data (and the sites cleared): an anchor holding one class of two teaches the model nothing about
the other, and nothing in that class can be audited; the anchors' errors are in-sample (the
floor above); a federation that is healthy but whose consensus was once inconclusive while
anchors took part is led by the anchors from then on (the anchored audit clears its clean sites,
which then take part again); without spreads the anchored audit abstains, so a lead aggregates
the anchors alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit.class_null import benjamini_hochberg
from service.audit.detection import DetectionResult
from service.audit.error_evidence import (
    ErrorEvidence,
    ndtri_clipped,
    rate_dispersion,
    upper_p,
)
from service.audit.evidence_verdicts import EvidencePass
from service.audit.verdict_types import EvidenceSummary

__all__ = [
    "ANCHOR_LEAD_ONLY_ROUNDS",
    "ANCHORED_MIN_ERROR_EXCESS",
    "anchor_led_clients",
    "anchored_error_evidence",
    "anchored_pass",
]

ANCHORED_MIN_ERROR_EXCESS = 0.10
"""Default floor on a site's error rate above the anchors' (module docstring)."""

ANCHOR_LEAD_ONLY_ROUNDS = 2
"""Default number of anchor-led rounds aggregated from the anchors alone (module docstring)."""


def anchored_pass(
    run_pass: Callable[[BoolArray, float, BoolArray], EvidencePass],
    sd: FloatArray | None,
    anchor: BoolArray,
    consensus: EvidencePass,
    reason: str | None,
    q: float,
) -> tuple[EvidencePass | None, bool, str | None]:
    """Anchored mode (module docstring, "Trust anchors"): the anchored pass when it replaces the
    consensus (else None), whether the anchors look noisy to the consensus, and the reason the
    verdict abstains (None: it does not).

    ``run_pass(reference, direction, never)`` is the evidence detector's pass over the round,
    with the classes centred on ``reference``; ``consensus`` its consensus pass, ``reason``
    why the consensus abstains (None: it does not), ``q`` the BH level.
    """
    # An anchor "looks noisy" to the consensus when its z (site-level, or Stouffer's below 10
    # sites) is positive and its loss p-value passes BH among the anchors.
    anchor_p, anchor_z = consensus.p_loss[anchor], consensus.z_high[anchor]
    looks_noisy = benjamini_hochberg(anchor_p, q)[0] & (anchor_z > 0)
    inverted = bool(looks_noisy.any())
    if inverted and not looks_noisy.all():
        noisy = f"{int(looks_noisy.sum())} of {int(anchor.sum())}"
        return (
            None,
            inverted,
            f"the trust anchors disagree: {noisy} look noisy against the consensus, the "
            "others do not; check the anchors",
        )
    if reason is None and not inverted:
        return None, inverted, None
    anchored = run_pass(anchor, -1.0 if inverted else 1.0, anchor)
    why = reason or "an anchor looks noisy against the consensus"
    if sd is None:
        return None, inverted, why + "; anchored mode needs the sites' per_class_loss_sd"
    if not np.isfinite(anchored.evidence.mu).any():
        return None, inverted, why + "; no anchor holds a class the others hold"
    return anchored, inverted, None


def anchored_error_evidence(
    errors: IntArray,
    counts: IntArray,
    *,
    exclude: BoolArray | None,
    min_excess: float,
    min_dispersion: float,
) -> ErrorEvidence:
    """The error counts of one round against the anchors (module docstring).

    Parameters
    ----------
    errors, counts : ndarray of int of shape (K, C)
        Per site and label, the global model's errors and the samples; 0 <= errors <= counts
        (checked by the caller).
    exclude : ndarray of bool of shape (K,)
        Every site but the anchors (called as :func:`~service.audit.error_evidence.counted_on`
        calls its evidence: the sites left out of the fit). None: every site is an anchor.
    min_excess, min_dispersion : float
        The floor on the excess error rate; the negative binomial's dispersion phi.

    Returns
    -------
    ErrorEvidence
        p-value 1 and z 0 for an anchor and for a site holding no class an anchor holds.
    """
    anchor = np.ones(counts.shape[0], dtype=bool) if exclude is None else ~exclude
    held_by_anchor = counts[anchor].sum(axis=0)
    anchor_errors = errors[anchor].sum(axis=0)
    enters = held_by_anchor > 0
    rate = np.where(enters, (anchor_errors + 0.5) / (held_by_anchor + 1.0), 0.0)
    entered = (counts > 0) & enters[None, :]
    n_in = np.where(entered, counts, 0)
    expected = (n_in * rate).sum(axis=1)
    observed = np.where(entered, errors, 0).sum(axis=1)
    # The anchors' estimated rates' own variance, as a dispersion: Var(sum n p_hat) / (sum n p)^2.
    extra = rate_dispersion(n_in, rate, np.where(enters, held_by_anchor + 1.0, 1.0))
    judged = entered.any(axis=1) & ~anchor
    p = upper_p(observed, np.maximum(expected, 1e-12), min_dispersion + extra)
    above = observed - expected >= min_excess * np.maximum(n_in.sum(axis=1), 1)
    p_site = np.where(judged & above, p, 1.0)
    return ErrorEvidence(
        p_value=np.asarray(p_site, dtype=np.float64),
        z=np.asarray(np.where(judged, -ndtri_clipped(p_site), 0.0), dtype=np.float64),
        expected=np.asarray(expected, dtype=np.float64),
        observed=np.asarray(observed, dtype=np.int64),
        class_rate=np.where(enters, anchor_errors / np.maximum(held_by_anchor, 1), np.nan),
        dispersion=float(min_dispersion),
        class_dispersion=0.0,
        fit_set=anchor,
    )


def anchor_led_clients(
    anchors: Sequence[bool] | None,
    evidence: DetectionResult | None,
    pins: Sequence[bool | None] | None,
    rounds_led: int | None,
    only_rounds: int = ANCHOR_LEAD_ONLY_ROUNDS,
) -> BoolArray | None:
    """Which clients this round's aggregate is taken from when it is anchor-led, else None.

    Parameters
    ----------
    anchors : sequence of bool, optional
        The round's trust anchors (aligned with the clients).
    evidence : DetectionResult, optional
        The round's ``evidence`` detector result (None where it did not run): its flags are the
        anchored audit's (False: cleared), whatever the primary detector is.
    pins : sequence of bool or None, optional
        An admin's pins (True: noisy, False: trusted, None: none): a site pinned noisy is never
        aggregated, an anchor included; one pinned trusted counts as cleared.
    rounds_led : int or None
        The anchor-led rounds just before this one, in a row; None: anchor-led aggregation is not
        considered this round (the warm-up, or switched off).
    only_rounds : int
        Anchor-led rounds aggregated from the anchors alone.

    Returns
    -------
    ndarray of bool or None
        The clients aggregated (the anchors, plus from round ``only_rounds`` of the lead the
        clients cleared); None when the round is not anchor-led: no anchor takes part, none has
        led in the rounds just before and the evidence detector did not take the anchors as its
        reference this round, or every anchor is pinned noisy.
    """
    if rounds_led is None or anchors is None or not any(anchors):
        return None
    summary = None if evidence is None else evidence.summary
    if rounds_led == 0 and (not isinstance(summary, EvidenceSummary) or summary.mode != "anchored"):
        return None
    k = len(anchors)
    pinned = [None] * k if pins is None else list(pins)
    flags = [None] * k if evidence is None else evidence.flags
    chosen = np.asarray(anchors, dtype=bool).copy()
    if rounds_led >= only_rounds:
        chosen |= np.array([f is False or p is False for f, p in zip(flags, pinned, strict=True)])
    chosen &= np.array([p is not True for p in pinned], dtype=bool)
    return chosen if bool((chosen & np.asarray(anchors, dtype=bool)).any()) else None
