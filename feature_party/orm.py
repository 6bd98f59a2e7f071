"""SQLAlchemy tables of the features party (schema changes go through
``feature_party/migrations``). These are storage rows, never response models."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.timestamps import UTCDateTime, utcnow

JSONType = JSON().with_variant(JSONB(), "postgresql")


#: Naive UTC in storage (``timestamp without time zone``), aware UTC when read.
Timestamp = UTCDateTime(timezone=False)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSONType, list[Any]: JSONType}


class FeatureSet(Base):
    __tablename__ = "feature_sets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    num_rows: Mapped[int] = mapped_column(Integer)
    columns: Mapped[list[Any]] = mapped_column()
    roles: Mapped[dict[str, Any]] = mapped_column()
    path: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class ReceivedLabels(Base):
    __tablename__ = "received_labels"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    feature_set_id: Mapped[str] = mapped_column(ForeignKey("feature_sets.id"))
    labels_party_url: Mapped[str] = mapped_column(String(500))
    dataset_id: Mapped[str] = mapped_column(String(200))
    release_id: Mapped[str] = mapped_column(String(200))
    manifest: Mapped[dict[str, Any]] = mapped_column()
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(500))
    num_labels: Mapped[int] = mapped_column(Integer)
    matched: Mapped[int] = mapped_column(Integer)
    unmatched: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_created", "status", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    feature_set_id: Mapped[str] = mapped_column(ForeignKey("feature_sets.id"))
    labels_id: Mapped[str] = mapped_column(ForeignKey("received_labels.id"))
    config: Mapped[dict[str, Any]] = mapped_column()
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error: Mapped[str | None] = mapped_column(Text)
    model_id: Mapped[str | None] = mapped_column(String(32))
    worker_id: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: GPUs a worker must have to claim the job (its configuration's ``device``):
    #: 0 for ``auto`` and ``cpu``, which any worker takes.
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)


class Model(Base):
    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: The job that trained it; None for a model imported from the labels party.
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), unique=True)
    #: ``job`` (trained here) or ``labels-party-training`` (a LabelDP-Pro release).
    source: Mapped[str] = mapped_column(String(40), default="job", server_default="job")
    #: The labels-party training an imported model came from.
    training_id: Mapped[str | None] = mapped_column(String(200), default=None)
    path: Mapped[str] = mapped_column(String(500))
    task: Mapped[str] = mapped_column(String(32))
    loss: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class MultistageRun(Base):
    """One LP-MST run (``feature_party.multistage``): its public configuration and
    the state of each stage, written after every step so a run can resume. The
    labels-party token is never stored."""

    __tablename__ = "multistage_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    feature_set_id: Mapped[str] = mapped_column(ForeignKey("feature_sets.id"))
    labels_party_url: Mapped[str] = mapped_column(String(500))
    dataset_id: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[dict[str, Any]] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)


class PendingReleaseKey(Base):
    """The idempotency key this service made for a new release asked without one,
    kept from before the labels party is asked until the release's labels are
    stored here: a retry of the same request (:func:`received_labels.service.
    request_fingerprint`) after a crash or a lost answer sends the same key, and
    gets the release that was paid for instead of paying again."""

    __tablename__ = "pending_release_keys"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
