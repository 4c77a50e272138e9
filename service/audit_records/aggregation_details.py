"""An aggregation's ``details`` in a stored audit, typed: what the rule applied reports of itself.

Each rule sets its own keys (docs/algorithms.md, "Aggregation"): DaAgg the distances and the
nearest clean client, Fed-NCL's layer-wise rule its penalty, the trimmed mean how much it
trimmed, the reliability-weighted FedAvg the noisy probabilities; an anchor-led round adds
``anchor_led``. As in the detections, every field is optional and absent where the stored
record lacks it, a null stays null and an unknown key is kept.
"""

from __future__ import annotations

from pydantic import MISSING

from service.audit_records.stored_record import StoredRecord, stored_key

__all__ = ["AggregationDetails", "AnchorLead"]


class AnchorLead(StoredRecord):
    """The anchors led this round's aggregate (docs/algorithms.md, "Anchor-led aggregation")."""

    round: int | MISSING = stored_key("Which round of the lead this is (1: the first)")
    sites: int | MISSING = stored_key(
        "The sites aggregated: the anchors and the sites they vouch for"
    )


class AggregationDetails(StoredRecord):
    """What the rule applied reports of itself; each field names the rule that sets it."""

    variant: str | MISSING = stored_key(
        "daagg: how the distances were computed (paper or per_tensor)"
    )
    noisy: list[bool] | MISSING = stored_key("daagg: the clients it treated as noisy")
    nearest_clean: dict[str, int] | MISSING = stored_key(
        "daagg: each noisy client's position -> its nearest clean client's position"
    )
    note: str | None | MISSING = stored_key("daagg: why the weights equal FedAvg's, where they do")
    distances: list[float] | MISSING = stored_key(
        "daagg: d, each noisy client's distance to its nearest clean one (0 for a clean one)"
    )
    normalised_distances: list[float] | MISSING = stored_key("daagg: D = d / max d")
    penalty: list[float] | MISSING = stored_key(
        "fedncl_layerwise: m_k, the divisor of each client's weight (1: not noisy)"
    )
    T: int | MISSING = stored_key("fedncl_layerwise: the round, from 1")
    tau: float | MISSING = stored_key("fedncl_layerwise: the penalty's cap")
    t_k: int | MISSING = stored_key("fedncl_layerwise: the round the penalty reaches its cap")
    trim_fraction: float | MISSING = stored_key("trimmed_mean: the fraction trimmed from each side")
    trimmed_per_side: int | MISSING = stored_key(
        "trimmed_mean: values trimmed per side and coordinate"
    )
    kept_per_coordinate: int | MISSING = stored_key("trimmed_mean: values averaged per coordinate")
    weights_note: str | MISSING = stored_key("median, trimmed_mean: what the reported weights mean")
    noisy_probability: list[float] | MISSING = stored_key(
        "reliability_weighted: each client's noisy probability, which lowers its weight"
    )
    anchor_led: AnchorLead | MISSING = stored_key("The anchors led the aggregate this round")
