"""Bodies of the credential routes: admin token rotation, sessions, site tokens."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdminTokenRotated(BaseModel):
    token: str = Field(
        description=(
            "The new admin token. Shown once; only a hash is kept. The previous token and every "
            "dashboard session stop working at once."
        )
    )


class SessionsEnded(BaseModel):
    ended: int = Field(description="How many dashboard sessions were live and are now ended.")


class RevokeRequest(BaseModel):
    """Why a site's token is revoked (for the event trail)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000)
