"""Process settings (environment prefix ``FEDAUDIT_``).

Federation-level settings (rounds, audit configuration, ...) live in the federation record, not
here. Nothing reads the environment at import time: `get_settings()` is cached and injected, and
`create_app(settings)` takes an explicit instance, which is how tests configure the app.
"""

from __future__ import annotations

import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

S3_SINGLE_PUT_LIMIT = 5 * 1024**3
"""One S3 PUT writes at most 5 GiB (service.store.s3blobs.SINGLE_PUT_LIMIT)."""
S3_DEFAULT_SWEEP_GRACE_S = 3600.0
"""The start-up sweep's grace period with the s3 blob backend, unless set."""
PLACEHOLDER_TOKENS = frozenset({"", "change-me", "changeme", "admin", "secret", "dev-admin-token"})


class Settings(BaseSettings):
    """Settings of one coordinator process."""

    model_config = SettingsConfigDict(
        env_prefix="FEDAUDIT_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
    )

    environment: Literal["development", "production"] = "development"
    data_dir: Path = Field(default=Path("fedaudit-data"))
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default: a SQLite file fedaudit.db inside data_dir.",
    )
    blob_backend: Literal["directory", "database", "s3"] = Field(
        default="directory",
        description=(
            "Where model blobs live: files under data_dir (directory), rows of the database "
            "(database), or an S3-compatible object store (s3: the s3_* settings; needs the "
            "extra fedaudit[s3])."
        ),
    )
    s3_bucket: str | None = Field(
        default=None,
        description="The bucket of the s3 blob backend (required with it; create it first).",
    )
    s3_prefix: str = Field(
        default="blobs/",
        description=(
            "Object names start with this prefix; the start-up sweep removes objects under it "
            "whose name is a sha256 that no row references, so give it to fedaudit alone."
        ),
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description="The S3 server, e.g. http://minio:9000; default: AWS S3.",
    )
    s3_region: str | None = Field(
        default=None, description="The region; default: boto3's (AWS_REGION, its config)."
    )
    s3_addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto",
        description=(
            "Bucket in the path (http://host/bucket/key; MinIO and most self-hosted servers) "
            "or in the host name (virtual); auto: boto3 chooses."
        ),
    )
    db_pool_size: int = Field(
        default=5,
        ge=1,
        description=(
            "Database connections kept open (SQLAlchemy QueuePool; an in-memory SQLite database "
            "has no such pool and ignores the three pool settings)."
        ),
    )
    db_max_overflow: int = Field(
        default=10,
        ge=0,
        description="Connections opened beyond db_pool_size under load, closed when returned.",
    )
    db_pool_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "How long a request waits for a free connection before it is answered 503 with "
            "Retry-After."
        ),
    )
    change_notifier: Literal["auto", "local", "postgres"] = Field(
        default="auto",
        description=(
            "What wakes long-polls when a round opens or closes. auto: PostgreSQL LISTEN/NOTIFY "
            "on a PostgreSQL database when psycopg 3 (the postgres extra) is installed "
            "(replicas wake each other's waiting sites), a signal file beside a SQLite "
            "database file (the workers of fedaudit serve --workers N wake each other's "
            "waiting sites), otherwise in-process signals, with a warning on PostgreSQL; "
            "local: in-process signals only (a site waiting on another replica or worker "
            "learns of a change at its 15-second re-check); postgres: LISTEN/NOTIFY or "
            "refuse to start (no psycopg 3, or not a PostgreSQL database)."
        ),
    )
    admin_token: SecretStr | None = None
    admin_token_file: Path | None = None
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    cors_origins: list[str] = Field(default_factory=list)
    reaper_interval_s: float = Field(default=2.0, gt=0)
    close_rounds_inline: bool = Field(
        default=False,
        description=(
            "Close a round inside the request of its last upload instead of on the background "
            "worker (used by tests that need a deterministic order)."
        ),
    )
    check_migrations: bool = True
    auth_rejected_events_per_minute: int = Field(
        default=20,
        ge=1,
        description=(
            "At most this many auth.rejected events per federation and minute are written (per "
            "process); the next one written counts those left out. A caller with a bad token "
            "cannot grow the database without bound."
        ),
    )
    metrics_require_admin: bool = Field(
        default=False,
        description=(
            "Require the admin bearer token on /metrics. Off by default: Prometheus scrapers "
            "usually send no token and the metrics hold only aggregate counts."
        ),
    )

    auth_failure_limit: int = Field(
        default=10,
        ge=1,
        description=(
            "Wrong tokens (bearer or dashboard login) a client address may send within "
            "auth_failure_window_s; then it is answered 429 with Retry-After until the window "
            "ends (per process)."
        ),
    )
    auth_failure_window_s: float = Field(
        default=60.0,
        gt=0,
        description="The window of auth_failure_limit, from an address's first wrong token.",
    )
    force_secure_cookies: bool = Field(
        default=False,
        description=(
            "Mark the dashboard cookie Secure whatever the request's scheme (otherwise only on "
            "https, which behind a TLS proxy depends on trusting its forwarded headers)."
        ),
    )
    api_docs: bool | None = Field(
        default=None,
        description=(
            "Serve /docs and /redoc (their pages load Swagger UI and ReDoc from a CDN). Default: "
            "on in development, off in production."
        ),
    )
    startup_sweep: bool = Field(
        default=True,
        description=(
            "At start-up, remove the staged .part files and unreferenced blobs a crash left "
            "(service.coordinator.housekeeping)."
        ),
    )
    tls_certfile: Path | None = Field(
        default=None,
        description=(
            "PEM certificate (chain) for serving https directly, without a TLS proxy; needs "
            "tls_keyfile."
        ),
    )
    tls_keyfile: Path | None = Field(default=None, description="PEM private key of tls_certfile.")
    tls_client_ca: Path | None = Field(
        default=None,
        description=(
            "PEM CA bundle: with it the server requires a client certificate signed by one of "
            "these CAs (mutual TLS), on top of the bearer tokens."
        ),
    )
    startup_sweep_grace_s: float = Field(
        default=0.0,
        ge=0,
        description=(
            "The start-up sweep removes only files last written more than this many seconds "
            "ago; 0: all (a process owns its data directory). Set it above the longest upload "
            "when replicas share a data directory. Default 0; 3600 with the s3 blob backend, "
            "whose bucket replicas share."
        ),
    )

    retention_rounds: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Keep the model updates of the last N finished rounds of every federation: when a "
            "round closes, the blobs (and probe softmax and centroids) of older updates are "
            "pruned, except each site's latest update and the neighbour models an open round "
            "hands out; global models and the signals the reports read stay. Unset (default): "
            "keep everything; `fedaudit prune` prunes on request (service.coordinator.retention)."
        ),
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @model_validator(mode="after")
    def _admin_token(self) -> Settings:
        if self.admin_token is None and self.admin_token_file is not None:
            token = self.admin_token_file.read_text(encoding="utf-8").strip()
            self.admin_token = SecretStr(token)
        if self.environment == "production":
            token = self.admin_token.get_secret_value() if self.admin_token else ""
            if token in PLACEHOLDER_TOKENS or len(token) < 16:
                raise ValueError(
                    "FEDAUDIT_ADMIN_TOKEN (or FEDAUDIT_ADMIN_TOKEN_FILE) must be set to a secret "
                    "of at least 16 characters in production"
                )
        return self

    @model_validator(mode="after")
    def _s3(self) -> Settings:
        if self.blob_backend != "s3":
            return self
        if not self.s3_bucket:
            raise ValueError("FEDAUDIT_S3_BUCKET must be set with FEDAUDIT_BLOB_BACKEND=s3")
        if self.max_upload_bytes > S3_SINGLE_PUT_LIMIT:
            raise ValueError(
                "FEDAUDIT_MAX_UPLOAD_BYTES must be at most 5 GiB with FEDAUDIT_BLOB_BACKEND=s3 "
                "(a blob is written by one S3 PUT)"
            )
        if "startup_sweep_grace_s" not in self.model_fields_set:
            # The bucket is shared by every replica: a replica starting must not remove what
            # another has just put and not yet committed.
            self.startup_sweep_grace_s = S3_DEFAULT_SWEEP_GRACE_S
        return self

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file in the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'fedaudit.db').resolve()}"

    @property
    def api_docs_enabled(self) -> bool:
        return self.api_docs if self.api_docs is not None else self.environment == "development"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def tmp_dir(self) -> Path:
        return self.data_dir / "tmp"

    def admin_secret(self) -> str:
        """The admin token; a development instance without one gets a random one per process."""
        if self.admin_token is None:
            self.admin_token = SecretStr(secrets.token_urlsafe(24))
        return self.admin_token.get_secret_value()


class SettingsError(ValueError):
    """A setting's value in the environment is not valid: one line per setting, named as it
    is set (``FEDAUDIT_PORT='abc': ...``)."""


def _problem(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        name = "_".join(str(part) for part in error["loc"]) or "settings"
        given = error.get("input")
        shown = f"={given!r}" if isinstance(given, str | int | float) else ""
        lines.append(f"FEDAUDIT_{name.upper()}{shown}: {error['msg']}")
    return "invalid setting" + ("s" if len(lines) > 1 else "") + ": " + "; ".join(lines)


@lru_cache
def get_settings() -> Settings:
    """Settings from the environment, read once per process; :class:`SettingsError` where a
    value is not valid."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(_problem(exc)) from None
