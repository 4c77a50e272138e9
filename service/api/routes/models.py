"""Model downloads (safetensors; ETag = sha256, 304 on If-None-Match)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import FileResponse

from service.api.deps import (
    Credentials,
    ServicesDep,
    check_throttle,
    is_admin,
    note_wrong_token,
)
from service.api.problems import PROBLEM_401, PROBLEM_403, PROBLEM_404, PROBLEM_410
from service.coordinator import clients as client_use_cases
from service.coordinator import queries
from service.errors import AuthError

router = APIRouter(prefix="/models", tags=["models"])


@router.get(
    "/{model_id}",
    summary="Download a model state (safetensors)",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The safetensors bytes"},
        304: {"description": "Not modified (If-None-Match matched the ETag)"},
        **PROBLEM_401,
        **PROBLEM_403,
        **PROBLEM_404,
        **PROBLEM_410,
    },
)
def download_model(
    model_id: uuid.UUID,
    request: Request,
    services: ServicesDep,
    credentials: Credentials,
    if_none_match: str | None = Header(None),
) -> Response:
    token = credentials.credentials if credentials is not None else None
    check_throttle(request, services, token)
    client = None
    if not is_admin(services, token):
        try:
            client = client_use_cases.authenticate(services, token)
        except AuthError:
            note_wrong_token(request, services, token)
            raise
    # Read in a short session of its own: the file is sent after the handler returns, and a
    # site downloading a large model must hold no connection for the whole transfer.
    key, sha256, size = queries.model_to_download(services, model_id, client=client)
    etag = f'"{sha256}"'
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers={"ETag": etag})
    return FileResponse(
        services.blobs.local_path(key),
        media_type="application/octet-stream",
        headers={"ETag": etag, "X-Content-SHA256": sha256, "Cache-Control": "private, max-age=0"},
        filename=f"{model_id}.safetensors",
    )
