"""Confident errors: the share of a site's errors that contradict its labels outright.

The error counts (:mod:`service.audit.error_evidence`) count every sample the global model
(theta_G, the model received this round) assigns to another class. A clean site's errors are
mostly its hard samples, on which the model hesitates; a wrong label the model has learned to
contradict is an error it makes with confidence. With the error counts the SDK sends
``per_class_confident_errors``: the errors where theta_G gives the given label a probability of at
most 0.1 (``client_sdk.signals.CONFIDENT_ERROR_PROBABILITY``; on a binary task, the other class
at 0.9 or more).

**The test: the share, given the errors.** Of a clean site's ``e[k, c]`` errors in class c, each
is confident with the class's share ``s_c`` of the clean sites: the site's confident errors, given
its errors, are a sum of binomials with mean ``sum_c e[k, c] s_c``. ``s_c`` is pooled over the
*other* sites of the fit set, ``(T_c + s) / (N_c + 1)`` for their ``T_c`` confident errors among
``N_c`` errors (``s`` the fit set's overall share: a class with no error elsewhere takes it). The
p-value is the upper tail of the site's ``E_k`` errors at the mean share, beta-binomial with an
intra-site correlation rho (:data:`SHARE_DISPERSION`, 0.02; :data:`SMALL_SHARE_DISPERSION`, 0.05,
below 10 sites and in anchored mode): clean sites' shares differ a little (a sum of binomials
with the same mean has at most the binomial's variance, so the spread is all rho's), 1 unless the
site's confident errors exceed their expectation by ``min_excess`` of its samples (the
practical-significance floor of the error counts). The fit set starts as every site that sent its
counts (less the pass's ``exclude``: the first pass's flags, or in anchored mode every site but
the anchors) and is trimmed, until stable, of the sites significant at ``FIT_TRIM`` (0.05), as
the error counts' is: a noisy minority's confident errors would otherwise raise ``s_c``.

Why the share and not the confident errors counted like the errors: clean sites' confident
errors are few and clustered (a handful of odd samples at one site, none at the next), and the
error counts' negative binomial fitted their spread at its cap, phi = psi = 1 (a round of 20
digit sites with mild noise, the stress matrix's m06 seed 0: a noisy site's 30 confident errors
against 3.0 expected got p = 8e-4). The share given the errors does not depend on how many
errors a site makes (its difficulty), only on how sure the model is of them: on the stored
signals of the stress matrix's rows (fedavg, rounds after the warm-up; docs/algorithms.md,
"Confident errors") the share test at rho 0.02 gave p < 0.001 for none of the clean site-rounds
and for 28-52 % of the noisy ones of the digit rows m03, m05 and m06.

A site's p-value then takes the smallest of three, Bonferroni over the three tests:

    p_k = min(1, 3 min(p_loss, p_errors, p_share))

where the site sent both counts (``min(1, 2 min(p_loss, p_errors))`` where it sent the errors
only, as before).

**The estimated shares.** ``s_c`` rests on the other sites' errors in the class, and where those
are few it is uncertain: its sampling variance ``s_c (1 - s_c) / (N_c + 2)``, summed over the
site's classes with weights ``e[k, c]^2`` and divided by ``n (n - 1) s (1 - s)`` (``n`` the
site's errors, ``s`` their mean share), is the intra-site correlation that uncertainty alone
gives the site's count, and the test takes rho at least that (at most
:data:`MAX_SHARE_DISPERSION`). rho itself was measured on the stress matrix's rows with the
shares as estimated there, so it already holds their usual uncertainty: the larger of the two,
not their sum (the sum cost the mild-noise row m06 0.05-0.10 of F1 mean in replays). A clean
site whose class few other sites err in otherwise looked noisy: six clean BreastMNIST sites of
1-376 samples at Dirichlet(0.3) (the fourth held-out draw's h4-08), the site holding 88 of the
168 malignant images made 16 confident errors of 25 where the other sites' 8 errors in the
class held one, and was flagged in 5 of 27 rounds (``tests/audit/test_skewed_clean_sites.py``).

**Label noise adds errors.** A flipped label is an error of the model's unless the sample
would have been one anyway (a hard sample, at the class's error rate r), so flips that make a
site's confident errors exceed their expectation by X make its errors exceed theirs by about
X (1 - r) or more. A site's share test therefore counts only where its errors (the error
counts' test, :mod:`service.audit.error_evidence`: observed minus expected over its entered
classes) exceed their expectation by at least :data:`ERRORS_BEHIND_SHARE` (a quarter) of its
confident errors' excess, the bound at error rates up to three quarters; where the error
counts' test entered none of the site's classes (it needs ``min_holders`` holders of a class,
the share test :data:`MIN_OTHER_SITES` other site with errors in it: two sites alone holding a
class) there is nothing to compare, and the share counts alone, as before. On the stored signals
of the held-out draws 1-4 and the stress matrix (their FedAvg federations, rounds after the
warm-up) 4,774 of the 4,780 noisy site-rounds with a share p below 5e-4 had errors at or above
their expectation, and 99.2 % cleared the quarter; the clean site-rounds with a share p below
2e-3 did not: a clean BreastMNIST site holding 88 of 168 malignant images (the fourth held-out
draw's h4-08) made 19 confident errors of 30 against 4.9 expected while its errors were 2.3
above their expectation, and a digit site of a clean 51-site federation 7 against 1.1 with its
errors 0.5 below theirs. Replayed with the evidence detector on all 359 stored federations
(FedAvg and FedNoRo; ``docs/eval/confident_errors_whatif.py``): false-flag rounds 3 -> 2,
noisy sites found 777 -> 777, the sum of F1 means 192.41 -> 192.26 (at a half instead of a
quarter: 192.11, the same false flags).

**Limits.** A model that has memorised a site's wrong labels contradicts none of them; a clean
site whose data the model gets confidently wrong (another scanner, a sub-population the other
sites lack) looks like a noisy one to this test as to the others. rho is fixed, not fitted
(measured on the stress matrix's rows; a federation whose clean sites' shares differ more will
see false flags from this test).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import betaln
from scipy.stats import betabinom, binom

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import InvalidInputError
from service.audit.error_evidence import (
    FIT_TRIM,
    ErrorEvidence,
    ReportedCounts,
    ndtri_clipped,
    reported_counts,
)
from service.audit.pooling import RATE_CAP, pool_weights

__all__ = [
    "SHARE_DISPERSION",
    "SMALL_SHARE_DISPERSION",
    "CountTests",
    "RoundCounts",
    "round_counts",
    "share_evidence",
]

MAX_SHARE_DISPERSION = 0.9
"""The largest intra-site correlation a site's share test takes (its shares' own estimation
variance where that exceeds rho): below 1, where the beta-binomial degenerates."""

SHARE_DISPERSION = 0.02
"""rho, the intra-site correlation of the confident share (beta-binomial: a site's share varies
around the pool's with variance rho s (1 - s)), from ``SITE_LEVEL_MIN_SITES`` sites on. Clean
sites' shares do differ (a site whose samples the model gets confidently wrong, e.g. one class
held mostly there): on the stored signals of the stress matrix's rows (fedavg, rounds after the
warm-up) the binomial (rho = 0) gave p < 0.01 for 2.3 % of the clean site-rounds of the 6
BreastMNIST sites of m15 and flagged one clean digit site of m03; at 0.02, 0-1.4 % and none."""

SMALL_SHARE_DISPERSION = 0.05
"""rho below ``SITE_LEVEL_MIN_SITES`` sites and in anchored mode (as the error counts' phi has a
larger floor there: no between-site spread is fitted to go by). At 0.05 m15's clean sites stay
above p = 0.01 in every round measured."""

_MAX_TRIMS = 10
"""Most trimming passes of the share's fit set (it stops earlier when nothing changes)."""

MIN_OTHER_SITES = 1
"""Other fit-set sites with errors in a class for the class to enter a site's share test. A
class whose only other holders are noisy (left out of the fit) says nothing: in the stress
matrix's m04 (two classes per site, pair flips) the noisy holders of one digit taught the model
to call it the next one, the one clean holder's samples of it were all confidently wrong, and it
was flagged in two rounds against a share borrowed from the other classes. Two sites cost power
on the skewed rows (replayed: m03 seed 1 F1 mean 0.71 -> 0.62, m06 seed 1 0.89 -> 0.84) and
moved one clean site of m06 seed 0 over the edge in one round; one site does neither."""

MIN_EXCESS_COUNT = 5.0
"""A site's confident errors must exceed their expectation by at least this many (beside
``min_excess`` of its samples). A clean site's handful of odd samples is a handful of confident
errors: in README's demo a clean site of 80 samples had 5 of its 6 errors confident against
0.97 expected (4.03 above, just over 5 % of its samples), p = 0.0013, and was flagged once,
among 8 noisy sites, by Benjamini-Hochberg's ninth place."""

ERRORS_BEHIND_SHARE = 0.25
"""A site's share test counts only where its errors exceed their expectation (the error counts'
test, :mod:`service.audit.error_evidence`) by at least this part of its confident errors'
excess (module docstring, "Label noise adds errors")."""


@dataclass(frozen=True)
class RoundCounts:
    """A round's counts: the errors and, where enough sites sent them, the confident errors."""

    errors: ReportedCounts
    confident: ReportedCounts | None = None

    @property
    def reporting(self) -> BoolArray:
        """(K,) the sites that sent their error counts."""
        return self.errors.reporting


def round_counts(
    errors: Any, confident: Any, counts: IntArray, min_sites: int
) -> RoundCounts | None:
    """The round's checked counts (:func:`~service.audit.error_evidence.reported_counts`); the
    confident ones enter where ``min_sites`` sites sent them, each at most the site's errors.
    None when fewer than ``min_sites`` sites sent their errors."""
    wrong = reported_counts(errors, counts, min_sites)
    if wrong is None or confident is None:
        return None if wrong is None else RoundCounts(wrong)
    sure = reported_counts(confident, counts, min_sites, "per_class_confident_errors")
    if sure is None:
        return RoundCounts(wrong)
    if (sure.reporting & ~wrong.reporting).any():
        raise InvalidInputError("per_class_confident_errors: a site sent them without its errors")
    if (sure.errors > wrong.errors).any():
        raise InvalidInputError("per_class_confident_errors: a count exceeds the class's errors")
    return RoundCounts(wrong, sure)


_TAIL_TERMS_PER_CHUNK = 1 << 20
"""Terms of the beta-binomial tails :func:`betabinom_upper` sums at a time (memory bound)."""

_MAX_TAIL_TERMS = 1 << 16
"""A tail of more terms than this (a site with tens of thousands of errors) is left to scipy's
``betabinom.sf``: summing it term by term would cost about 72 bytes a term (a site claiming
3e7 errors took 6 s and 1.9 GB), where scipy's 1 - CDF costs the terms below x, one at a time."""


def betabinom_upper(x: IntArray, n: IntArray, a: FloatArray, b: FloatArray) -> FloatArray:
    """P(X >= x) for X beta-binomial (n, a, b), elementwise, as the sum of the probabilities
    of x .. n (the terms the tail holds, vectorised over the elements; 1 where x <= 0, 0
    where x > n). A tail of more than :data:`_MAX_TAIL_TERMS` terms is scipy's.

    scipy's ``betabinom.sf`` gives the same up to rounding, as 1 minus the sum of the terms
    below x, one element at a time: it took 0.14 s of a 10,000-site round's evidence, loses
    digits to the subtraction (about 1e-12 absolute; 4e-5 relative at p = 7e-4 with 1.2e7
    errors) and rounds a tail below about 1e-12 to 0, which this keeps.

    >>> float(betabinom_upper(np.array([2]), np.array([2]), np.array([1.0]), np.array([1.0]))[0])
    0.3333333333333333
    """
    x = np.asarray(x, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    out = np.where(x <= 0, 1.0, 0.0)
    inside = (x > 0) & (x <= n)
    long = inside & (n - x + 1 > _MAX_TAIL_TERMS)
    if long.any():
        out[long] = betabinom.sf(x[long] - 1, n[long], a[long], b[long])
    todo = np.flatnonzero(inside & ~long)
    start = 0
    while start < todo.size:  # chunks of whole tails, at most about _TAIL_TERMS_PER_CHUNK terms
        lengths = n[todo[start:]] - x[todo[start:]] + 1
        stop = start + max(1, int(np.searchsorted(np.cumsum(lengths), _TAIL_TERMS_PER_CHUNK)))
        part = todo[start:stop]
        out[part] = _tail_sums(x[part], n[part], a[part], b[part])
        start = stop
    return out


def _tail_sums(x: IntArray, n: IntArray, a: FloatArray, b: FloatArray) -> FloatArray:
    """:func:`betabinom_upper` for elements with 1 <= x <= n: every term at once."""
    lengths = n - x + 1
    seg = np.repeat(np.arange(x.size), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    j = (x[seg] + np.arange(seg.size) - starts[seg]).astype(np.float64)
    nn, aa, bb = n[seg].astype(np.float64), a[seg], b[seg]
    # log C(n, j) + log B(j + a, n - j + b) - log B(a, b), as scipy's betabinom writes it
    log_terms = (
        -np.log1p(nn) - betaln(nn - j + 1.0, j + 1.0) + betaln(j + aa, nn - j + bb) - betaln(aa, bb)
    )
    top = np.maximum.reduceat(log_terms, starts)
    total = np.add.reduceat(np.exp(log_terms - top[seg]), starts)
    return np.asarray(np.minimum(1.0, np.exp(top) * total), dtype=np.float64)


def _share_p(
    errors: IntArray,
    confident: IntArray,
    samples: FloatArray,
    fit: BoolArray,
    min_excess: float,
    rho: float,
    error_excess: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """(p-value, expected confident errors, per-class share, confident errors counted: in the
    classes that entered) of every site against the fit set's shares, each fit-set site left
    out of its own (module docstring). A fit-set site weighs at most the median fit-set site's
    errors in the pool (:data:`~service.audit.pooling.RATE_CAP`: one site claiming 20,000
    samples, its errors at the clean rate and none confident, pulled every share down and made
    the 10 clean sites of a round significant), and a class enters a site's test only where
    :data:`MIN_OTHER_SITES` other fit-set sites made errors in it."""
    weight = pool_weights(errors.sum(axis=1).astype(np.float64), fit, factor=RATE_CAP)
    own_errors, own_sure = errors * weight[:, None], confident * weight[:, None]
    pooled_errors, pooled_sure = own_errors.sum(axis=0), own_sure.sum(axis=0)
    overall = (pooled_sure.sum() + 0.5) / (pooled_errors.sum() + 1.0)
    others = pooled_errors - own_errors
    share = (pooled_sure - own_sure + overall) / (others + 1.0)
    erred = (errors > 0) & (weight > 0)[:, None]
    entered = (erred.sum(axis=0) - erred) >= MIN_OTHER_SITES
    expected = (np.where(entered, errors, 0) * share).sum(axis=1)
    n = np.where(entered, errors, 0).sum(axis=1)
    x = observed = np.where(entered, confident, 0).sum(axis=1)
    # The tail only where the floor is cleared (the rest is 1): most sites of a large round.
    floor = np.maximum(min_excess * np.maximum(samples, 1.0), MIN_EXCESS_COUNT)
    enough = (n > 0) & (x - expected >= floor)
    if error_excess is not None:  # label noise adds errors (module docstring)
        # NaN where the error counts' test entered none of the site's classes: no gate there
        enough &= ~(error_excess < ERRORS_BEHIND_SHARE * (x - expected))
    # The shares are estimates: their sampling variance, s (1 - s) / (errors pooled + 2) per
    # class, as an intra-site correlation (the variance of the expected count over
    # n (n - 1) s (1 - s), the beta-binomial's excess over the binomial); rho is at least that
    # (module docstring, "The estimated shares").
    used = np.where(entered, errors, 0).astype(np.float64)
    share_var = (np.square(used) * share * (1.0 - share) / (np.maximum(others, 0.0) + 2.0)).sum(
        axis=1
    )
    n, x = n[enough], x[enough]
    s = np.clip(expected[enough] / n, 1e-9, 1.0 - 1e-9)
    pairs = n.astype(np.float64) * (n - 1.0) * s * (1.0 - s)
    estimated = np.where(pairs > 0, share_var[enough] / np.where(pairs > 0, pairs, 1.0), 0.0)
    rho_k = np.minimum(np.maximum(rho, estimated), MAX_SHARE_DISPERSION)
    p = np.ones(errors.shape[0], dtype=np.float64)
    spread = rho_k > 0.0
    part = np.ones(n.shape, dtype=np.float64)
    if spread.any():
        k = 1.0 / rho_k[spread] - 1.0
        part[spread] = betabinom_upper(x[spread], n[spread], s[spread] * k, (1 - s[spread]) * k)
    if (~spread).any():
        part[~spread] = binom.sf(x[~spread] - 1, n[~spread], s[~spread])
    p[enough] = part
    shares = np.where(pooled_errors > 0, (pooled_sure + overall) / (pooled_errors + 1), np.nan)
    return p, expected, shares, observed


def share_evidence(
    errors: IntArray,
    confident: IntArray,
    counts: IntArray,
    *,
    reporting: BoolArray,
    exclude: BoolArray | None = None,
    trim: float = FIT_TRIM,
    min_excess: float = 0.05,
    dispersion: float = SHARE_DISPERSION,
    counted: ErrorEvidence | None = None,
) -> ErrorEvidence:
    """The share test of one round (module docstring), as an
    :class:`~service.audit.error_evidence.ErrorEvidence`: ``observed`` the site's confident
    errors in the classes that entered its test, ``expected`` those its errors there would hold
    at the fit set's shares, ``class_rate`` the shares, ``dispersion`` rho. A site that did not
    send its confident errors (``reporting`` False) has p-value 1, enters no fit and shows
    nothing. With ``counted``, the same round's error-count evidence, a site's share counts only
    where its errors exceed their expectation by :data:`ERRORS_BEHIND_SHARE` of its confident
    errors' excess (no condition where that test entered none of the site's classes: it needs
    three holders of a class, the share test one other site with errors in it)."""
    base = reporting.copy() if exclude is None else reporting & ~np.asarray(exclude, dtype=bool)
    excess = None
    if counted is not None:  # NaN where the error test entered none of the site's classes
        entered = counted.expected > 0
        excess = np.where(entered, counted.observed - counted.expected, np.nan)
    samples = counts.sum(axis=1).astype(np.float64)
    fit = base.copy()
    seen: list[BoolArray] = []
    for _ in range(_MAX_TRIMS):
        p, expected, share, seen_x = _share_p(
            errors, confident, samples, fit, min_excess, dispersion, excess
        )
        trimmed = base & (p >= trim)
        if (
            2 * int(trimmed.sum()) <= int(reporting.sum())
            or bool((trimmed == fit).all())
            or any(bool((trimmed == f).all()) for f in seen)
        ):
            break
        seen.append(fit)
        fit = trimmed
    else:
        # Out of passes: the p-values above belong to the previous fit set.
        fit = seen[-1] if seen else fit
    p = np.where(reporting, p, 1.0)
    return ErrorEvidence(
        p_value=p,
        z=np.asarray(np.where(reporting, -ndtri_clipped(p), 0.0), dtype=np.float64),
        expected=np.where(reporting, expected, 0.0),
        observed=np.where(reporting, seen_x, 0).astype(np.int64),
        class_rate=share,
        dispersion=dispersion,
        class_dispersion=0.0,
        fit_set=fit,
        reported=reporting,
    )


@dataclass(frozen=True)
class CountTests:
    """How one pass of the evidence detector turns the round's counts into p-values.

    ``counted`` and ``anchor_counted`` fit the error counts against the consensus and against
    the anchors (:func:`~service.audit.error_evidence.counted_on` bound to
    :func:`~service.audit.error_evidence.error_evidence` or the anchored variant, called with
    the counts, the class counts, the sites left out of the fit and, for the consensus, phi's
    floor); ``floor`` is that floor where the site-level test gives none; ``min_excess`` and
    ``anchored_min_excess`` the share test's floors in each mode."""

    counted: Callable[..., ErrorEvidence]
    anchor_counted: Callable[..., ErrorEvidence]
    floor: float
    min_excess: float
    anchored_min_excess: float

    def p_values(
        self,
        p_loss: FloatArray,
        counts: RoundCounts | None,
        class_counts: IntArray,
        exclude: BoolArray | None,
        reference: BoolArray | None,
        direction: float,
        site_floor: float | None,
    ) -> tuple[FloatArray, ErrorEvidence | None, ErrorEvidence | None]:
        """Each site's p-value from its loss evidence and its counts (module docstring), with
        the errors' and the shares' evidence; the loss evidence's alone without counts, and in
        an inverted anchored pass (the counts say nothing about inverted labels)."""
        if counts is None or (reference is not None and direction < 0):
            return p_loss, None, None
        if reference is None:
            floor = self.floor if site_floor is None else site_floor
            leave_out, excess = exclude, self.min_excess
            errors = self.counted(counts.errors, class_counts, exclude, min_dispersion=floor)
        else:
            leave_out, excess = ~reference, self.anchored_min_excess
            errors = self.anchor_counted(counts.errors, class_counts, leave_out)
        both = np.minimum(1.0, 2.0 * np.minimum(p_loss, errors.p_value))
        p = np.where(counts.errors.reporting, both, p_loss)
        if counts.confident is None:
            return np.asarray(p, dtype=np.float64), errors, None
        sure = share_evidence(
            counts.errors.errors,
            counts.confident.errors,
            class_counts,
            reporting=counts.confident.reporting,
            exclude=leave_out,
            min_excess=excess,
            dispersion=SMALL_SHARE_DISPERSION if site_floor is None else SHARE_DISPERSION,
            counted=errors,
        )
        three = np.minimum(1.0, 3.0 * np.minimum(np.minimum(p_loss, errors.p_value), sure.p_value))
        p = np.where(counts.confident.reporting, three, p)
        return np.asarray(p, dtype=np.float64), errors, sure
