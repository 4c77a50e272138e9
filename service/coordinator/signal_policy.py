"""A federation's signal privacy policy, and the checks that hold joins and updates to it.

The policy is set when the federation is created (``config.privacy``) and sent to every site
with its task and its round instructions; the SDK applies it before anything leaves the site
(``client_sdk/privacy.py``). The coordinator only checks that what arrives obeys it:

- ``min_class_count`` m (0: off): a class a site holds fewer than m samples of is *suppressed*.
  Its entry of ``class_counts`` is ``null`` (meaning "at least 1 and fewer than m"), and its
  ``per_class_loss``, ``per_class_loss_sd`` and both error counts are ``null``. A count
  below m is refused, and so is a site whose every class is suppressed (it would leave the
  detectors no class to compare).
- ``count_bucket`` b (1: off): every count a site reports (``num_samples`` and each entry of
  ``class_counts``) is its exact count rounded up to a multiple of b; 0 stays 0, so whether a
  site holds a class is still known. A count that is not a multiple of b is refused.

With either on, the class counts no longer sum exactly to ``num_samples``: they must be
consistent with it, i.e. some exact histogram behind the reported one sums to some exact total
behind the reported ``num_samples``. Without a policy that is the exact sum, as before.

- ``dp_noise_multiplier`` sigma (0: off), with ``dp_clip_loss`` B, ``dp_delta`` and optionally
  ``dp_clip_probe`` R: the Gaussian mechanism. The site clips each per-sample loss to [0, B]
  before the per-class mean and adds N(0, (sigma B / n_c)^2) to the mean of class c; it clips
  each probe softmax row to within R (L2) of the uniform row and adds
  N(0, (sigma sqrt(P) min(2R, sqrt 2))^2) to every entry (docs/what-leaves-the-site.md, the
  sensitivities). ``per_class_loss_sd`` and the two error counts are not sent under it. The
  coordinator cannot see the noise; it refuses what the mechanism never sends (the spread, the
  error counts, a mean above B) and accounts for the rounds
  (:mod:`service.coordinator.privacy_budget`).

No web or database imports: plain functions over the stored configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fedaudit_privacy.accounting import NOISED_SIGNALS
from service.errors import Problem, problem
from service.inputs import INT32_MAX

__all__ = ["NOISED_SIGNALS", "SignalPolicy", "count_problems", "dp_problems", "policy_of"]

MAX_COUNT_BUCKET = 1_000_000
MAX_NOISE_MULTIPLIER = 1e6
MAX_CLIP = 1e6

WITHHELD_UNDER_DP = ("per_class_loss_sd", "per_class_errors", "per_class_confident_errors")
"""Sent with the per-class loss, but not under the Gaussian mechanism (not noised, so not sent)."""


class SignalPolicy(BaseModel):
    """How coarse the counts and per-class signals a site sends must be."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_class_count: int = Field(
        default=0,
        ge=0,
        le=INT32_MAX,
        description=(
            "m: a class a site holds 1 to m-1 samples of is suppressed: its class count is sent "
            "as null (meaning 'fewer than m') and its per-class loss, spread and error count as "
            "null. 0 (or 1): off."
        ),
    )
    count_bucket: int = Field(
        default=1,
        ge=1,
        le=MAX_COUNT_BUCKET,
        description=(
            "b: num_samples and every class count are sent rounded up to a multiple of b "
            "(0 stays 0). 1: exact counts."
        ),
    )

    dp_noise_multiplier: float = Field(
        default=0.0,
        ge=0.0,
        le=MAX_NOISE_MULTIPLIER,
        allow_inf_nan=False,
        description=(
            "sigma of the Gaussian mechanism on the per-class loss and the probe softmax: each "
            "is sent with N(0, (sigma * sensitivity)^2) noise added on the site. 0 (or null): "
            "off. With it, dp_clip_loss and dp_delta are required."
        ),
    )
    dp_clip_loss: float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_CLIP,
        allow_inf_nan=False,
        description=(
            "B: each per-sample loss is clipped to [0, B] before the per-class mean, whose "
            "sensitivity is then B / n_c for a class of n_c samples. Only with "
            "dp_noise_multiplier."
        ),
    )
    dp_clip_probe: float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_CLIP,
        allow_inf_nan=False,
        description=(
            "R: each probe softmax row is clipped to L2 distance R from the uniform row; a "
            "row's sensitivity is min(2R, sqrt(2)). Null: no clipping (sqrt(2), the simplex's "
            "diameter). Only with dp_noise_multiplier."
        ),
    )
    dp_delta: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description=(
            "delta of the (epsilon, delta) the coordinator accounts for each site; choose it "
            "well below 1 / (a site's number of samples). Only with dp_noise_multiplier."
        ),
    )

    @field_validator("dp_noise_multiplier", mode="before")
    @classmethod
    def _null_is_off(cls, value: Any) -> Any:
        return 0.0 if value is None else value

    @model_validator(mode="after")
    def _gaussian_settings(self) -> SignalPolicy:
        if self.dp_active:
            missing = [name for name in ("dp_clip_loss", "dp_delta") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"{' and '.join(missing)} required with dp_noise_multiplier")
        else:
            stray = [
                name
                for name in ("dp_clip_loss", "dp_clip_probe", "dp_delta")
                if getattr(self, name) is not None
            ]
            if stray:
                raise ValueError(
                    f"{', '.join(stray)} set without dp_noise_multiplier (> 0): the Gaussian "
                    f"mechanism is off, so they would do nothing"
                )
        return self

    @property
    def active(self) -> bool:
        """Whether the counts are coarsened (``min_class_count`` or ``count_bucket``)."""
        return self.min_class_count > 1 or self.count_bucket > 1

    @property
    def dp_active(self) -> bool:
        """Whether the Gaussian mechanism is on."""
        return self.dp_noise_multiplier > 0.0


def policy_of(config: Mapping[str, Any]) -> SignalPolicy:
    """The policy of a federation's stored configuration (off for one created before it
    existed)."""
    return SignalPolicy.model_validate(config.get("privacy") or {})


def _held_range(count: int | None, policy: SignalPolicy) -> tuple[int, int]:
    """The exact counts a reported class count stands for, (lowest, highest)."""
    m, b = policy.min_class_count, policy.count_bucket
    if count is None:
        return 1, max(m - 1, 1)
    if count == 0:
        return 0, 0
    return max(count - b + 1, m, 1), count


def count_problems(
    num_samples: int,
    class_counts: Sequence[int | None],
    policy: SignalPolicy,
    *,
    samples_loc: list[str | int],
    counts_loc: list[str | int],
) -> tuple[list[Problem], list[Problem]]:
    """(what the policy forbids, what does not add up) in a join's or an update's counts; both
    empty when they are fine. ``class_counts`` has one entry per class (checked before);
    ``samples_loc`` and ``counts_loc`` locate the two fields in the request.

    The messages name the policy's settings, never the value sent: a refusal is recorded in
    the event trail, which must not keep the exact count the policy withholds.
    """
    m, b = policy.min_class_count, policy.count_bucket
    forbidden: list[Problem] = []
    where = counts_loc
    for c, count in enumerate(class_counts):
        if count is None:
            if m <= 1:
                forbidden.append(
                    problem([*where, c], "null, but this federation suppresses no class")
                )
        elif 0 < count < m:
            forbidden.append(
                problem(
                    [*where, c],
                    f"a count below the federation's min_class_count {m} must be sent as null",
                )
            )
        elif count % b:
            forbidden.append(
                problem([*where, c], f"not a multiple of the federation's count_bucket {b}")
            )
    if num_samples % b:
        forbidden.append(
            problem(samples_loc, f"not a multiple of the federation's count_bucket {b}")
        )
    if m > 1 and not any(count for count in class_counts):
        forbidden.append(
            problem(
                where,
                f"every class this site holds has fewer than the federation's min_class_count "
                f"{m} samples: nothing is left to report, the site cannot take part",
            )
        )
    if forbidden:
        return forbidden, []
    return [], _sum_problems(num_samples, class_counts, policy, where)


def _sum_problems(
    num_samples: int,
    class_counts: Sequence[int | None],
    policy: SignalPolicy,
    where: list[str | int],
) -> list[Problem]:
    if not policy.active:
        total = sum(int(c or 0) for c in class_counts)
        if total != num_samples:
            return [problem(where, f"sums to {total} but num_samples is {num_samples}")]
        return []
    ranges = [_held_range(count, policy) for count in class_counts]
    low, high = sum(r[0] for r in ranges), sum(r[1] for r in ranges)
    # The exact total behind num_samples (rounded up to a multiple of b) is in this range.
    total_low = max(num_samples - policy.count_bucket + 1, 1)
    if max(low, total_low) > min(high, num_samples):
        return [
            problem(
                where,
                f"the class counts stand for {low} to {high} samples in all, num_samples "
                f"{num_samples} for {total_low} to {num_samples}: they cannot both hold",
            )
        ]
    return []


def dp_problems(signals: Mapping[str, Any], policy: SignalPolicy) -> list[Problem]:
    """What the Gaussian mechanism forbids in an update's ``signals`` (its metadata's): the
    spread and the error counts, which it does not send, and a per-class loss above the clip
    bound (the site clamps its noised means to [0, B]). Empty when the mechanism is off. The
    noise itself cannot be checked."""
    if not policy.dp_active:
        return []
    found = [
        problem(
            ["metadata", "signals", name],
            "not sent under the federation's Gaussian mechanism (dp_noise_multiplier)",
        )
        for name in WITHHELD_UNDER_DP
        if signals.get(name) is not None
    ]
    bound = policy.dp_clip_loss
    for c, value in enumerate(signals.get("per_class_loss") or []):
        if value is not None and bound is not None and value > bound:
            found.append(
                problem(
                    ["metadata", "signals", "per_class_loss", c],
                    f"above the federation's dp_clip_loss {bound}",
                )
            )
    return found
