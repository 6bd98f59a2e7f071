"""Settings of the features party, from ``LABELDP_*`` environment variables.

The two parties run as separate processes with separate environments, so the
features party reads the same names as the labels party:

=============================  ===============================================
``LABELDP_DATABASE_URL``       SQLAlchemy URL; default SQLite in the data dir
                               (``postgresql+psycopg://…`` in production)
``LABELDP_DATA_DIR``           feature sets, received releases, checkpoints,
                               model artifacts (default ``./labeldp-data/feature-party``)
``LABELDP_ADMIN_TOKEN``        bearer token for every endpoint (required)
``LABELDP_MAX_UPLOAD_BYTES``   largest feature-set / prediction upload (413 above)
``LABELDP_JOB_LEASE_SECONDS``  a running job whose worker sent no heartbeat for
                               this long goes back to the queue
``LABELDP_HEARTBEAT_SECONDS``  how often a worker renews its lease and
                               publishes progress
``LABELDP_POLL_SECONDS``       how often an idle worker looks for a job
``LABELDP_CLIENT_TIMEOUT_SECONDS`` / ``LABELDP_CLIENT_RETRIES``
                               the labels-party client (per request, retries
                               on connection errors, 5xx and 429)
``LABELDP_LOG_LEVEL``          DEBUG, INFO (default), WARNING, ERROR, CRITICAL
=============================  ===============================================
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.logging import LogLevel
from shared.settings_help import Seconds, check_lease
from shared.tokens import AdminToken, admin_token_problem


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LABELDP_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path("labeldp-data/feature-party")
    admin_token: AdminToken = None
    max_upload_bytes: int = Field(default=2 * 1024**3, ge=1)
    #: Largest accepted body that is not a multipart upload (JSON), parsed whole in
    #: memory (413 above).
    max_json_bytes: int = Field(default=64 * 1024**2, ge=1)
    #: Requests answered at once (503 ``overloaded`` beyond); the thread pool gets
    #: as many threads (``shared.overload``).
    max_concurrent_requests: int = Field(default=100, ge=1, le=10_000)
    job_lease_seconds: Seconds = 60.0
    heartbeat_seconds: Seconds = 5.0
    poll_seconds: Seconds = 1.0
    client_timeout_seconds: Seconds = 60.0
    # Up to 35 s of backoff in all (17.5 s on average): a labels party restarting
    # (a container, a Postgres failover) is waited for; a Retry-After is honoured.
    client_retries: int = Field(default=6, ge=0)
    client_backoff_seconds: float = Field(default=1.0, ge=0, le=3_600, allow_inf_nan=False)
    log_level: LogLevel = "INFO"

    @model_validator(mode="after")
    def _check_lease(self) -> Settings:
        check_lease(self, "job_lease_seconds", "heartbeat_seconds")
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'feature-party.db').resolve()}"

    def require_admin_token(
        self, why: str = "the service refuses to run without a real secret"
    ) -> str:
        token = self.admin_token.get_secret_value() if self.admin_token else None
        problem = admin_token_problem(token)
        if problem or token is None:
            raise ValueError(f"{problem}: {why}")
        return token


@lru_cache
def get_settings() -> Settings:
    return Settings()
