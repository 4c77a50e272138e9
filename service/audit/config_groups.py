"""The audit configuration's parameters grouped by concern, one frozen dataclass per group.

:class:`~service.audit.audit_config.AuditConfig` holds one of each: :class:`FedNoRoSettings`
(``config.fednoro``), :class:`EvidenceSettings` (``config.evidence``), :class:`FedNCLSettings`
(``config.fedncl``), :class:`FedRNSettings` (``config.fedrn``), :class:`AggregationSettings`
(``config.aggregation_settings``) and :class:`StatusRule` (``config.status``). Each group checks
its own values when it is built; the checks that span groups (which detectors, which primary,
which aggregation rule) stay in ``AuditConfig``.

Outside Python the configuration stays flat: the API's ``audit`` object, the stored
configuration and the simulator's ``--audit KEY=VALUE`` name each parameter by its flat key
(``evidence_q``, ``status_m``, ...; :data:`~service.audit.audit_config.FLAT_KEYS` maps each to
its group and field). Error messages name that flat key, which is what a user wrote.

Defaults come from the papers (docs/algorithms.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from service.audit._validation import (
    InvalidParameterError,
    check_bool,
    check_choice,
    check_float,
    check_int,
)
from service.audit.aggregators.weight_cap import DEFAULT_MAX_CLIENT_WEIGHT_FACTOR
from service.audit.anchor_mode import ANCHOR_LEAD_ONLY_ROUNDS, ANCHORED_MIN_ERROR_EXCESS
from service.audit.detectors.fednoro import SEPARATION_GROUPS, SEPARATION_STATISTICS
from service.audit.evidence import EvidenceDetector

__all__ = [
    "AGGREGATION_FLAGS",
    "AggregationSettings",
    "EvidenceSettings",
    "FedNCLSettings",
    "FedNoRoSettings",
    "FedRNSettings",
    "GeometrySettings",
    "StatusRule",
]

AGGREGATION_FLAGS = ("status", "round")
"""What decides the aggregation's noisy set (:attr:`AggregationSettings.flags`)."""


def _set(obj: object, name: str, value: object) -> None:
    """Store a checked (normalised) value on a frozen dataclass during ``__post_init__``."""
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class FedNoRoSettings:
    """FedNoRo's mixture detector (flat keys ``fednoro_*``).

    The per-class loss mixture of Wu et al., "FedNoRo: Towards Noise-Robust Federated Learning
    by Addressing Class Imbalance and Label Noise Heterogeneity", IJCAI 2023, section 4.1,
    eq. 2-3, with its separation guard
    (:class:`~service.audit.detectors.fednoro.FedNoRoDetector`).

    Attributes
    ----------
    random_states : tuple of int
        Seeds of the mixture's fits (nine by default), each in [0, 2**32 - 1].
    require_separation : bool
        Flag only when the noisy and clean groups are separated (the guard).
    separation_threshold : float
        The guard's fixed threshold on the separation statistic (>= 0).
    separation_quantile : float or None
        The guard's calibrated level, in (0, 1); None: the fixed threshold only.
    separation_statistic : str
        ``"class_z"`` or ``"mean_loss"``: what the guard measures.
    min_clients : int
        Fewest clients the mixture is fitted on (>= 2); fewer: undetermined.
    confirmed_groups : bool
        True (default): when FedNoRo is the primary detector, the clients whose status before
        the round is "noisy" (from the :class:`~service.audit.round_inputs.StatusHistory` given
        to :func:`~service.audit.pipeline.run_audit`) are its ``confirmed`` clients, and a vote
        whose noisy group lies within them needs only ``separation_threshold``, not the
        calibrated quantile
        (:meth:`~service.audit.detectors.fednoro.FedNoRoDetector.fit`). False: the quantile
        every round.
    separation_groups : str
        ``"all_fits"`` (default): the separation guard judges every distinct noisy set the
        mixture's fits propose, each at the quantile corrected for their number (Bonferroni),
        and flags the first that passes, most votes first; ``"majority"``: only the noisy set
        most fits agree on (the reference's vote). ``"all_fits"`` needs
        ``separation_quantile`` when ``require_separation`` is set.
    """

    random_states: tuple[int, ...] = tuple(range(9))
    require_separation: bool = True
    separation_threshold: float = 2.0
    separation_quantile: float | None = 0.99
    separation_statistic: str = "class_z"
    min_clients: int = 4
    confirmed_groups: bool = True
    separation_groups: str = "all_fits"

    def __post_init__(self) -> None:
        """Check every value; the seeds become a tuple of ints, the numbers floats."""
        seeds = self.random_states
        if isinstance(seeds, str) or not isinstance(seeds, Sequence) or len(seeds) == 0:
            raise InvalidParameterError(
                "fednoro_random_states: expected a non-empty sequence of ints"
            )
        checked = (
            check_int(f"fednoro_random_states[{i}]", s, min_value=0, max_value=2**32 - 1)
            for i, s in enumerate(seeds)
        )
        _set(self, "random_states", tuple(checked))
        check_bool("fednoro_require_separation", self.require_separation)
        check_bool("fednoro_confirmed_groups", self.confirmed_groups)
        if self.separation_quantile is not None:
            quantile = check_float(
                "fednoro_separation_quantile",
                self.separation_quantile,
                min_value=0.0,
                max_value=1.0,
                min_inclusive=False,
                max_inclusive=False,
            )
            _set(self, "separation_quantile", quantile)
        check_choice(
            "fednoro_separation_statistic", self.separation_statistic, SEPARATION_STATISTICS
        )
        check_choice("fednoro_separation_groups", self.separation_groups, SEPARATION_GROUPS)
        if (
            self.separation_groups == "all_fits"
            and self.require_separation
            and self.separation_quantile is None
        ):
            raise InvalidParameterError(
                "fednoro_separation_groups: 'all_fits' needs fednoro_separation_quantile (the "
                "levels of the groups judged are corrected for their number); set "
                "fednoro_separation_groups to 'majority' for the fixed-threshold guard (the fits' "
                "majority vote only: docs/algorithms.md, FedNoRo)"
            )
        threshold = check_float(
            "fednoro_separation_threshold", self.separation_threshold, min_value=0.0
        )
        _set(self, "separation_threshold", threshold)
        check_int("fednoro_min_clients", self.min_clients, min_value=2)


@dataclass(frozen=True)
class EvidenceSettings:
    """The calibrated evidence detector (flat keys ``evidence_*``).

    A per-site test with a stated false-alarm rate, abstention when the consensus is suspect,
    and trust anchors (:class:`~service.audit.evidence.EvidenceDetector`, which documents each
    parameter under the same name and checks them: a group is valid when that detector can be
    built from it, and its error messages name the detector's parameter).

    Attributes
    ----------
    q : float
        Benjamini-Hochberg level per round, in (0, 0.5].
    min_clients : int
        Fewer reporting sites: inconclusive (>= 2).
    min_informativeness : float
        1 - L / H the median site must reach, in [-1, 1].
    max_flagged_fraction : float
        Flagging this fraction of the sites or of the samples, or more, is inconclusive, in
        (0, 1].
    max_heterogeneity : float
        The sites' disagreement beyond sampling error (I^2) above which the consensus is
        inconclusive, in [0, 1].
    min_class_count : int
        Samples a site must hold of a class for that class alone to flag it (>= 1).
    mixture_check : bool
        Abstain when FedNoRo's loss mixture splits off a higher-loss group that is not a clear
        minority (the ``fednoro`` detector runs first).
    accuracy_check : bool
        Also flag the sites whose accuracy on their own labels is significantly and at least
        ``min_accuracy_gap`` below the others' (:mod:`service.audit.accuracy_evidence`; the
        sites must send ``train_accuracy``).
    min_accuracy_gap : float
        The accuracy test's practical-significance floor, in [0, 1].
    error_check : bool
        Combine the loss evidence with the error-count evidence
        (:mod:`service.audit.error_evidence`).
    min_error_excess : float
        The error-count test's practical-significance floor, in [0, 1].
    min_error_sites : int
        Sites a round needs for the error counts to enter (>= 3).
    min_error_dispersion : float
        The error counts' dispersion floor below 10 sites (and phi in anchored mode), in [0, 1].
    anchored_min_error_excess : float
        The error counts' floor above the anchors' rate in anchored mode, in [0, 1]
        (:mod:`service.audit.anchor_mode`).
    """

    q: float = 0.01
    min_clients: int = 5
    min_informativeness: float = 0.05
    max_flagged_fraction: float = 0.5
    max_heterogeneity: float = 0.9
    min_class_count: int = 5
    mixture_check: bool = True
    accuracy_check: bool = False
    min_accuracy_gap: float = 0.25
    error_check: bool = True
    min_error_excess: float = 0.05
    min_error_sites: int = 5
    min_error_dispersion: float = 0.5
    anchored_min_error_excess: float = ANCHORED_MIN_ERROR_EXCESS

    def __post_init__(self) -> None:
        """Build the detector once: it checks its own parameters (the values stay as given)."""
        EvidenceDetector(**asdict(self))


@dataclass(frozen=True)
class GeometrySettings:
    """The update-geometry evidence added to the evidence detector's verdict (``geometry_*``;
    :mod:`service.audit.geometry_evidence`).

    Attributes
    ----------
    check : bool
        Compute the leave-one-out cosines of the updates and add the sites far below their
        peers' to the evidence detector's flags (consensus mode), and carry those flags.
    min_z : float
        The floor on the cosine's robust z (> 0).
    min_sites : int
        Peers a site needs to be judged (>= 5; ``geometry_evidence.peer_groups``).
    min_homogeneity_p : float
        A site's class-mix chi-square p-value below which it is not judged, in [0, 1).
    """

    check: bool = True
    min_z: float = 10.0
    min_sites: int = 8
    min_homogeneity_p: float = 0.01

    def __post_init__(self) -> None:
        """Check the values."""
        check_bool("geometry_check", self.check)
        check_float("geometry_min_z", self.min_z, min_value=0.0, min_inclusive=False)
        check_int("geometry_min_sites", self.min_sites, min_value=5)
        check_float(
            "geometry_min_homogeneity_p",
            self.min_homogeneity_p,
            min_value=0.0,
            max_value=1.0,
            max_inclusive=False,
        )


@dataclass(frozen=True)
class FedNCLSettings:
    """Fed-NCL's detector, its layer-wise aggregation and its label correction (``fedncl_*``).

    Tam et al., "Federated Noisy Client Learning": the detector's score and sigma rule
    (section V-A, eq. 7-10; :class:`~service.audit.detectors.fedncl.FedNCLDetector`), the
    noisy-client penalty of the layer-wise aggregation (section V-B, eq. 12-16;
    :mod:`service.audit.aggregators.fedncl_layerwise`) and the label-correction candidates
    (eq. 17; :func:`~service.audit.detectors.fedncl.correction_candidates`).

    Attributes
    ----------
    beta : float
        The sigma rule's multiplier: flagged above mean + beta * sigma (>= 0).
    two_sided : bool
        Also flag scores below mean - beta * sigma.
    divergence_variant : str
        ``"paper"`` or ``"reference"``
        (:func:`~service.audit.detectors.fedncl.fedncl_divergences`).
    loss_mode : str
        ``"sum"`` or ``"mean"``: how the score combines a client's losses.
    min_clients : int
        Fewest clients the rule is applied to (>= 2); fewer: undetermined.
    tau : float
        Maximum layer-wise penalty (tau, 50; >= 1).
    t_corr : int
        T_corr (60 of the paper's 150 rounds; scale it with
        :func:`~service.audit.schedules.scale_rounds`; >= 1).
    t_k : int or None
        Rounds for the penalty to reach tau; None = ``t_corr`` (eq. 14).
    alpha : float
        Persistence fraction for label-correction candidates (eq. 17), in [0, 1].
    """

    beta: float = 1.0
    two_sided: bool = False
    divergence_variant: str = "paper"
    loss_mode: str = "sum"
    min_clients: int = 3
    tau: float = 50.0
    t_corr: int = 60
    t_k: int | None = None
    alpha: float = 0.6

    def __post_init__(self) -> None:
        """Check every value; the bounded numbers become floats."""
        _set(self, "beta", check_float("fedncl_beta", self.beta, min_value=0.0))
        _set(self, "tau", check_float("fedncl_tau", self.tau, min_value=1.0))
        _set(self, "alpha", check_float("fedncl_alpha", self.alpha, min_value=0.0, max_value=1.0))
        check_bool("fedncl_two_sided", self.two_sided)
        check_choice("fedncl_divergence_variant", self.divergence_variant, ("paper", "reference"))
        check_choice("fedncl_loss_mode", self.loss_mode, ("sum", "mean"))
        check_int("fedncl_min_clients", self.min_clients, min_value=2)
        check_int("fedncl_t_corr", self.t_corr, min_value=1)
        if self.t_k is not None:
            check_int("fedncl_t_k", self.t_k, min_value=1)


@dataclass(frozen=True)
class FedRNSettings:
    """FedRN's k-reliable neighbors (flat keys ``fedrn_*`` and ``neighbor_chunk_size``).

    Kim et al., CIKM 2022, section 4.1, eq. 3-7
    (:func:`~service.audit.reliability.k_reliable_neighbors`).

    Attributes
    ----------
    k : int
        Neighbors per client (>= 1).
    alpha : float
        Weight of the expertise against the similarity in the reliability score (eq. 3), in
        [0, 1].
    similarity : str
        ``"softmax"`` (the paper's eq. 5) or ``"logit"`` (the reference code): what the
        probes compare.
    chunk_size : int or None
        Flat key ``neighbor_chunk_size``. None: automatic (exact K x K search up to
        ``EXACT_NEIGHBOR_LIMIT`` candidates, chunks of ``AUTO_NEIGHBOR_CHUNK_ENTRIES // K``
        rows beyond); an int: always chunked (memory ``chunk x K``). Both give identical
        neighbors.
    """

    k: int = 2
    alpha: float = 0.6
    similarity: str = "softmax"
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        """Check every value; ``alpha`` becomes a float."""
        _set(self, "alpha", check_float("fedrn_alpha", self.alpha, min_value=0.0, max_value=1.0))
        check_int("fedrn_k", self.k, min_value=1)
        check_choice("fedrn_similarity", self.similarity, ("softmax", "logit"))
        if self.chunk_size is not None:
            check_int("neighbor_chunk_size", self.chunk_size, min_value=1)


@dataclass(frozen=True)
class AggregationSettings:
    """The aggregation rule's parameters and what every rule shares.

    The rule itself is :attr:`AuditConfig.aggregation
    <service.audit.audit_config.AuditConfig.aggregation>`; Fed-NCL's layer-wise penalty is in
    :class:`FedNCLSettings`.

    Attributes
    ----------
    daagg_variant : str
        Flat key ``daagg_variant``: ``"paper"`` or ``"reference"`` distance for DaAgg (Wu et
        al., IJCAI 2023, eq. 6-7; :mod:`service.audit.aggregators.daagg`).
    trim_fraction : float
        Flat key ``trim_fraction``: the trimmed mean's fraction trimmed per side (Yin et al.
        2018), in [0, 0.5).
    flags : str
        Flat key ``aggregation_flags``: which clients the noisy-set rules (``daagg``,
        ``fedncl_layerwise``) treat as noisy. ``"status"`` (default): those whose status after
        this round is "noisy" (the :class:`StatusRule` applied to the
        :class:`~service.audit.round_inputs.StatusHistory` given to
        :func:`~service.audit.pipeline.run_audit` plus this round's flag), the same status
        that decides the clients' training roles, so one chance flag does not down-weight a
        client. ``"round"``: this round's primary flags as they are (as the papers write it).
        Either way an admin's pin wins. ``reliability_weighted`` reads the round's
        probabilities in both modes.
    max_client_weight_factor : float or None
        Flat key ``max_client_weight_factor``. Bounded influence (beyond the papers): no
        client's aggregation weight exceeds min(1, f / K) for the K clients of the round (f =
        4.0 by default: nothing changes up to 4 clients; >= 1); the excess goes to the others
        by water-filling (:func:`~service.audit.aggregators.weight_cap.cap_weights`). None: no
        cap.
    anchor_lead : bool
        Flat key ``anchor_lead`` (default true): once the evidence detector has taken the trust
        anchors as its reference after the warm-up, the aggregate is FedAvg over the anchors
        (and later the sites the anchored audit clears) instead of the rule
        (:mod:`service.audit.anchor_mode`). No effect without anchors.
    anchor_lead_only_rounds : int
        Flat key ``anchor_lead_only_rounds`` (default 2, >= 0): anchor-led rounds aggregated
        from the anchors alone before cleared sites join.
    """

    daagg_variant: str = "paper"
    trim_fraction: float = 0.1
    flags: str = "status"
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR
    anchor_lead: bool = True
    anchor_lead_only_rounds: int = ANCHOR_LEAD_ONLY_ROUNDS

    def __post_init__(self) -> None:
        """Check every value; the numbers become floats."""
        trim = check_float(
            "trim_fraction",
            self.trim_fraction,
            min_value=0.0,
            max_value=0.5,
            max_inclusive=False,
        )
        _set(self, "trim_fraction", trim)
        check_choice("daagg_variant", self.daagg_variant, ("paper", "reference"))
        check_choice("aggregation_flags", self.flags, AGGREGATION_FLAGS)
        check_bool("anchor_lead", self.anchor_lead)
        check_int("anchor_lead_only_rounds", self.anchor_lead_only_rounds, min_value=0)
        if self.max_client_weight_factor is not None:
            factor = check_float(
                "max_client_weight_factor", self.max_client_weight_factor, min_value=1.0
            )
            _set(self, "max_client_weight_factor", factor)


@dataclass(frozen=True)
class StatusRule:
    """The history rule that turns flags into a status (flat keys ``status_m``, ``status_w``).

    A client is "noisy" after ``m`` flags in its last ``w`` determined rounds, "trusted" again
    after ``w`` clean rounds in a row (:func:`~service.audit.detection.next_status`). The status
    decides the clients' training roles and, with ``aggregation_flags="status"``, the
    aggregation's noisy set.

    Attributes
    ----------
    m : int
        Flags that make a client noisy, in [1, w].
    w : int
        The window of determined rounds (>= 1).
    """

    m: int = 2
    w: int = 3

    def __post_init__(self) -> None:
        """Check both values."""
        window = check_int("status_w", self.w, min_value=1)
        check_int("status_m", self.m, min_value=1, max_value=window)
