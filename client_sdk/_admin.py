"""The operator's HTTP client of the coordinator: `AdminClient` (the admin token).

It shares the transport of `client_sdk._client` (retries with backoff that honours
``Retry-After``, the typed exceptions of `client_sdk._exceptions`); a site uses
`client_sdk._client.FederationClient`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from client_sdk._client import API, _Base
from client_sdk._report_responses import ClientHistory, NoisyClientReport
from client_sdk._responses import (
    ClientCreated,
    ClientInfo,
    Event,
    Federation,
    ModelInfo,
    PruneReport,
    RoundInfo,
)


class AdminClient(_Base):
    """The operator's calls (admin token): federations, clients, models, rounds, events."""

    def __init__(self, base_url: str | None = None, api_token: str | None = None, **kwargs: Any):
        kwargs.setdefault("token_env", "FEDAUDIT_ADMIN_TOKEN")
        super().__init__(base_url, api_token, **kwargs)

    def create_federation(self, spec: Mapping[str, Any]) -> Federation:
        """Create a federation from its spec (name, task, plan, config; the coordinator checks
        it and answers 422 naming the field). ``TypeError`` when ``spec`` is not a mapping."""
        if not isinstance(spec, Mapping):
            raise TypeError(f"spec: expected a mapping (a JSON object), got {type(spec).__name__}")
        response = self._request("POST", f"{API}/federations", json=dict(spec), retry_status=False)
        return Federation.model_validate(response.json())

    def list_federations(self) -> list[Federation]:
        response = self._request("GET", f"{API}/federations")
        return [Federation.model_validate(f) for f in response.json()["items"]]

    def get_federation(self, federation_id: uuid.UUID | str) -> Federation:
        """The federation's record, whatever its status: a failed one (a round could not be
        closed) or a stopped one (by an admin) comes back with ``status="failed"`` or
        ``"stopped"`` and its ``status_reason`` (the admin looks at it; the sites' calls are the
        ones that raise ``FederationFailedError``)."""
        response = self._request("GET", f"{API}/federations/{federation_id}")
        return Federation.model_validate(response.json())

    def upload_initial_model(self, federation_id: uuid.UUID | str, state: bytes) -> ModelInfo:
        response = self._request(
            "PUT",
            f"{API}/federations/{federation_id}/model",
            content=state,
            headers={"Content-Type": "application/octet-stream"},
            retry_status=False,
        )
        return ModelInfo.model_validate(response.json())

    def add_client(self, federation_id: uuid.UUID | str, name: str) -> ClientCreated:
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/clients",
            json={"name": name},
            retry_status=False,
        )
        return ClientCreated.model_validate(response.json())

    def list_clients(self, federation_id: uuid.UUID | str) -> list[ClientInfo]:
        response = self._request("GET", f"{API}/federations/{federation_id}/clients")
        return [ClientInfo.model_validate(c) for c in response.json()]

    def set_anchor(
        self, federation_id: uuid.UUID | str, client_id: uuid.UUID | str, reason: str | None
    ) -> ClientInfo:
        """Mark a site as a trust anchor (its labels are curated; ``reason`` says why), or
        remove the mark with ``reason=None``."""
        path = f"{API}/federations/{federation_id}/clients/{client_id}/anchor"
        if reason is None:
            response = self._request("DELETE", path, retry_status=False)
        else:
            response = self._request("PUT", path, json={"reason": reason}, retry_status=False)
        return ClientInfo.model_validate(response.json())

    def suspend_client(
        self, federation_id: uuid.UUID | str, client_id: uuid.UUID | str, reason: str | None
    ) -> ClientInfo:
        """Suspend a site (``reason`` says why): it is not selected for rounds, and is withdrawn
        from the open round unless its update is stored; ``reason=None`` resumes it."""
        path = f"{API}/federations/{federation_id}/clients/{client_id}/suspend"
        if reason is None:
            response = self._request("DELETE", path, retry_status=False)
        else:
            response = self._request("PUT", path, json={"reason": reason}, retry_status=False)
        return ClientInfo.model_validate(response.json())

    def pin_client(
        self,
        federation_id: uuid.UUID | str,
        client_id: uuid.UUID | str,
        status: str,
        reason: str,
    ) -> ClientInfo:
        """Pin a site's status by hand (``trusted``, ``suspect`` or ``noisy``; ``reason`` goes
        to the event trail): the detectors no longer change it until ``unpin_client``."""
        response = self._request(
            "PUT",
            f"{API}/federations/{federation_id}/clients/{client_id}/pin",
            json={"status": status, "reason": reason},
            retry_status=False,
        )
        return ClientInfo.model_validate(response.json())

    def unpin_client(
        self, federation_id: uuid.UUID | str, client_id: uuid.UUID | str
    ) -> ClientInfo:
        """Remove a site's pin: the detectors decide its status again."""
        response = self._request(
            "DELETE",
            f"{API}/federations/{federation_id}/clients/{client_id}/pin",
            retry_status=False,
        )
        return ClientInfo.model_validate(response.json())

    def rotate_client_token(
        self, federation_id: uuid.UUID | str, client_id: uuid.UUID | str
    ) -> ClientCreated:
        """A new token for the site (in ``.token``, shown once); its old token stops working at
        once. Also gives a revoked site a working token again."""
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/clients/{client_id}/token",
            retry_status=False,
        )
        return ClientCreated.model_validate(response.json())

    def revoke_client_token(
        self, federation_id: uuid.UUID | str, client_id: uuid.UUID | str, reason: str
    ) -> ClientInfo:
        """The site's token stops working until it is rotated (``reason`` goes to the event
        trail)."""
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/clients/{client_id}/token/revoke",
            json={"reason": reason},
            retry_status=False,
        )
        return ClientInfo.model_validate(response.json())

    def rotate_admin_token(self) -> str:
        """A new admin token (returned once). The token this client was made with, and every
        dashboard session, stop working at once: make a new AdminClient with the new token."""
        response = self._request("POST", f"{API}/admin/token", retry_status=False)
        return str(response.json()["token"])

    def end_admin_sessions(self) -> int:
        """End every dashboard session ("log out everywhere"); returns how many were live."""
        response = self._request("DELETE", f"{API}/admin/sessions", retry_status=False)
        return int(response.json()["ended"])

    def stop_federation(self, federation_id: uuid.UUID | str, reason: str) -> Federation:
        """Stop the federation for good; its status becomes ``stopped`` with ``reason``, its open
        round fails, and every site is told why on its next call. 409 (``ConflictError``) when
        it has already finished, failed or stopped."""
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/stop",
            json={"reason": reason},
            retry_status=False,
        )
        return Federation.model_validate(response.json())

    def start_federation(self, federation_id: uuid.UUID | str) -> Federation:
        response = self._request(
            "POST", f"{API}/federations/{federation_id}/start", retry_status=False
        )
        return Federation.model_validate(response.json())

    def list_rounds(
        self, federation_id: uuid.UUID | str, *, page_size: int = 1000
    ) -> list[RoundInfo]:
        """Every round of the federation, oldest first (as many requests as pages)."""
        items = self.get_json_pages(
            f"/federations/{federation_id}/rounds", cursor="offset", page_size=page_size
        )
        return [RoundInfo.model_validate(r) for r in items]

    def get_round(self, federation_id: uuid.UUID | str, index: int) -> RoundInfo:
        response = self._request("GET", f"{API}/federations/{federation_id}/rounds/{index}")
        return RoundInfo.model_validate(response.json())

    def get_report(self, federation_id: uuid.UUID | str) -> NoisyClientReport:
        """The noisy-client report: per client its status, flag history, each detector's latest
        flag and score, and each detector's evidence beside the verdict, per site
        (``latest_detector_evidence``) and per class (``latest_class_evidence``)."""
        response = self._request("GET", f"{API}/federations/{federation_id}/report")
        return NoisyClientReport.model_validate(response.json())

    def get_client_history(
        self, federation_id: uuid.UUID | str, client_id: uuid.UUID | str
    ) -> ClientHistory:
        """Round by round, what the audit said about one client, with each detector's evidence
        per round (``detector_evidence``, ``class_evidence``)."""
        response = self._request(
            "GET", f"{API}/federations/{federation_id}/clients/{client_id}/history"
        )
        return ClientHistory.model_validate(response.json())

    def close_round(self, federation_id: uuid.UUID | str, index: int, reason: str) -> RoundInfo:
        """Close the open round ``index`` now with the updates it has, as its deadline would
        (at least the plan's ``min_clients``; ``reason`` goes to the event trail); answers the
        closed round with its audit. 409 (``ConflictError``) when the round is not open or has
        too few updates."""
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/rounds/{index}/close",
            json={"reason": reason},
            retry_status=False,
        )
        return RoundInfo.model_validate(response.json())

    def prune(
        self,
        federation_id: uuid.UUID | str,
        *,
        keep_rounds: int | None = None,
        dry_run: bool = False,
    ) -> PruneReport:
        """Prune the model updates of the finished rounds older than the last ``keep_rounds``
        (None: the coordinator's ``retention_rounds`` setting): their blobs, probe softmax and
        centroids go; each site's latest update, every global model, the audit results and the
        reports stay. ``dry_run``: answer what would go and change nothing."""
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/prune",
            json={"keep_rounds": keep_rounds, "dry_run": dry_run},
            retry_status=False,
        )
        return PruneReport.model_validate(response.json())

    def list_events(
        self,
        federation_id: uuid.UUID | str,
        *,
        kind: str | None = None,
        client_id: uuid.UUID | str | None = None,
        page_size: int = 1000,
    ) -> list[Event]:
        """The federation's whole audit trail, oldest first; only events of ``kind`` and of
        ``client_id`` when given (as many requests as pages)."""
        filters = {k: str(v) for k, v in (("kind", kind), ("client_id", client_id)) if v}
        items = self.get_json_pages(
            f"/federations/{federation_id}/events",
            cursor="after_id",
            page_size=page_size,
            **filters,
        )
        return [Event.model_validate(e) for e in items]

    def download_model(self, model_id: uuid.UUID | str) -> bytes:
        response = self._request("GET", f"{API}/models/{model_id}")
        return response.content

    def get_json(self, path: str, **params: Any) -> Any:
        """Any other admin GET under /api/v1 (reports, audits); returns the decoded JSON."""
        response = self._request("GET", f"{API}{path}", params=params)
        return response.json()

    def get_json_pages(
        self, path: str, *, cursor: str, page_size: int = 1000, **params: Any
    ) -> list[dict[str, Any]]:
        """Every item of a paged admin list under /api/v1, as decoded JSON objects.

        ``cursor`` names how the list pages: ``"offset"`` (the number of items already read;
        rounds) or ``"after_id"`` (the last item's ``id``; events, whose ids increase). Pages
        of ``page_size`` items are requested until one comes back short.
        """
        if cursor not in ("offset", "after_id"):
            raise ValueError(f"cursor: expected 'offset' or 'after_id', got {cursor!r}")
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        items: list[dict[str, Any]] = []
        while True:
            at = len(items) if cursor == "offset" else (int(items[-1]["id"]) if items else 0)
            page = self.get_json(path, limit=page_size, **{cursor: at}, **params)["items"]
            items += page
            if len(page) < page_size:
                return items

    def post_json(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        response = self._request("POST", f"{API}{path}", json=dict(body or {}), retry_status=False)
        return response.json()

    def get_text(self, path: str, **params: Any) -> str:
        return self._request("GET", f"{API}{path}", params=params).text
