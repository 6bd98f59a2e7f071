"""Releases: one transaction reserves the budget, randomizes, persists, records.

Order inside the transaction (DESIGN.md §3.3): lock the dataset row → replay an
idempotent request (spends nothing) → reserve the cost in the ledger (or refuse,
logging the refusal) → fit and randomize into a file named by its SHA-256 →
release row and audit entry → commit (by the request session). A refusal before
the reservation, or one that reads ids only, rolls everything back; so does an
OS error that does not depend on what was written (a missing file, permissions,
I/O), and a crash before the commit, whose file is unreferenced and swept at the
next start. Any other failure once the labels are read is charged
(``release.failed``, :class:`ReleaseFailedError`): whether a mechanism fails can
depend on the labels (an LP on a noisy prior, a discrete mechanism's
integrality), and whether the disk has room for the release's file
(``CAPACITY_ERRNOS``) depends on its size, a function of its noisy labels, so a
refusal that cost nothing would be a free, repeatable query of them. Such a
failure says only that it failed. Before the reservation a release must find
room for a label-independent bound on its file (:mod:`label_party.releases.room`),
so a disk that is plainly full costs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy.orm import Session, sessionmaker

from label_party.audit import service as audit
from label_party.auth import Principal, confirm, require, sees_own, visible_dataset
from label_party.config import Settings
from label_party.datasets.domain import parse_domain
from label_party.db import transaction
from label_party.example_priors import service as example_priors
from label_party.exceptions import (
    ConflictError,
    IdempotencyConflictError,
    InvalidRequestError,
    LabelPartyError,
    NotFoundError,
    ReleaseFailedError,
)
from label_party.labels.validation import MAX_REPORTED
from label_party.ledger import service as ledger
from label_party.ledger.accounting import Cost, normalize_parts
from label_party.ledger.units import delta_decimal, epsilon_decimal, epsilon_units
from label_party.mechanisms.base import LOSSES, MechanismError, secure_generator
from label_party.mechanisms.registry import get_spec
from label_party.models import Dataset, LedgerEntry, Release, ReleaseFailure
from label_party.observability import RELEASES
from label_party.partitions.service import get_plan
from label_party.releases import repository, room
from label_party.releases.pipeline import (
    Randomized,
    ReleasePlan,
    check_plan,
    preflight,
    prior_source,
    randomize,
    randomize_with_example_priors,
)
from label_party.storage import labels_path, partition_path, persisted
from shared.errors import CAPACITY_ERRNOS
from shared.logging import exception_fields
from shared.parquet import publish_by_hash, temp_path
from shared.protocol import MechanismDescription, ReleaseCreate, ReleaseRead, Task, amount_text

logger = logging.getLogger("label_party.releases")


def jsonable(value: Any) -> Any:
    """Plain JSON types (mechanism descriptions may hold numpy scalars or arrays)."""

    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return obj.tolist()
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"not JSON serializable: {type(obj).__name__}")

    return json.loads(json.dumps(value, default=default))


def fingerprints(body: ReleaseCreate) -> tuple[str, str]:
    """The request's digest for its idempotency key, and the digest of it as sent,
    which releases made before 2026-11-25 stored.

    The first is of the request as the ledger reads it: its amounts exact, its parts
    as a set and its loss named, so that a retry listing the parts in another order
    (as a manifest lists them) or naming the default loss is the same request, not a
    conflict, and two ε that one double stands for are not."""
    data = body.model_dump(mode="json", exclude={"idempotency_key"})
    as_sent = hashlib.sha256(audit.canonical(data).encode()).hexdigest()
    parts = normalize_parts(body.parts)
    data["parts"] = None if parts is None else list(parts)
    data["mechanism"]["loss"] = _loss(body)
    data["epsilon"], data["prior_epsilon"] = map(amount_text, (body.epsilon, body.prior_epsilon))
    return hashlib.sha256(audit.canonical(data).encode()).hexdigest(), as_sent


def _loss(body: ReleaseCreate) -> str:
    """The release's loss: the request's, or its mechanism's task's default."""
    spec = get_spec(body.mechanism.name)
    return body.mechanism.loss or ("zero-one" if spec.task == "classification" else "squared")


def _plan(body: ReleaseCreate, dataset: Dataset) -> ReleasePlan:
    loss = _loss(body)
    if loss not in LOSSES:
        raise InvalidRequestError(f"unknown loss {loss!r}")
    plan = ReleasePlan(
        mechanism=body.mechanism.name,
        params=body.mechanism.options(),
        loss=loss,  # type: ignore[arg-type]
        epsilon=body.epsilon,
        prior_epsilon=body.prior_epsilon,
        domain=parse_domain(dataset.task, dataset.label_domain),
    )
    check_plan(plan, dataset.task)
    if body.prior_epsilon is not None:
        # Before anything is reserved: checked when the release row was written, it
        # came after the labels were randomized and their file published (helper-69).
        epsilon_units(body.prior_epsilon, "prior_epsilon")
    return plan


def _example_priors(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset: Dataset,
    plan: ReleasePlan,
) -> example_priors.LoadedPriors | None:
    """The prior set a ``groups`` / ``example`` release names, loaded (None: global);
    its refusals come before anything is reserved, and depend on no label."""
    source = prior_source(plan)
    if source == "global":
        return None
    prior = example_priors.get(session, principal, dataset.id, str(plan.params["prior_id"]))
    wanted = "groups" if source == "groups" else "probabilities"
    if prior.kind != wanted:
        raise InvalidRequestError(
            f"prior_source {source!r} needs a prior set of kind {wanted!r}; "
            f"{prior.id} is {prior.kind!r}"
        )
    if prior.num_classes is not None and prior.num_classes != plan.domain.size:
        raise InvalidRequestError("the prior set's number of classes differs from the dataset's")
    if prior.num_groups is not None:  # a set stored before the bound was checked at upload
        example_priors.check_group_cells(prior.num_groups, plan.domain.size)
    return example_priors.load(settings, prior)


def _selected_ids(
    settings: Settings, session: Session, dataset: Dataset, parts: tuple[str, ...]
) -> pa.Array:
    plan = get_plan(session, dataset.id)
    if plan is None:
        raise InvalidRequestError("the dataset has no partition plan; omit parts")
    unknown = sorted(set(parts) - set(plan.parts))
    if unknown:
        # The request may name any number of parts: echo a bounded few.
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise InvalidRequestError(
            f"unknown part(s): {', '.join(unknown[:20])}{more}",
            {"unknown": unknown[:MAX_REPORTED], "num_unknown": len(unknown)},
        )
    table = pq.read_table(persisted(settings, partition_path(settings, plan), "the partition plan"))
    mask = pc.is_in(table.column("part"), value_set=pa.array(list(parts), pa.string()))
    return table.column("example_id").filter(mask).combine_chunks()


def _labels_in_scope(settings: Settings, dataset: Dataset, selected: pa.Array | None) -> int:
    """How many labelled examples a release touches, from ids alone (no label read)."""
    if selected is None:
        return dataset.num_labels or 0
    ids = pq.read_table(labels_path(settings, dataset), columns=["example_id"]).column(0)
    return int(pc.sum(pc.is_in(ids, value_set=selected)).as_py() or 0)


def _generators(
    settings: Settings, session: Session, dataset: Dataset
) -> tuple[np.random.Generator, random.Random | None]:
    """The release's randomness: 128 fresh OS bits (DESIGN.md §3.5), or, only
    behind the test-mode setting ``LABELDP_TEST_SEED``, a seed and a counter."""
    if settings.test_seed is None:
        return secure_generator(), None
    count = repository.count(session, dataset.id)
    return np.random.default_rng([settings.test_seed, count]), random.Random(
        settings.test_seed * 1_000_003 + count
    )


@dataclass(frozen=True)
class _Scope:
    """What a release request asks for, checked against its dataset (ids only)."""

    plan: ReleasePlan
    parts: tuple[str, ...] | None
    selected: pa.Array | None  # the ids in scope, or None for the whole dataset
    in_scope: int  # labelled examples in scope
    cost: Cost


def _scope(settings: Settings, session: Session, dataset: Dataset, body: ReleaseCreate) -> _Scope:
    if dataset.labels_sha256 is None:
        raise ConflictError("the dataset has no labels yet")
    # A file the row names and the disk lacks (lost, or the rare unlink of two
    # uploads that alternated: helper-72) is file_missing, not a bare 500.
    persisted(settings, labels_path(settings, dataset), "the dataset's labels")
    plan = _plan(body, dataset)
    parts = normalize_parts(body.parts)
    selected = None if parts is None else _selected_ids(settings, session, dataset, parts)
    in_scope = _labels_in_scope(settings, dataset, selected)
    return _Scope(plan, parts, selected, in_scope, Cost(epsilon_units(body.epsilon), 0, parts))


def _precheck(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset_id: str,
    body: ReleaseCreate,
) -> None:
    """The fit of the mechanism to a uniform prior (:func:`preflight`; seconds for a
    large LP), in a read transaction that locks nothing, leaving its verdict in
    preflight's cache; not for a replay or a request beyond the budget, which
    :func:`create` answers at once. A refusal here is the one :func:`create` would
    give."""
    dataset = visible_dataset(session, principal, dataset_id)
    key = body.idempotency_key
    if key is not None and (
        repository.by_idempotency_key(session, dataset.id, key) is not None
        or repository.failure_by_idempotency_key(session, dataset.id, key) is not None
    ):
        return
    if dataset.labels_sha256 is not None and not labels_path(settings, dataset).is_file():
        return  # replaced since this row was read, or lost: the locked path decides (and logs)
    try:
        scope = _scope(settings, session, dataset, body)
    except FileNotFoundError:
        # Labels replaced since this row was read took their file with them: the
        # head start is off, and the locked path, which reads the row anew, decides.
        return
    if ledger.affordable(session, dataset, scope.cost):
        preflight(scope.plan, scope.in_scope, fit_seconds=settings.release_fit_seconds)


def create(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset_id: str,
    body: ReleaseCreate,
    *,
    unlocked: sessionmaker[Session],
) -> tuple[Release, bool]:
    """The release for ``body`` and whether it was made now (False: an idempotent replay).

    The slow free check runs first in a short read transaction of ``unlocked``
    (:func:`_precheck`), before ``session`` locks the dataset row, which on SQLite
    is the whole database's write lock: a large LP's fit there held every other
    writer, for free, for as long as it took (and a request beyond the budget
    is refused under the lock before any fit)."""
    require(principal, "admin", "client")
    with transaction(unlocked) as reader:
        _precheck(reader, settings, principal, dataset_id, body)
    dataset = visible_dataset(session, principal, dataset_id)
    dataset = ledger.lock_dataset(session, dataset.id)
    confirm(session, principal)
    digests = fingerprints(body)
    digest = digests[0]
    if body.idempotency_key is not None:
        existing = repository.by_idempotency_key(session, dataset.id, body.idempotency_key)
        if existing is not None:
            if existing.request_fingerprint not in digests or existing.created_by != principal.id:
                raise IdempotencyConflictError(
                    "this idempotency key was used for a different request"
                )
            return existing, False
        failed = repository.failure_by_idempotency_key(session, dataset.id, body.idempotency_key)
        if failed is not None:
            if failed.request_fingerprint not in digests or failed.created_by != principal.id:
                raise IdempotencyConflictError(
                    "this idempotency key was used for a different request"
                )
            raise _failure_error(failed.mechanism, session.get(LedgerEntry, failed.ledger_entry_id))
    scope = _scope(settings, session, dataset, body)
    selected, in_scope = scope.selected, scope.in_scope
    # Before the fit: a request the budget cannot afford costs no work under the lock.
    ledger.refuse_unless_affordable(session, principal, dataset, scope.cost, what="release")
    priors = _example_priors(session, settings, principal, dataset, scope.plan)
    plan = preflight(scope.plan, in_scope, fit_seconds=settings.release_fit_seconds)
    with room.promised(settings, labels_path(settings, dataset), in_scope):
        entry = ledger.reserve(session, principal, dataset, scope.cost)
        rng, prior_rng = _generators(settings, session, dataset)
        tmp = temp_path(settings.tmp_dir, ".parquet")
        try:
            result = _randomize(settings, dataset, plan, priors, selected, rng, prior_rng, tmp)
            if settings.test_crash_point == "release_mechanism_fails":
                raise MechanismError("injected by LABELDP_TEST_CRASH_POINT")
            if settings.test_crash_point == "release_io_error":
                raise OSError(errno.EIO, "injected by LABELDP_TEST_CRASH_POINT")
            _final, sha = publish_by_hash(tmp, settings.releases_dir)
        except Exception as exc:
            if not _charged(exc):
                raise  # rolled back, nothing spent
            session.add(
                ReleaseFailure(
                    id=str(uuid.uuid4()),
                    dataset_id=dataset.id,
                    ledger_entry_id=entry.id,
                    created_by=principal.id,
                    mechanism=plan.mechanism,
                    idempotency_key=body.idempotency_key,
                    request_fingerprint=digest,
                )
            )
            raise _charged_failure(session, principal, dataset, entry, plan, exc) from None
        finally:
            with contextlib.suppress(OSError):  # never in place of the charged failure
                tmp.unlink(missing_ok=True)

    prior_units = epsilon_units(result.prior_epsilon)
    release = Release(
        id=str(uuid.uuid4()),
        dataset_id=dataset.id,
        ledger_entry_id=entry.id,
        created_by=principal.id,
        prior_epsilon=prior_units,
        mechanism=jsonable(result.description),
        prior=result.prior,
        num_labels=result.num_labels,
        sha256=sha,
        idempotency_key=body.idempotency_key,
        request_fingerprint=digest,
    )
    session.add(release)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="release.created",
        dataset_id=dataset.id,
        payload={
            "release_id": release.id,
            **audit.spend_payload(entry),
            "prior_epsilon_units": prior_units,
            "mechanism": plan.mechanism,
            "num_labels": result.num_labels,
            "sha256": sha,
            # Only for releases with example priors: which prior set they used.
            **(
                {}
                if priors is None
                else {"prior_source": prior_source(plan), "prior_id": priors.prior_id}
            ),
        },
    )
    RELEASES.labels(mechanism=plan.mechanism).inc()
    logger.info(
        "release persisted",
        extra={"fields": {"release_id": release.id, "dataset_id": dataset.id}},
    )
    if settings.test_crash_point == "release_before_commit":
        os.kill(os.getpid(), signal.SIGKILL)
    return release, True


def _charged(exc: Exception) -> bool:
    """Whether a failure after the reservation is charged: any but a refusal that
    reads ids only (ours), or an OS error that does not depend on what was written
    (a missing file, permissions, I/O): the disk having no room for the file
    (``CAPACITY_ERRNOS``) does, through its size."""
    if isinstance(exc, LabelPartyError):
        return False
    return not isinstance(exc, OSError) or exc.errno in CAPACITY_ERRNOS


def _randomize(
    settings: Settings,
    dataset: Dataset,
    plan: ReleasePlan,
    priors: example_priors.LoadedPriors | None,
    selected: pa.Array | None,
    rng: np.random.Generator,
    prior_rng: random.Random | None,
    out_file: Path,
) -> Randomized:
    labels_file, chunk = labels_path(settings, dataset), settings.chunk_size
    if priors is None:
        return randomize(plan, labels_file=labels_file, out_file=out_file, selected=selected,
                         rng=rng, prior_rng=prior_rng, chunk_size=chunk)  # fmt: skip
    return randomize_with_example_priors(
        plan, priors, labels_file=labels_file, out_file=out_file, selected=selected,
        rng=rng, prior_rng=prior_rng, chunk_size=chunk,
    )  # fmt: skip


def _charged_failure(
    session: Session,
    principal: Principal,
    dataset: Dataset,
    entry: LedgerEntry,
    plan: ReleasePlan,
    exc: Exception,
) -> ReleaseFailedError:
    """Keep the reservation, log ``release.failed``; the error to raise."""
    audit.append(
        session,
        actor=principal.id,
        action="release.failed",
        dataset_id=dataset.id,
        payload={**audit.spend_payload(entry), "mechanism": plan.mechanism},
    )
    # The type, errno and place only: the text may describe the labels (DESIGN.md §3.1).
    logger.warning(
        "release failed after reading the labels; its ε is spent",
        extra={"fields": {"dataset_id": dataset.id, **exception_fields(exc)}},
    )
    return _failure_error(plan.mechanism, entry)


def _failure_error(mechanism: str, entry: LedgerEntry | None) -> ReleaseFailedError:
    """The same answer for a charged failure and for each replay of its key."""
    assert entry is not None  # a failure's ledger entry is never deleted
    return ReleaseFailedError(
        f"the {mechanism} release failed after reading the labels: its mechanism failed, "
        "or the disk had no room for its file (the service's log says which). Its ε is "
        "spent: whether it fails may depend on the labels, so the failure is charged and "
        "its reason withheld; a retry with the same idempotency key spends nothing more. "
        "Try another mechanism or a smaller ε, or ask the operator whether storage is full",
        detail={
            "ledger_entry_id": entry.id,
            "epsilon_spent": format(epsilon_decimal(entry.epsilon).normalize(), "f"),
        },
    )


def get_visible(session: Session, principal: Principal, release_id: str) -> Release:
    """Admin: any release; client: its own; auditor: none (403)."""
    require(principal, "admin", "client")
    release = session.get(Release, release_id)
    if release is None or not sees_own(session, principal, release.created_by, release.dataset_id):
        raise NotFoundError(f"release {release_id} not found")
    return release


def list_visible(
    session: Session, principal: Principal, dataset_id: str, *, after: str | None, limit: int
) -> tuple[list[ReleaseRead], bool]:
    """A page of a dataset's release manifests (a client's own only), in three
    queries, and whether another page follows."""
    require(principal, "admin", "client")
    dataset = visible_dataset(session, principal, dataset_id)
    own = principal.id if principal.role == "client" else None
    releases, more = repository.list_for_dataset(
        session, dataset.id, created_by=own, after=after, limit=limit
    )
    entries = repository.ledger_entries(session, releases)
    return [to_read(session, r, entries[r.ledger_entry_id]) for r in releases], more


def to_read(session: Session, release: Release, entry: LedgerEntry | None = None) -> ReleaseRead:
    entry = entry or session.get(LedgerEntry, release.ledger_entry_id)
    assert entry is not None
    description: dict[str, Any] = release.mechanism
    dataset = session.get(Dataset, release.dataset_id)  # loaded already: no query
    assert dataset is not None
    return ReleaseRead(
        id=release.id,
        dataset_id=release.dataset_id,
        task=cast(Task, dataset.task),
        epsilon=epsilon_decimal(entry.epsilon),
        delta=delta_decimal(entry.delta),
        prior_epsilon=epsilon_decimal(release.prior_epsilon),
        mechanism=MechanismDescription.model_validate(description),
        prior=release.prior,
        num_labels=release.num_labels,
        sha256=release.sha256,
        parts=entry.parts,
        idempotency_key=release.idempotency_key,
        created_at=release.created_at,
    )
