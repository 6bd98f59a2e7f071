"""Accept, read and cancel LabelDP-Pro trainings.

Accepting a training is ordered like a release (DESIGN.md §3.3). First, in a
read transaction without locks: validate the public features and spec and
compute the noise plan (q, T, σ) the worker will train with
(:func:`label_party.trainings.plan.noise_plan`; 422 when the spec cannot be
calibrated, nothing reserved, stored or audited). Then one transaction: lock
the dataset row → replay an idempotent request (spends nothing) → check that the
labels are still those the plan was computed for → reserve (ε, δ) in the ledger
(or 409 ``budget_exceeded``, nothing stored) → store the features file named by
its SHA-256 → insert the queued training row (its resolved spec carries the
plan) and the ``training.reserved`` audit entry → commit. The worker
(:mod:`label_party.trainings.worker`) trains later, and releases a model only if
the trainer ran that plan.

**The budget is charged when the training is accepted and never refunded**, even
if the training later fails or is cancelled. A failure can happen after the
worker has already computed label-dependent noisy gradients (or, with a crash,
after a model was written), and whether and when it failed is itself observable
by the features party; refunding would make the spend depend on what happened
to the private computation. Charging up front is the conservative reading of
§3.3: the reservation commits before anything label-dependent exists.

Features are public by assumption (``labeldp-pro.txt`` §2): only their
``example_id`` and numeric columns are accepted; categorical columns are refused
(422) in this version.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from label_party.audit import service as audit
from label_party.auth import Principal, confirm, require, sees_own, visible_dataset
from label_party.config import Settings
from label_party.datasets.domain import parse_domain
from label_party.db import transaction
from label_party.exceptions import (
    ConflictError,
    IdempotencyConflictError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
)
from label_party.labels.validation import FileFormat
from label_party.ledger import service as ledger
from label_party.ledger.accounting import Cost
from label_party.ledger.units import delta_decimal, delta_units, epsilon_decimal, epsilon_units
from label_party.models import Dataset, LedgerEntry, Training
from label_party.storage import (
    delete_after_commit,
    labels_path,
    persisted,
    training_checkpoint_path,
    training_features_dir,
    training_model_path,
    training_tmp_dir,
)
from label_party.trainings import repository, resources
from label_party.trainings.plan import InfeasiblePlanError, noise_plan
from label_party.trainings.schemas import TrainingRead, TrainingSpec, unread_fields
from shared.columns import NAMES_NOT_UTF8, ColumnTypeError, as_keys, as_numbers
from shared.jsonl import TooDeepError, read_json_lines
from shared.lease_queue import Status
from shared.parquet import ParquetTooLargeError, publish_by_hash, read_parquet_bounded, temp_path
from shared.protocol import DELTA_SCALE, amount_text
from shared.strict_json import duplicate_key

logger = logging.getLogger("label_party.trainings")

#: Expected batch size when the spec gives none (capped at n).
DEFAULT_BATCH = 1024


# -- the features file ------------------------------------------------------------------


def _read_any(source: IO[bytes], fmt: FileFormat, max_bytes: int | None) -> pa.Table:
    """The uploaded table; parser messages are not passed on (they quote content)."""
    try:
        if fmt == "parquet":
            return read_parquet_bounded(source, max_decoded_bytes=max_bytes)
        if fmt == "csv":
            options = pcsv.ConvertOptions(column_types={"example_id": pa.string()})
            table = pcsv.read_csv(source, convert_options=options)
        else:
            table = read_json_lines(source)
        _ = table.column_names  # the names are decoded here, inside the except below
        return table
    except UnicodeDecodeError:
        raise InvalidRequestError(
            f"the features file could not be read: {NAMES_NOT_UTF8}"
        ) from None
    except TooDeepError as exc:
        raise InvalidRequestError(f"the features file could not be read: {exc}") from None
    except ParquetTooLargeError as exc:
        raise PayloadTooLargeError(str(exc), {"limit": exc.limit}) from None
    except (pa.ArrowException, OSError):
        raise InvalidRequestError(f"the features file could not be read as {fmt}") from None


def read_features(source: IO[bytes], fmt: FileFormat, max_bytes: int | None = None) -> pa.Table:
    """``example_id`` (string, unique, present) plus the numeric columns as float32,
    in file order. Only column names and row numbers appear in errors. A Parquet
    file that decodes to more than ``max_bytes`` is refused (413) as it is read."""
    table = _read_any(source, fmt, max_bytes)
    repeated = sorted(c for c, n in Counter(table.column_names).items() if n > 1)
    if repeated:
        raise InvalidRequestError(
            f"the features file repeats column(s) {', '.join(repeated[:20])}",
            {"repeated_columns": repeated[:100]},
        )
    if "example_id" not in table.column_names:
        raise InvalidRequestError("the features file needs an example_id column")
    names = [c for c in table.column_names if c != "example_id"]
    if not names:
        raise InvalidRequestError("the features file has no feature columns")
    if "label" in names:
        raise InvalidRequestError(
            "a feature column may not be named label: the worker joins the labels under "
            "that name; rename the column"
        )
    empty = [c for c in names if pa.types.is_null(table.schema.field(c).type)]
    if empty:
        raise InvalidRequestError(
            "feature column(s) without any value", {"empty_columns": empty[:100]}
        )
    bad = [c for c in names if not _numeric(table.schema.field(c).type)]
    if bad:
        raise InvalidRequestError(
            "only numeric feature columns are supported for LabelDP-Pro training; "
            "categorical columns are not (yet)",
            {"non_numeric_columns": bad[:100]},
        )
    _require_finite(table, names)
    try:
        ids = as_keys(table.column("example_id"), "example_id")
    except ColumnTypeError as exc:
        raise InvalidRequestError(str(exc)) from None
    if ids.null_count:
        raise InvalidRequestError("example_id is missing in some rows")
    if len(pc.unique(ids)) != table.num_rows:
        raise InvalidRequestError("example_id values must be unique")
    columns = {"example_id": ids}
    columns.update({c: as_numbers(table.column(c), c, pa.float32()) for c in names})
    return pa.table(columns)


#: Features are trained on as float32: a finite float64 beyond this is infinite there.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _require_finite(table: pa.Table, names: list[str]) -> None:
    """Refuse missing, NaN and infinite values, and values beyond float32's range
    (they become infinite when stored), before anything is charged: the worker
    would otherwise train on silently imputed zeros."""
    problems = []
    for name in names:
        column = as_numbers(table.column(name), name)
        fits = pc.less_equal(pc.abs(column), FLOAT32_MAX)  # false for NaN, null for null
        finite = pc.fill_null(fits, False).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~finite)
        if bad.size:
            problems.append({"column": name, "rows": int(bad.size), "first_row": int(bad[0]) + 1})
    if problems:
        raise InvalidRequestError(
            f"feature values must be finite numbers within ±{FLOAT32_MAX:.3g}: "
            + ", ".join(f"{p['column']} ({p['rows']} rows)" for p in problems[:20]),
            {"non_finite": problems[:100]},
        )


def _numeric(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


def _store_features(settings: Settings, table: pa.Table) -> str:
    tmp = temp_path(training_tmp_dir(settings), ".parquet")
    try:
        pq.write_table(table, tmp, compression="snappy")
        _final, sha = publish_by_hash(tmp, training_features_dir(settings))
    finally:
        tmp.unlink(missing_ok=True)
    return sha


def _labelled_count(settings: Settings, dataset: Dataset, table: pa.Table) -> int:
    """How many feature rows have a label: reads the label *ids* only."""
    label_ids = pq.read_table(labels_path(settings, dataset), columns=["example_id"])
    return int(
        pc.sum(pc.is_in(table.column("example_id"), value_set=label_ids.column(0))).as_py() or 0
    )


# -- the spec -----------------------------------------------------------------------------


def parse_spec(text: str | None) -> TrainingSpec:
    if text is None:
        raise InvalidRequestError("the multipart field 'spec' (JSON) is required")
    key = duplicate_key(text.encode("utf-8", "surrogatepass"))
    if key is not None:  # a form field: the body's own check does not read it
        raise InvalidRequestError(f"the spec names the key {key!r} twice in one object")
    try:
        return TrainingSpec.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidRequestError(
            "invalid training spec",
            [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()],
        ) from None


def _resolved(spec: TrainingSpec, n: int, num_features: int) -> tuple[dict[str, Any], int]:
    """The spec with its defaults filled in (as stored and put in the artifact),
    and δ in ledger units (default ⌊10¹⁸/n⌋, i.e. δ ≤ 1/n)."""
    if spec.architecture == "cnn" and spec.image_shape is not None:  # (filled in for a cnn)
        c, h, w = spec.image_shape
        if c * h * w != num_features:
            raise InvalidRequestError(
                f"architecture cnn with image_shape {list(spec.image_shape)} needs "
                f"{c * h * w} numeric columns; the file has {num_features}"
            )
        if min(h, w) < 10:
            raise InvalidRequestError("the cnn needs images of at least 10×10 pixels")
    batch = spec.expected_batch_size or min(DEFAULT_BATCH, n)
    if batch > n:
        raise InvalidRequestError(
            f"expected_batch_size must not exceed the {n} labelled examples the features cover"
        )
    if spec.denoiser == "alt-conv" and (spec.alt_batch_size or 0) > n:
        # ALTCONV draws its n₂ projection examples from the same n.
        raise InvalidRequestError(
            f"alt_batch_size ({spec.alt_batch_size}: alt-conv's n₂ projection examples, "
            f"default 64) must not exceed the {n} labelled examples the features cover; "
            "set a smaller one in the spec"
        )
    delta = delta_units(spec.delta) if spec.delta is not None else DELTA_SCALE // n
    data = spec.model_dump(mode="json", exclude={"idempotency_key"})
    data.update(expected_batch_size=batch, delta=float(delta_decimal(delta)))
    # Imported here like the plan's accountant: it loads torch, which the service
    # otherwise never needs.
    from label_party.trainings.training import library_defaults

    for key, value in library_defaults(spec.denoiser).items():
        if data[key] is None:
            data[key] = value
    # What the training does not read is not echoed as if it were a setting.
    data.update(dict.fromkeys(unread_fields(spec.denoiser, spec.architecture)))
    return data, delta


def _plan(resolved: dict[str, Any], n: int, max_steps: int) -> dict[str, Any]:
    """The noise plan the worker will train with, or 422 (nothing spent)."""
    started = time.perf_counter()
    try:
        plan = noise_plan(resolved, n, max_steps=max_steps)
    except InfeasiblePlanError as exc:
        raise InvalidRequestError(
            f"infeasible training spec: {exc.message}", exc.detail or None
        ) from None
    logger.debug(
        "training noise calibrated",
        extra={"fields": {"seconds": round(time.perf_counter() - started, 3)}},
    )
    return plan.to_dict()


def fingerprints(spec: TrainingSpec, upload_sha256: str) -> tuple[str, str]:
    """The request's digest for its idempotency key (its amounts exact:
    :func:`shared.protocol.amount_text`), and the one trainings accepted before
    2026-11-25 stored (amounts as JSON doubles)."""

    def digest(data: dict[str, Any]) -> str:
        return hashlib.sha256(audit.canonical([data, upload_sha256]).encode()).hexdigest()

    data = spec.model_dump(mode="json", exclude={"idempotency_key"})
    legacy = digest(data)
    data["epsilon"], data["delta"] = map(amount_text, (spec.epsilon, spec.delta))
    return digest(data), legacy


def upload_digest(source: IO[bytes]) -> str:
    digest = hashlib.sha256()
    source.seek(0)
    while block := source.read(1 << 22):
        digest.update(block)
    source.seek(0)
    return digest.hexdigest()


# -- accept ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Draft:
    """What accepting a request computes without any lock: its features, n, the
    resolved spec with its noise plan, and the labels it was planned against."""

    table: pa.Table
    num_examples: int
    resolved: dict[str, Any]
    delta_units: int
    labels_sha256: str


def _draft(
    settings: Settings, dataset: Dataset, spec: TrainingSpec, source: IO[bytes], fmt: FileFormat
) -> _Draft:
    domain = parse_domain(dataset.task, dataset.label_domain)
    if dataset.labels_sha256 is None:
        raise ConflictError("the dataset has no labels yet")
    source.seek(0)
    table = read_features(source, fmt, settings.training_max_features_bytes)
    try:
        n = _labelled_count(settings, dataset, table)
    except FileNotFoundError:  # replaced (and deleted) since this request read the row
        raise ConflictError(LABELS_CHANGED) from None
    if n == 0:
        raise InvalidRequestError("no feature row matches a labelled example_id")
    resolved, delta = _resolved(spec, n, table.num_columns - 1)
    resolved["num_classes"] = domain.size
    resources.check(settings, resolved, n, table.num_columns - 1)
    # Before anything is reserved: a spec the worker could not calibrate is
    # refused here, not discovered after its budget was spent.
    resolved["plan"] = _plan(resolved, n, settings.training_max_steps)
    return _Draft(table, n, resolved, delta, dataset.labels_sha256)


LABELS_CHANGED = (
    "the dataset's labels changed while this training was being planned; send the request again"
)


def _replay(
    session: Session,
    principal: Principal,
    dataset_id: str,
    spec: TrainingSpec,
    digests: tuple[str, str],
) -> Training | None:
    if spec.idempotency_key is None:
        return None
    existing = repository.by_idempotency_key(session, dataset_id, spec.idempotency_key)
    if existing is not None and (
        existing.request_fingerprint not in digests or existing.created_by != principal.id
    ):
        raise IdempotencyConflictError("this idempotency key was used for a different request")
    return existing


def create(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset_id: str,
    spec: TrainingSpec,
    source: IO[bytes],
    fmt: FileFormat,
    *,
    unlocked: sessionmaker[Session],
) -> tuple[Training, bool]:
    """The training for this request and whether it was made now (False: a replay).

    The draft (features, n, noise plan: 1–4 s of accountant calls) is computed
    after a short read transaction of ``unlocked``, before ``session`` locks the dataset row,
    which on SQLite is the whole database's write lock. Under the lock the labels
    it was planned against must still be the dataset's (409 otherwise; labels are
    frozen once a training exists, so only a first training can race an upload).
    """
    require(principal, "admin", "client")
    digests = fingerprints(spec, upload_digest(source))
    # What the spec alone says it costs (a default δ needs the features' n): a
    # request the budget cannot afford is refused before the seconds of reading
    # and planning, as a release is.
    least = Cost(epsilon_units(spec.epsilon), _given_delta_units(spec), None)
    with transaction(unlocked) as reader:
        dataset = visible_dataset(reader, principal, dataset_id)
        if dataset.task != "classification":  # before the budget: no refusal to audit
            raise InvalidRequestError(
                "LabelDP-Pro trains classifiers: the dataset must be classification"
            )
        replay = _replay(reader, principal, dataset.id, spec, digests)
        hopeless = replay is None and not ledger.affordable(reader, dataset, least)
    if hopeless:  # refused and audited under the lock (it may have become affordable)
        locked = ledger.lock_dataset(session, dataset.id)
        confirm(session, principal)
        ledger.refuse_unless_affordable(
            session, principal, locked, least, what="training", delta_known=spec.delta is not None
        )
    draft = None if replay else _draft(settings, dataset, spec, source, fmt)
    dataset = ledger.lock_dataset(session, dataset.id)
    confirm(session, principal)
    existing = _replay(session, principal, dataset.id, spec, digests)
    if existing is not None:
        return existing, False
    # A replay seen unlocked is seen again under the lock (trainings are never deleted).
    assert draft is not None
    if dataset.labels_sha256 != draft.labels_sha256:
        raise ConflictError(LABELS_CHANGED)
    cost = Cost(epsilon_units(spec.epsilon), draft.delta_units, None)
    entry = ledger.reserve(session, principal, dataset, cost, what="training")
    sha = _store_features(settings, draft.table)
    training = _insert(session, principal, dataset, entry, draft, sha, spec, digests[0])
    logger.info(
        "training accepted",
        extra={"fields": {"training_id": training.id, "dataset_id": dataset.id}},
    )
    return training, True


def _given_delta_units(spec: TrainingSpec) -> int:
    """The spec's δ in ledger units; 0 when it defaults to 1/n, not yet known."""
    return 0 if spec.delta is None else delta_units(spec.delta)


def _insert(
    session: Session,
    principal: Principal,
    dataset: Dataset,
    entry: LedgerEntry,
    draft: _Draft,
    features_sha256: str,
    spec: TrainingSpec,
    digest: str,
) -> Training:
    resolved, n = draft.resolved, draft.num_examples
    training = Training(
        id=str(uuid.uuid4()),
        dataset_id=dataset.id,
        ledger_entry_id=entry.id,
        created_by=principal.id,
        spec=resolved,
        features_sha256=features_sha256,
        num_examples=n,
        idempotency_key=spec.idempotency_key,
        request_fingerprint=digest,
        status=Status.QUEUED,
        attempts=0,
    )
    session.add(training)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="training.reserved",
        dataset_id=dataset.id,
        payload={
            "training_id": training.id,
            **audit.spend_payload(entry),
            "denoiser": resolved["denoiser"],
            "num_examples": n,
            "features_sha256": features_sha256,
        },
    )
    return training


# -- read, cancel ----------------------------------------------------------------------------


def get_visible(session: Session, principal: Principal, training_id: str) -> Training:
    """Admin: any training; client: its own; auditor: none (403) — as for releases."""
    require(principal, "admin", "client")
    training = session.get(Training, training_id)
    if training is None or not sees_own(
        session, principal, training.created_by, training.dataset_id
    ):
        raise NotFoundError(f"training {training_id} not found")
    return training


def cancel(
    session: Session, settings: Settings, principal: Principal, training_id: str
) -> Training:
    """Cancel a queued or running training (its budget stays spent: see above). Its
    checkpoint goes with the commit: a training handed back to the queue, or whose
    worker died, has no worker left to delete it (a live one that saves again
    drops its own once it sees the cancel)."""
    training = get_visible(session, principal, training_id)
    if not repository.queue(session).cancel(training.id):
        raise ConflictError(f"training {training_id} is already {training.status}")
    checkpoint = training_checkpoint_path(settings, training.id)
    delete_after_commit(session, checkpoint, "a cancelled training's checkpoint")
    session.refresh(training)
    audit.append(
        session,
        actor=principal.id,
        action="training.cancelled",
        dataset_id=training.dataset_id,
        payload={"training_id": training.id},
    )
    return training


def model_file(
    session: Session, settings: Settings, principal: Principal, training_id: str
) -> tuple[Training, Path]:
    training = get_visible(session, principal, training_id)
    if training.status != Status.SUCCEEDED or training.model_sha256 is None:
        raise ConflictError(f"training {training_id} has no model (it is {training.status})")
    path = training_model_path(settings, training.model_sha256)
    return training, persisted(settings, path, f"training {training.id}'s model")


def list_visible(
    session: Session, principal: Principal, dataset_id: str, *, after: str | None, limit: int
) -> tuple[list[TrainingRead], bool]:
    """A page of a dataset's trainings (a client's own only), and whether another
    page follows."""
    require(principal, "admin", "client")
    dataset = visible_dataset(session, principal, dataset_id)
    own = principal.id if principal.role == "client" else None
    trainings, more = repository.list_for_dataset(
        session, dataset.id, created_by=own, after=after, limit=limit
    )
    return [to_read(session, t) for t in trainings], more


def to_read(session: Session, training: Training) -> TrainingRead:
    entry = session.get(LedgerEntry, training.ledger_entry_id)
    assert entry is not None
    return TrainingRead(
        id=training.id,
        dataset_id=training.dataset_id,
        status=Status(training.status),
        epsilon=epsilon_decimal(entry.epsilon),
        delta=delta_decimal(entry.delta),
        spec=training.spec,
        num_examples=training.num_examples,
        features_sha256=training.features_sha256,
        progress=training.progress,
        accounting=training.accounting,
        metrics=training.metrics,
        sha256=training.model_sha256,
        error=training.error,
        attempts=training.attempts,
        lease_expires_at=training.lease_expires_at,
        stalled=repository.queue(session).stalled(training),
        idempotency_key=training.idempotency_key,
        created_at=training.created_at,
        started_at=training.started_at,
        finished_at=training.finished_at,
    )
