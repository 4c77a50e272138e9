"""Every kind of audit-trail event, with what it records.

The one list: ``repositories.add_event`` refuses a kind not in it, the events route accepts only
these as a filter (so a mistyped ``fedaudit events --kind`` is refused with the list instead of
printing nothing), and a test checks that every ``add_event`` call in ``service`` writes one of
them and that each one here is written somewhere. A kind that stops being written stays here:
older databases hold it.
"""

from __future__ import annotations

__all__ = ["EVENT_KINDS", "EVENT_KIND_NAMES"]

EVENT_KINDS: dict[str, str] = {
    "federation.created": "an admin created the federation",
    "model.initial_uploaded": "the initial model was uploaded",
    "model.initial_replaced": "the initial model was replaced before round 0",
    "federation.started": "round 0 opened",
    "federation.stopped": "an admin stopped the federation (the reason in the message)",
    "federation.finished": "the planned rounds are done",
    "federation.pruned": "stored updates were pruned (retention)",
    "client.added": "an admin added a site",
    "client.joined": "a site joined, with its declared counts",
    "client.rejoined": "a site joined again (its counts may have drifted)",
    "client.flagged": "the primary detector flagged a site in a round",
    "client.status_changed": "a site's status changed under the status rule",
    "client.pinned": "an admin pinned a site's status",
    "client.unpinned": "an admin removed a pin",
    "client.anchored": "an admin marked a site as a trust anchor",
    "client.unanchored": "an admin removed a trust-anchor mark",
    "client.suspended": "an admin suspended a site (not selected until resumed)",
    "client.resumed": "an admin resumed a suspended site",
    "client.absent": "a site missed absent_after_missed rounds in a row and is left out",
    "client.returned": "an absent site polled again and can be selected",
    "client.token_rotated": "a site's token was rotated",
    "client.token_revoked": "a site's token was revoked",
    "round.opened": "a round opened (its sites, and those left out)",
    "round.closed": "a round closed (why, updates, aggregation)",
    "round.close_requested": "an admin closed a round before its deadline",
    "round.deadline_extended": "a round had too few updates at its deadline and was extended",
    "round.failed": "a round failed to close (the error in the message)",
    "update.accepted": "a site's update was stored",
    "update.rejected": "a site's update was refused (why in the data)",
    "audit.inconclusive": "the primary detector abstained: the consensus is suspect",
    "audit.undetermined": "the primary detector could not decide (too few sites or signals)",
    "audit.anchor_led": "the aggregate followed the trust anchors",
    "site.error": "a site reported a round it could not do",
    "auth.rejected": "a request with a wrong token was refused",
    "admin.token_rotated": "the admin token was rotated",
}

EVENT_KIND_NAMES: tuple[str, ...] = tuple(EVENT_KINDS)
