"""SQLAlchemy tables of the labels party.

These are storage rows, never response models: every endpoint answers with a
pydantic schema built from them (a raw-label table does not exist at all — labels
live in Parquet files under the data directory, see :mod:`label_party.storage`).

Privacy amounts are integers in fixed units (:mod:`label_party.ledger.units`) so
that sums are exact on every database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.timestamps import UTCDateTime, utcnow

#: ``timestamp with time zone``, read as aware UTC whatever the connection's zone.
Timestamp = UTCDateTime(timezone=True)


class Base(DeclarativeBase):
    pass


class Client(Base):
    """A bearer-token principal: a features party (``client``) or an ``auditor``."""

    __tablename__ = "clients"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp, default=None)


class Dataset(Base):
    """A labelled dataset: declared domain, budget, and where its labels are stored.

    The row is also the ledger's lock: a release locks it before checking budget.
    """

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    task: Mapped[str] = mapped_column(String(20))
    label_domain: Mapped[dict[str, Any]] = mapped_column(JSON)
    epsilon_budget: Mapped[int] = mapped_column(BigInteger)
    delta_budget: Mapped[int] = mapped_column(BigInteger)
    num_labels: Mapped[int | None] = mapped_column(BigInteger, default=None)
    labels_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    created_by: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class Grant(Base):
    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("dataset_id", "client_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class PartitionPlan(Base):
    """A label-independent assignment of examples to named parts (one per dataset)."""

    __tablename__ = "partition_plans"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), unique=True)
    #: ``{part name: number of examples}``.
    parts: Mapped[dict[str, Any]] = mapped_column(JSON)
    sha256: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class LedgerEntry(Base):
    """What one release spent, and on which scope (``parts`` null: every example)."""

    __tablename__ = "ledger_entries"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    epsilon: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[int] = mapped_column(BigInteger)
    parts: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class Release(Base):
    """A persisted randomized release: its manifest and its Parquet file's hash."""

    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("dataset_id", "idempotency_key"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    ledger_entry_id: Mapped[str] = mapped_column(ForeignKey("ledger_entries.id"), unique=True)
    created_by: Mapped[str] = mapped_column(String(36))
    prior_epsilon: Mapped[int] = mapped_column(BigInteger)
    #: Public manifest pieces: mechanism description and the noisy prior.
    mechanism: Mapped[dict[str, Any]] = mapped_column(JSON)
    prior: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    num_labels: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class ReleaseFailure(Base):
    """A release whose mechanism failed after reading the labels: charged (its
    ledger entry) and, under its idempotency key, replayed rather than paid again."""

    __tablename__ = "release_failures"
    __table_args__ = (UniqueConstraint("dataset_id", "idempotency_key"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    ledger_entry_id: Mapped[str] = mapped_column(ForeignKey("ledger_entries.id"), unique=True)
    created_by: Mapped[str] = mapped_column(String(36))
    mechanism: Mapped[str] = mapped_column(String(100))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class ReplacedLabels(Base):
    """A labels file an upload replaced, named in the upload's transaction: deleted
    after the commit, or by the next start-up sweep if a crash came in between."""

    __tablename__ = "replaced_labels"

    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)


class AuditEntry(Base):
    """One link of the append-only, hash-chained audit log (DESIGN.md §3.6).

    ``payload`` is the canonical JSON text that was hashed, stored verbatim.
    """

    __tablename__ = "audit_entries"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    created_at: Mapped[str] = mapped_column(String(40))
    actor: Mapped[str] = mapped_column(String(36))
    action: Mapped[str] = mapped_column(String(40))
    dataset_id: Mapped[str | None] = mapped_column(String(36), index=True, default=None)
    payload: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class PriorSet(Base):
    """An uploaded set of example priors (``groups`` or ``probabilities``)."""

    __tablename__ = "prior_sets"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    #: ``groups`` or ``probabilities``.
    kind: Mapped[str] = mapped_column(String(20))
    num_rows: Mapped[int] = mapped_column(BigInteger)
    #: Distinct groups (``groups``) or None.
    num_groups: Mapped[int | None] = mapped_column(Integer, default=None)
    #: K (``probabilities``) or None.
    num_classes: Mapped[int | None] = mapped_column(Integer, default=None)
    sha256: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class Training(Base):
    """A LabelDP-Pro training (``label_party.trainings``): a queued row of the
    shared lease queue (:mod:`shared.lease_queue`) whose result is a model
    artifact. Its (ε, δ) is the ledger entry reserved when it was accepted."""

    __tablename__ = "trainings"
    __table_args__ = (
        UniqueConstraint("dataset_id", "idempotency_key"),
        Index("ix_trainings_status", "status", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    ledger_entry_id: Mapped[str] = mapped_column(ForeignKey("ledger_entries.id"), unique=True)
    created_by: Mapped[str] = mapped_column(String(36))
    #: The public training spec, with the defaults it was run with filled in.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    features_sha256: Mapped[str] = mapped_column(String(64))
    num_examples: Mapped[int] = mapped_column(BigInteger)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    accounting: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    model_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    worker_id: Mapped[str | None] = mapped_column(String(200), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp, default=None)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp, default=None)
