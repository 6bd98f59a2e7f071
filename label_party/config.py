"""Settings of the labels-party service, from ``LABELDP_*`` environment variables.

``LABELDP_MODE`` is ``production`` unless set to ``dev`` or ``test``. Outside those
two modes an admin token is required and an empty or well-known one is refused;
the test-only switches (a deterministic seed, a crash point) are refused too.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from label_party.datasets.domain import MAX_DOMAIN_SIZE
from shared.logging import LogLevel
from shared.settings_help import Seconds, check_lease
from shared.tokens import MIN_LENGTH, AdminToken, admin_token_problem

#: Secrets nobody may deploy with.

#: Where a test may ask the server to SIGKILL itself (crash-safety tests).
CrashPoint = Literal[
    "release_before_commit", "release_mechanism_fails", "release_io_error", "labels_after_commit"
]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LABELDP_", extra="ignore")

    mode: Literal["production", "dev", "test"] = "production"
    data_dir: Path = Path("./labeldp-data")
    database_url: str | None = None
    admin_token: AdminToken = None
    #: Largest accepted label upload, in bytes (413 above).
    max_upload_bytes: int = Field(default=2 << 30, gt=0)
    #: Largest accepted body that is not a multipart upload (JSON), parsed whole in
    #: memory (413 above).
    max_json_bytes: int = Field(default=64 << 20, gt=0)
    #: Labels randomized per chunk in a release (bounded working memory).
    chunk_size: int = Field(default=1 << 20, gt=0)
    #: The room a release must find under ``data_dir`` before its ε is reserved, per
    #: label in its scope beyond the label's id (507, nothing spent, below;
    #: :mod:`label_party.releases.room`). A write that fails after that is charged.
    release_bytes_per_label: int = Field(default=32, gt=0)
    #: Most values a dataset's label domain may have: grid points of a regression
    #: domain, classes of a classification one (422 above); at most the domains'
    #: own bound, 100,000.
    max_grid_size: int = Field(default=10_001, gt=1, le=MAX_DOMAIN_SIZE)
    #: Mechanism previews fitted at once (any token may ask for one, and a fit at
    #: the largest grid takes about a GB and seconds): 429 beyond.
    max_concurrent_previews: int = Field(default=2, ge=1)
    #: Seconds a preview's fit may run (the unbiased LP takes minutes past a few
    #: thousand values): 422 beyond, and the slot is free again.
    preview_seconds: Seconds = 30.0
    #: Seconds a release's fit to the uniform prior may run (its free check, before
    #: anything is reserved); beyond, 422 and nothing spent.
    release_fit_seconds: Seconds = 600.0
    #: Requests answered at once (503 ``overloaded`` beyond); the thread pool gets
    #: as many threads (``shared.overload``).
    max_concurrent_requests: int = Field(default=100, ge=1, le=10_000)
    #: Most connections a process opens to Postgres (its pool; 20 kept when idle).
    database_connections: int = Field(default=70, ge=2, le=10_000)
    log_level: LogLevel = "INFO"
    #: LabelDP-Pro trainings (``labeldp label-party worker``): the torch device
    #: (``auto``: CUDA when the worker has it), how often an idle worker polls,
    #: how long a claim's lease lasts and how often a running training renews it.
    training_device: Literal["auto", "cpu", "cuda"] = "auto"
    worker_poll_seconds: Seconds = 1.0
    worker_lease_seconds: Seconds = 60.0
    worker_heartbeat_seconds: Seconds = 5.0
    #: Largest model a training may ask for (422 above, before any budget is
    #: spent): a physical batch's per-example gradients take 4 KiB a parameter
    #: (measured 4.1 KiB at 1,024 examples).
    training_max_parameters: int = Field(default=1_000_000, gt=0)
    #: Largest decoded size of a training's Parquet features (413 above, refused as
    #: it is read, from its metadata where that owns up): 9 MB of zstd decoded to
    #: 2.4 GB, twice over in memory. 2 GiB holds 680,000 float32 rows of 784 pixels.
    training_max_features_bytes: int = Field(default=2 << 30, gt=0)
    #: Largest memory a projecting denoiser may take: its examples' recorded
    #: forward passes and a block of per-class gradients
    #: (:mod:`label_party.trainings.resources`; 422 above, nothing spent).
    training_max_projection_bytes: int = Field(default=4 << 30, gt=0)
    #: Most DP-SGD steps (epochs × n/B) a training may ask for (422 above, before
    #: any budget is spent): about a day at 10 steps/s on one GPU.
    training_max_steps: int = Field(default=1_000_000, gt=0)
    #: Most example-gradients (one example's forward and backward pass) a training
    #: may ask for, its projections' included (422 above, nothing spent;
    #: :mod:`label_party.trainings.resources`). Measured rates: about 3,500 a second
    #: on one CPU thread (Table-10a CNN, autodiff projection), 2.7 M on an H100
    #: (dense projection), so the default 10¹⁰ is about an hour there.
    training_max_example_gradients: int = Field(default=10**10, gt=0)
    #: Test-only: releases draw from a generator seeded with this and the release id.
    test_seed: int | None = None
    #: Test-only: SIGKILL the server at this point of a release.
    test_crash_point: CrashPoint | None = None

    #: Whether these settings start the API, which needs the admin token.
    serves_api: ClassVar[bool] = True

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        relaxed = self.mode in ("dev", "test")
        token = self.admin_token.get_secret_value() if self.admin_token else ""
        if self.serves_api and not relaxed:
            problem = admin_token_problem(token)
            if problem:
                raise ValueError(
                    f"{problem}: set a random secret of at least {MIN_LENGTH} characters "
                    "(or LABELDP_MODE=dev for local development)"
                )
        check_lease(self, "worker_lease_seconds", "worker_heartbeat_seconds")
        # A seeded randomizer is predictable noise (DESIGN.md §3.5): only under test mode.
        for name, value in (("SEED", self.test_seed), ("CRASH_POINT", self.test_crash_point)):
            if value is not None and self.mode != "test":
                raise ValueError(f"LABELDP_TEST_{name} needs LABELDP_MODE=test")
        return self

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'label_party.sqlite3').resolve()}"

    @property
    def admin_token_value(self) -> str | None:
        """The admin token; in dev/test mode without one, the admin API is closed."""
        if self.admin_token is None or not self.admin_token.get_secret_value():
            return None
        return self.admin_token.get_secret_value()

    @property
    def labels_dir(self) -> Path:
        return self.data_dir / "labels"

    @property
    def releases_dir(self) -> Path:
        return self.data_dir / "releases"

    @property
    def partitions_dir(self) -> Path:
        return self.data_dir / "partitions"

    @property
    def priors_dir(self) -> Path:
        return self.data_dir / "priors"

    @property
    def trainings_dir(self) -> Path:
        """Uploaded training features and trained model artifacts, named by SHA-256."""
        return self.data_dir / "trainings"

    @property
    def tmp_dir(self) -> Path:
        return self.data_dir / "tmp"


class WorkerSettings(Settings):
    """The training worker's settings: the service's, but the admin token is the
    API's alone (the worker answers no request), so a worker is deployed without it."""

    serves_api: ClassVar[bool] = False
