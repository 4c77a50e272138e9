"""Forward a Flower federation's training rounds to a running fedaudit coordinator.

``FedAuditStrategy(FedAvg(), coordinator=CoordinatorConnection(url, admin_token))`` audits every
round on a fedaudit coordinator instead of in the ServerApp's process. It speaks the
coordinator's HTTP API through the SDK only (``client_sdk.AdminClient`` for the operator's calls,
one ``client_sdk.FederationClient`` per Flower node for the site's calls); the audit is the
coordinator's, so the round appears in its report, dashboard, event trail and metrics, and an
operator's pins and trust anchors on the coordinator apply.

At the first training round :class:`CoordinatorAuditor`:

1. creates a federation named ``CoordinatorConnection.federation_name``: as many classes as the
   replies' ``class_counts``, the strategy's ``AuditConfig`` as its audit, the strategy's
   signal privacy policy (``privacy=``) as its ``config.privacy``, no warm-up (as in process),
   ``min_clients`` 1 and a deadline of 7 days (the longest a plan takes): the strategy closes
   each round itself, with the nodes that replied;
2. uploads the global model sent this round (the ``ArrayRecord`` as the safetensors file
   ``AdminClient.upload_initial_model`` takes);
3. registers one coordinator client per replying Flower node, named
   ``<client_name_prefix><node id, 20 digits>`` (the coordinator orders a round's sites by name,
   so its order is the in-process order, by node id), keeps their site tokens in memory only,
   and joins each with the ``num_samples`` and ``class_counts`` of its signals; the last join
   opens the coordinator's round 0.

Every training round it then:

4. uploads each replying node's model (its ``ArrayRecord``) and signals as that site's update
   of the coordinator's open round (``FederationClient.submit_update``);
5. closes the round: by itself when every site the coordinator selected sent, otherwise
   explicitly (``AdminClient.close_round``, the reason naming the nodes that did not reply);
6. reads the round back (``AdminClient.get_round``: its typed ``AuditRecord``), downloads the
   coordinator's new global model and reads each site's status (``AdminClient.list_clients``).

The strategy applies the result as in process (the same ``fedaudit.*`` metrics, report rows
and statuses), with one difference, chosen so that the Flower run's global model is always the
one the coordinator audits the next round against: **the coordinator computes each round's
aggregate and opens the next round with it**, so the round's model is the coordinator's
aggregate whether or not the primary detector decided. When it decided, that is the audit's
aggregate, as in process; when it did not, the audit's rule has no noisy set and falls back to
FedAvg over the audited sites (sample-weighted, no site above 4 / K), where the in-process mode
keeps the wrapped strategy's aggregate (the report says ``applied: "coordinator"`` and why). With
a wrapped FedAvg and at most four sites, or sites of similar sizes, the two are the same.

Nodes that appear later or miss a round:

- a node first seen after round 1 is registered and joined when first seen; the coordinator's
  open round was opened before it joined, so its update of that round is left out (of the audit
  and of the round's model, which is the coordinator's); it is audited from the next round on.
  The round's entry lists it under ``coordinator.left_out``;
- a node that misses a round is left out of that round's audit (the round is closed without
  it) and stays registered.

A round whose replies cannot be audited at all (a reply without signals: the same checks as in
process) is not forwarded; the wrapped strategy's aggregate is kept and the coordinator's round
stays open for the next one, which the coordinator then audits against its own last model:
the round's entry says so (``coordinator.global_model_matches`` false). When the coordinator
refuses a request (a wrong token, an update that does not fit the federation, a stopped
federation), the SDK's typed exception (``client_sdk.CoordinatorSDKError`` and its subclasses)
is raised with a note naming the node and the round.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from client_sdk import (
    AdminClient,
    APITimeoutError,
    AuditRecord,
    ClientInfo,
    ConflictError,
    CoordinatorSDKError,
    FederationClient,
    RoundInfo,
)
from client_sdk._responses import SignalPolicy
from fedaudit_flower._records import WireSignals
from fedaudit_flower.auditing import (
    AuditNotRun,
    RoundAudit,
    SiteReply,
    SiteResult,
    SiteStatus,
    array_record,
    numpy_state,
)
from service.audit import DETECTORS, AuditConfig, required_signals

__all__ = [
    "CoordinatorAuditor",
    "CoordinatorConnection",
    "arrays_from_safetensors",
    "implied_input_shape",
    "safetensors_bytes",
]

MAX_PLAN_ROUNDS = 100_000
"""The most rounds a coordinator's plan takes."""
MAX_DEADLINE_S = 7 * 24 * 3600.0
"""The longest round deadline a coordinator's plan takes."""


@dataclass(frozen=True)
class CoordinatorConnection:
    """Where and how :class:`~fedaudit_flower.FedAuditStrategy` forwards its rounds.

    Parameters
    ----------
    url : str
        The coordinator's base URL: ``http://127.0.0.1:8000`` on loopback (README's quickstart),
        ``https://...`` for one served with ``--tls-cert``/``--tls-key`` or behind a TLS proxy.
    admin_token : str
        The coordinator's admin token (it creates the federation and registers the sites).
    federation_name : str
        The name of the federation created at the first round.
    rounds : int, optional
        The federation's planned rounds; None: ``num_rounds`` of ``FedAuditStrategy.start``,
        or 100 000 (the most a plan takes) when ``aggregate_train`` is called without it.
    input_shape : tuple of int, optional
        The task's input shape as the coordinator shows it and checks the initial model against
        (Flower sites do not use it); None (default): the one the model's first weight takes
        (:func:`implied_input_shape`).
    client_name_prefix : str
        Each node's coordinator client is this prefix and its node id (20 digits).
    close_timeout_s : float
        How long to wait for the coordinator to close a round (its audit and aggregation).
    poll_interval_s : float
        How often to ask whether the round has closed.
    sdk_options : mapping
        Keyword arguments of the SDK's clients (``timeout``, ``max_retries``, ``ca_file``,
        ``client_cert``).
    """

    url: str
    admin_token: str = field(repr=False)
    federation_name: str = "flower"
    rounds: int | None = None
    input_shape: tuple[int, ...] | None = None
    client_name_prefix: str = "flower-node-"
    close_timeout_s: float = 600.0
    poll_interval_s: float = 0.1
    sdk_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check the values (``ValueError`` naming the field)."""
        if not self.url:
            raise ValueError("url: the coordinator's base URL is required")
        if not self.admin_token:
            raise ValueError("admin_token: the coordinator's admin token is required")
        if self.rounds is not None and not 1 <= self.rounds <= MAX_PLAN_ROUNDS:
            raise ValueError(f"rounds: expected 1 to {MAX_PLAN_ROUNDS}, got {self.rounds}")
        if self.close_timeout_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError("close_timeout_s and poll_interval_s must be > 0")

    def client_name(self, node_id: int) -> str:
        """The coordinator client of Flower node ``node_id`` (names sort as node ids do)."""
        return f"{self.client_name_prefix}{node_id:020d}"


def safetensors_bytes(arrays: ArrayRecord) -> bytes:
    """An ``ArrayRecord`` as the safetensors file the coordinator takes (names, dtypes kept)."""
    state = numpy_state(arrays)
    return save_safetensors({name: np.require(a, requirements="C") for name, a in state.items()})


def implied_input_shape(arrays: ArrayRecord) -> tuple[int, ...]:
    """The input shape the model's first weight takes, for a federation's task: a first matrix
    (a linear layer, ``[out, in]``) takes ``(in,)``; a first convolution (``[out, in, k...]``)
    ``(in, k...)`` (the spatial size is not in the weights: the kernel's is the smallest that
    fits); vectors before it are skipped; ``(1,)`` without a float array of 2 or more axes."""
    for array in numpy_state(arrays).values():
        if array.dtype.kind != "f" or array.ndim < 2:
            continue  # counters, biases, normalisation vectors
        if array.ndim == 2:
            return (int(array.shape[1]),)
        return tuple(int(d) for d in array.shape[1:])
    return (1,)


def arrays_from_safetensors(data: bytes, order: Iterable[str] = ()) -> ArrayRecord:
    """Safetensors bytes as an ``ArrayRecord``: the names of ``order`` first, in that order."""
    state = load_safetensors(data)
    names = [n for n in order if n in state] + sorted(set(state) - set(order))
    return array_record({name: state[name] for name in names})


def signals_json(signals: WireSignals) -> dict[str, Any]:
    """The signals as an update's ``signals`` (the coordinator's ``UpdateSignals``)."""
    values = {f.name: getattr(signals, f.name) for f in fields(signals) if f.name != "num_samples"}
    return {name: value for name, value in values.items() if value is not None}


class CoordinatorAuditor:
    """The forwarding backend of :class:`~fedaudit_flower.FedAuditStrategy` (module docstring).

    Parameters
    ----------
    connection : CoordinatorConnection
    audit_config : service.audit.AuditConfig
        The federation's audit (its detectors, aggregation and status rule).
    privacy : client_sdk.SignalPolicy, optional
        The signal privacy policy the federation is created with (its ``config.privacy``): the
        coordinator checks the joins and updates against it and reads them under it in its
        audit. None: no policy.

    Attributes
    ----------
    federation_id : uuid.UUID or None
        The coordinator's federation, once created.
    planned_rounds : int or None
        ``num_rounds`` of ``FedAuditStrategy.start`` (the plan when ``rounds`` is not set).
    """

    keeps_wrapped_when_undecided = False

    def __init__(
        self,
        connection: CoordinatorConnection,
        audit_config: AuditConfig,
        privacy: SignalPolicy | None = None,
    ) -> None:
        self.connection = connection
        self.audit_config = audit_config
        self.privacy = privacy
        self.federation_id: uuid.UUID | None = None
        self.planned_rounds: int | None = None
        self._client_ids: dict[int, uuid.UUID] = {}
        self._tokens: dict[int, str] = {}
        self._statuses: dict[int, SiteStatus] = {}
        self._admin: AdminClient | None = None
        self._sites: dict[int, FederationClient] = {}

    # -- HTTP clients ---------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        """The operator's client (opened when first needed)."""
        if self._admin is None:
            options = dict(self.connection.sdk_options)
            self._admin = AdminClient(self.connection.url, self.connection.admin_token, **options)
        return self._admin

    def _site(self, node_id: int) -> FederationClient:
        if node_id not in self._sites:
            options = dict(self.connection.sdk_options)
            self._sites[node_id] = FederationClient(
                self.connection.url, self._tokens[node_id], **options
            )
        return self._sites[node_id]

    def close(self) -> None:
        """Close the HTTP clients (the site tokens stay in memory; clients reopen when needed)."""
        for client in [self._admin, *self._sites.values()]:
            if client is not None:
                client.close()
        self._admin = None
        self._sites = {}

    # -- the round ------------------------------------------------------------------------------

    def audit_round(
        self, server_round: int, global_arrays: ArrayRecord, sites: Sequence[SiteReply]
    ) -> RoundAudit:
        """Forward the round's replies, close the coordinator's round, read its audit back."""
        if self.federation_id is None:
            self._create_federation(global_arrays, sites)
        else:
            self._register([s for s in sites if s.node_id not in self._tokens])
        opened = self._open_round()
        sent, left_out = self._forward(server_round, opened, sites)
        closed = self._close(server_round, opened, sent)
        audit = self._read(closed, global_arrays, sent)
        details = audit.details["coordinator"]
        details["left_out"] = left_out
        details["global_model_matches"] = self._model_sha256(closed.model_in_id) == (
            hashlib.sha256(safetensors_bytes(global_arrays)).hexdigest()
        )
        return audit

    def _federation_spec(
        self, sites: Sequence[SiteReply], global_arrays: ArrayRecord
    ) -> dict[str, Any]:
        """The federation: the replies' classes, the strategy's audit and privacy policy, no
        warm-up."""
        config = self.audit_config
        sent = set.intersection(*(set(signals_json(s.signals)) for s in sites))
        detectors = (
            list(config.detectors)
            if config.detectors is not None
            else [
                name
                for name in DETECTORS
                if name == config.primary_detector or required_signals([name], config) <= sent
            ]
        )
        probe = sites[0].signals.probe_softmax
        rounds = self.connection.rounds or self.planned_rounds or MAX_PLAN_ROUNDS
        return {
            "name": self.connection.federation_name,
            "task": {
                "num_classes": len(sites[0].signals.class_counts),
                "input_shape": list(
                    self.connection.input_shape or implied_input_shape(global_arrays)
                ),
            },
            "plan": {"rounds": rounds, "min_clients": 1, "round_deadline_s": MAX_DEADLINE_S},
            "config": {
                "method": "fedavg",
                "aggregation": config.aggregation,
                "primary_detector": config.primary_detector,
                "detectors": detectors,
                "warmup_rounds": 0,
                # Flower picks the nodes; forwarded sites never poll, so none may become absent
                "absent_after_missed": 0,
                "audit": config.to_json(),
                **({"probe_size": len(probe)} if probe else {}),
                **({"privacy": self.privacy.model_dump()} if self.privacy is not None else {}),
            },
        }

    def _create_federation(self, global_arrays: ArrayRecord, sites: Sequence[SiteReply]) -> None:
        """Create the federation, upload the model, register and join the sites; on a refusal
        nothing is kept here (the next round starts a new federation)."""
        admin = self.admin()
        federation = admin.create_federation(self._federation_spec(sites, global_arrays))
        self.federation_id = federation.id
        try:
            admin.upload_initial_model(federation.id, safetensors_bytes(global_arrays))
            self._register(sites)  # the last join opens round 0
        except BaseException:
            self.federation_id = None
            self._client_ids, self._tokens = {}, {}
            self.close()
            raise

    def _register(self, sites: Sequence[SiteReply]) -> None:
        """Register every node first, then join each: the last join of the first round's
        roster opens round 0 with all of them (a node joined later waits for the next round)."""
        admin = self.admin()
        assert self.federation_id is not None
        for site in sites:
            created = admin.add_client(
                self.federation_id, self.connection.client_name(site.node_id)
            )
            self._client_ids[site.node_id] = created.id
            self._tokens[site.node_id] = created.token
        for site in sites:
            self._site(site.node_id).join(
                self.federation_id,
                num_samples=site.signals.num_samples,
                class_counts=list(site.signals.class_counts),
            )

    def _open_round(self) -> RoundInfo:
        """The coordinator's open round (AuditNotRun when its federation has none)."""
        admin = self.admin()
        assert self.federation_id is not None
        federation = admin.get_federation(self.federation_id)
        if federation.status in ("finished", "failed", "stopped"):
            why = f": {federation.status_reason}" if federation.status_reason else ""
            raise AuditNotRun(
                f"the coordinator's federation {federation.name!r} has {federation.status}"
                f" after {federation.rounds_started} rounds{why}"
            )
        index = max(federation.rounds_started - 1, 0)
        opened = admin.get_round(self.federation_id, index)
        if opened.state != "open":
            raise AuditNotRun(f"the coordinator's round {index} is {opened.state}, not open")
        return opened

    def _forward(
        self, server_round: int, opened: RoundInfo, sites: Sequence[SiteReply]
    ) -> tuple[list[SiteReply], list[dict[str, Any]]]:
        """Upload each selected node's update; the others are left out (and said why)."""
        assert self.federation_id is not None
        selected = set(opened.selected_clients)
        sent: list[SiteReply] = []
        left_out: list[dict[str, Any]] = []
        for site in sites:
            if self._client_ids[site.node_id] not in selected:
                left_out.append(
                    {
                        "node_id": site.node_id,
                        "why": f"joined after the coordinator's round {opened.index} opened; "
                        "audited from the next round",
                    }
                )
                continue
            try:
                self._site(site.node_id).submit_update(
                    self.federation_id,
                    opened.index,
                    state=safetensors_bytes(site.arrays),
                    num_samples=site.signals.num_samples,
                    signals=signals_json(site.signals),
                    idempotency_key=f"flower-round-{server_round}",
                )
            except CoordinatorSDKError as exc:
                exc.add_note(
                    f"fedaudit_flower: the update of node {site.node_id} (Flower round "
                    f"{server_round}, coordinator round {opened.index})"
                )
                raise
            sent.append(site)
        if not sent:
            raise AuditNotRun(f"no reply could be forwarded: {left_out}")
        return sent, left_out

    def _close(self, server_round: int, opened: RoundInfo, sent: Sequence[SiteReply]) -> RoundInfo:
        """Close the round explicitly when a selected node did not reply; wait until closed."""
        admin = self.admin()
        assert self.federation_id is not None
        node_of = {client_id: node for node, client_id in self._client_ids.items()}
        sent_ids = {self._client_ids[s.node_id] for s in sent}
        missing = sorted(node_of[c] for c in set(opened.selected_clients) - sent_ids)
        if missing:
            reason = f"Flower round {server_round}: node(s) {missing} did not reply"
            try:
                return admin.close_round(self.federation_id, opened.index, reason)
            except (ConflictError, APITimeoutError):
                pass  # closed meanwhile, or still closing when the request timed out: wait
        deadline = time.monotonic() + self.connection.close_timeout_s
        while True:
            info = admin.get_round(self.federation_id, opened.index)
            if info.state == "closed":
                return info
            if info.state not in ("open", "aggregating"):
                raise AuditNotRun(
                    f"the coordinator's round {opened.index} is {info.state}: {info.state_reason}"
                )
            if time.monotonic() > deadline:
                raise AuditNotRun(
                    f"the coordinator did not close round {opened.index} within "
                    f"{self.connection.close_timeout_s:g} s"
                )
            time.sleep(self.connection.poll_interval_s)

    def _model_sha256(self, model_id: uuid.UUID) -> str | None:
        assert self.federation_id is not None
        for model in self.admin().get_json(f"/federations/{self.federation_id}/models"):
            if model["id"] == str(model_id):
                return str(model["sha256"])
        return None

    # -- the audit, read back -------------------------------------------------------------------

    def _read(
        self, closed: RoundInfo, global_arrays: ArrayRecord, sent: Sequence[SiteReply]
    ) -> RoundAudit:
        """The closed round's audit as a RoundAudit, sites in node order."""
        admin = self.admin()
        assert self.federation_id is not None
        assert closed.model_out_id is not None
        record = closed.audit
        if record is None:
            raise AuditNotRun(f"the coordinator's round {closed.index} has no audit")
        model = admin.download_model(closed.model_out_id)
        clients = {c.id: c for c in admin.list_clients(self.federation_id)}
        node_of = {str(client_id): node for node, client_id in self._client_ids.items()}
        samples = {s.node_id: s.signals.num_samples for s in sent}
        sites = [
            self._site_result(record, i, node_of[cid], samples, clients)
            for i, cid in enumerate(record.client_ids)
        ]
        primary = record.detections[record.primary]
        return RoundAudit(
            sites=sorted(sites, key=lambda s: s.node_id),
            detector=primary.method,
            detector_status=primary.status,
            detector_reason=primary.reason,
            rule=record.aggregation.rule,
            aggregate=arrays_from_safetensors(model, global_arrays.keys()),
            audit=record.model_dump(mode="json"),
            details={
                "coordinator": {
                    "federation_id": str(self.federation_id),
                    "round_index": closed.index,
                    "state_reason": closed.state_reason,
                    "model_in_id": str(closed.model_in_id),
                    "model_out_id": str(closed.model_out_id),
                }
            },
        )

    def _site_result(
        self,
        record: AuditRecord,
        i: int,
        node: int,
        samples: Mapping[int, int],
        clients: Mapping[uuid.UUID, ClientInfo],
    ) -> SiteResult:
        """Site ``i`` of the audit: its flag, weight and verdict, and its status on the
        coordinator (a pin wins); its recent flags are kept here as in process."""
        verdict = record.detections[record.primary].verdicts[i]
        flag = record.primary_flags[i]
        weights = record.aggregation.weights
        before = self._statuses.get(node, SiteStatus("trusted"))
        client = clients[self._client_ids[node]]
        recent = before.recent_flags
        if flag is not None:
            recent = (*recent, bool(flag))[-self.audit_config.status.w :]
        after = SiteStatus(client.pinned_status or client.status, recent)
        self._statuses[node] = after
        return SiteResult(
            node_id=node,
            num_samples=samples[node],
            flag=flag,
            status_before=before.status,
            status=after.status,
            weight=float("nan") if weights is None else float(weights[i]),
            score=None if verdict is None else verdict.score,
            verdict=None if verdict is None else verdict.model_dump(mode="json"),
        )

    def statuses(self) -> dict[int, SiteStatus]:
        """Each audited node's status on the coordinator after the latest round."""
        return dict(self._statuses)

    def report_fields(self) -> dict[str, Any]:
        """The coordinator, its federation and each node's coordinator client."""
        return {
            "coordinator": {
                "url": self.connection.url,
                "federation_name": self.connection.federation_name,
                "federation_id": None if self.federation_id is None else str(self.federation_id),
                "clients": {str(n): str(c) for n, c in sorted(self._client_ids.items())},
            }
        }
