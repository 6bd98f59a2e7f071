"""Fetching a release: request (or look up) the manifest, download the Parquet,
verify its SHA-256 against the manifest, join with the feature set, store.

Nothing is stored unless every step succeeded: the file is downloaded to a
temporary path and moved to ``received/<sha256>.parquet`` only after the checks,
and the row commits after it (with the end of the key this service made for a
keyless release, which commits before the labels party is asked).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from feature_party.client import (
    BudgetExceededError,
    LabelsPartyClient,
    LabelsPartyError,
    LabelsPartyHTTPError,
    LabelsPartyUnavailableError,
    ReleaseIntegrityError,
)
from feature_party.config import Settings
from feature_party.db import end_reads, lock_name
from feature_party.errors import (
    ConflictError,
    FeaturePartyError,
    InvalidInputError,
    LabelsPartyRefusedError,
    NoRoomError,
    StorageUnavailableError,
    UpstreamError,
    no_join,
)
from feature_party.feature_sets.repository import FeatureSetRepository
from feature_party.orm import FeatureSet, PendingReleaseKey, ReceivedLabels
from feature_party.received_labels.repository import ReceivedLabelsRepository
from feature_party.received_labels.schemas import ReceivedLabelsCreate, ReceivedLabelsRead
from feature_party.training.dataset import count_join
from shared.errors import storage_problem
from shared.pagination import Pager
from shared.parquet import ParquetTooLargeError, publish, read_parquet_bounded
from shared.protocol import ReleaseRead
from shared.spending import merged_key


def make_client(settings: Settings, url: str, token: str) -> LabelsPartyClient:
    return LabelsPartyClient(
        url,
        token,
        timeout=settings.client_timeout_seconds,
        retries=settings.client_retries,
        backoff=settings.client_backoff_seconds,
    )


#: What the client raises that this service answers as its own error.
#: Every failure of the labels party's client (its base class last: an answer that is
#: not the JSON object it should be, from a proxy or another service at that URL).
UPSTREAM_ERRORS = (
    LabelsPartyUnavailableError,
    ReleaseIntegrityError,
    LabelsPartyHTTPError,
    LabelsPartyError,
)


#: The labels party's statuses that refuse the request's content, not a failure.
REFUSALS = frozenset({400, 401, 403, 404, 409, 413, 422})


def upstream_error(
    exc: LabelsPartyError,
) -> ConflictError | LabelsPartyRefusedError | UpstreamError:
    """The labels party's failure as this service's answer: 409 for its
    ``budget_exceeded``, its own 4xx for a refusal of what was asked
    (``labels_party_refused``), 502 otherwise (its status and body in ``detail``)."""
    if isinstance(exc, BudgetExceededError):
        return ConflictError(exc.message, code="budget_exceeded", detail=exc.detail)
    if isinstance(exc, LabelsPartyUnavailableError):
        return UpstreamError(
            str(exc), code="labels_party_unavailable", detail={"attempts": exc.attempts}
        )
    if isinstance(exc, ReleaseIntegrityError):
        return UpstreamError(str(exc), code="release_integrity_error")
    if not isinstance(exc, LabelsPartyHTTPError):
        return UpstreamError(f"the labels party answered unexpectedly: {exc}")
    detail = {"status": exc.status_code, "error": exc.error, "detail": exc.detail}
    if exc.status_code in REFUSALS:
        return LabelsPartyRefusedError(
            f"the labels party refused: {exc.message}", exc.status_code, detail
        )
    if exc.status_code == 507:
        return UpstreamError(
            f"the labels party's storage is full or cannot be written: retry once its "
            f"operator has freed space ({exc.message})",
            code=LABELS_PARTY_STORAGE,
            detail=detail,
        )
    return UpstreamError(f"the labels party failed: {exc.message}", detail=detail)


LABELS_PARTY_STORAGE = "labels_party_storage_unavailable"

#: Final answers of the labels party to a release request (refused, or charged and
#: failed), as this service passes them on: a key made for the request ends with
#: them. Its key outlives only an outcome the caller cannot know (no answer, a 5xx)
#: and a release made but not yet stored here.
ANSWERED = frozenset({"budget_exceeded", "labels_party_refused", "release_failed",
                      LABELS_PARTY_STORAGE})  # fmt: skip


def _integrity(message: str, release_id: str) -> UpstreamError:
    return UpstreamError(message, code="release_integrity_error", detail={"release_id": release_id})


def with_header_key(request: ReceivedLabelsCreate, header_key: str) -> ReceivedLabelsCreate:
    """``request`` whose new release carries the ``Idempotency-Key`` header's key
    (:func:`shared.spending.merged_key`); 422 for a header on a fetch."""
    if request.release is None:
        raise InvalidInputError(
            "the Idempotency-Key header is for a new release; a fetch by release_id is free"
        )
    try:
        key = merged_key(request.release.idempotency_key, header_key)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    keyed = request.release.model_copy(update={"idempotency_key": key})
    return request.model_copy(update={"release": keyed})


def _with_key(
    session: Session, request: ReceivedLabelsCreate
) -> tuple[ReceivedLabelsCreate, str | None]:
    """``request`` whose new release has an idempotency key, so that every error can
    name it, and the fingerprint of a key made here (None: the caller's key, or a
    fetch). A key made here is committed before the labels party is asked
    (:class:`PendingReleaseKey`): the caller never saw it if this service died or
    the labels party's answer was lost, and the same request again must not pay
    again. It lasts until the labels are stored: a keyless request after that is a
    new release (docs/protocol.md, Idempotency), as a caller that must not pay twice
    sends a key of its own."""
    if request.release is None or request.release.idempotency_key is not None:
        return request, None
    fingerprint = request_fingerprint(request)
    lock_name(session, f"pending-key-{fingerprint}")  # two identical requests: one key
    pending = session.get(PendingReleaseKey, fingerprint)
    if pending is None:
        pending = PendingReleaseKey(fingerprint=fingerprint, idempotency_key=uuid.uuid4().hex)
        session.add(pending)
    keyed = request.release.model_copy(update={"idempotency_key": pending.idempotency_key})
    session.commit()
    return request.model_copy(update={"release": keyed}), fingerprint


def request_fingerprint(request: ReceivedLabelsCreate) -> str:
    """What makes two keyless release requests the same one: the feature set, the
    labels party, its token (so one client never sends a key another made) and
    dataset, and the release asked for."""
    assert request.release is not None
    body = {
        "feature_set_id": request.feature_set_id,
        "labels_party_url": request.labels_party_url,
        "token": request.token.get_secret_value(),
        "dataset_id": request.dataset_id,
        "release": request.release.model_dump(mode="json", exclude={"idempotency_key"}),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _forget(session: Session, fingerprint: str | None, request: ReceivedLabelsCreate) -> None:
    """Drop a key made here once its request is settled (its release stored, or a
    final answer given: :data:`ANSWERED`): the same request again is a new one, at
    a new cost, as with a key of the caller's. Only this request's key: by then an
    identical request may have made the next one, which an answer lost to it
    must still find when it is retried."""
    if fingerprint is not None and request.release is not None:
        session.execute(
            delete(PendingReleaseKey).where(
                PendingReleaseKey.fingerprint == fingerprint,
                PendingReleaseKey.idempotency_key == request.release.idempotency_key,
            )
        )


def _naming_key(error: FeaturePartyError, key: str) -> FeaturePartyError:
    """``error`` from a release request that may have spent ε under ``key`` (a key
    this service made up when the caller gave none): its answer never came back,
    or the labels party charged a failed mechanism. The retry must send the key."""
    extra = error.detail if isinstance(error.detail, dict) else {"detail": error.detail}
    if extra.get("error") == "release_failed":
        error.code = "release_failed"
        error.message += (
            f"; retry with release.idempotency_key {key!r} to get this answer again "
            "without spending more"
        )
    else:
        error.message += (
            f"; the release may have been made: retry with release.idempotency_key {key!r} "
            "to get it without spending again"
        )
    error.detail = {"idempotency_key": key, **extra}
    return error


def _fetch(client: LabelsPartyClient, request: ReceivedLabelsCreate, tmp: Path) -> ReleaseRead:
    try:
        if request.release is not None:
            manifest = client.create_release(request.dataset_id, request.release)
        else:
            assert request.release_id is not None
            manifest = client.get_release(request.release_id)
    except UPSTREAM_ERRORS as exc:
        error = upstream_error(exc)
        charged = isinstance(error.detail, dict) and error.detail.get("error") == "release_failed"
        full = error.code == LABELS_PARTY_STORAGE
        if request.release is not None and full:  # 507: refused or rolled back, unspent
            error.message += "; nothing was spent there"
        unknown = isinstance(error, UpstreamError) and not full
        if request.release is not None and (unknown or charged):
            assert request.release.idempotency_key is not None  # _with_key
            raise _naming_key(error, request.release.idempotency_key) from None
        raise error from None
    if manifest.dataset_id != request.dataset_id:
        raise InvalidInputError(
            f"release {manifest.id} belongs to dataset {manifest.dataset_id}, "
            f"not {request.dataset_id}",
            code="release_dataset_mismatch",
            detail={"release_id": manifest.id},
        )
    try:
        client.download_labels(
            manifest.id, tmp, expected_sha256=manifest.sha256, max_bytes=_most_bytes(manifest)
        )
    except UPSTREAM_ERRORS as exc:
        raise _naming_release(upstream_error(exc), manifest.id, request) from None
    except OSError as exc:  # writing the download here failed, after the release was made
        if storage_problem(exc) is None:
            raise
        raise _naming_release(StorageUnavailableError(exc), manifest.id, request) from None
    return manifest


#: Room a received release needs per label (its id, its value, Parquet's framing),
#: and for the rest (the database's commit, a copy in flight).
ROOM_PER_LABEL, ROOM_BASE = 128, 16 << 20

#: A release file's size may not pass this per label (ids are the labels party's,
#: of any length) plus ``ROOM_BASE``: a download past it is refused, not stored.
MOST_BYTES_PER_LABEL = 4096


def _most_bytes(manifest: ReleaseRead) -> int:
    return manifest.num_labels * MOST_BYTES_PER_LABEL + ROOM_BASE


def _check_room(settings: Settings, client: LabelsPartyClient, dataset_id: str, tmp: Path) -> None:
    """Refuse, before the labels party spends anything, a new release this data
    directory plainly cannot take (the dataset's label count is public)."""
    try:
        num_labels = int(client.get_dataset(dataset_id).get("num_labels") or 0)
    except LabelsPartyError:  # not known here: the release request will say why
        num_labels = 0
    need = num_labels * ROOM_PER_LABEL + ROOM_BASE
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.touch()  # an unwritable directory fails here, not after the release
    tmp.unlink()
    free = shutil.disk_usage(settings.data_dir).free
    if free < need:
        raise NoRoomError(
            f"the data directory has {free} bytes free; a release of {num_labels} labels "
            f"needs about {need}: its operator must free space. This request asked nothing "
            "of the labels party",
            detail={"free_bytes": free, "needed_bytes": need},
        )


def _naming_release(error: FeaturePartyError, release_id: str, request: ReceivedLabelsCreate
                    ) -> FeaturePartyError:  # fmt: skip
    """``error`` carrying the release it concerns. Once this request has made a
    release, its ε is spent: a retry must name the release (``release_id``), not ask
    for a new one, which a fresh idempotency key would pay for again."""
    if request.release is not None:
        error.message += (
            f"; release {release_id} was made and its ε spent: fetch it again at no cost "
            "with its release_id"
        )
    if isinstance(error.detail, dict):
        error.detail = {"release_id": release_id, **error.detail}
    else:
        error.detail = {"release_id": release_id, "detail": error.detail}
    return error


def _store(
    settings: Settings, feature_set: FeatureSet, manifest: ReleaseRead, tmp: Path
) -> tuple[int, int, Path]:
    """Check the downloaded release against its manifest, count its join with the
    feature set and move it into place: (matched, unmatched, its relative path)."""
    try:
        names = pq.ParquetFile(tmp).schema_arrow.names
        if not {"example_id", "label"} <= set(names):
            raise _integrity("the release lacks example_id or label columns", manifest.id)
        # Its two columns only, bounded as an upload is: 1.5 kB of a padded release
        # decoded to 1 GB when read whole.
        labels = read_parquet_bounded(tmp, columns=["example_id", "label"])
    except ParquetTooLargeError as exc:
        raise _integrity(
            f"the release decodes to more than {exc.limit:,} bytes for its size", manifest.id
        ) from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise _integrity(f"the release is not a Parquet file: {exc}", manifest.id) from None
    kind = labels.schema.field("label").type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise _integrity(f"the release's labels are {kind}, not numbers", manifest.id)
    if labels.num_rows != manifest.num_labels:
        raise _integrity(
            f"the release holds {labels.num_rows} rows, the manifest says {manifest.num_labels}",
            manifest.id,
        )
    ids, values = labels.column("example_id"), labels.column("label")
    # Named for what they are: a null id read as "repeats example_ids", and a NaN or
    # infinite label was stored, to train on (helper-86).
    if ids.null_count:
        raise _integrity(f"the release has {ids.null_count} null example_ids", manifest.id)
    if values.null_count or pc.all(pc.is_finite(values)).as_py() is False:
        raise _integrity("the release's labels include a null, NaN or infinite one", manifest.id)
    if pc.count_distinct(ids).as_py() != labels.num_rows:
        raise _integrity("the release repeats example_ids", manifest.id)
    matched, unmatched = count_join(settings.data_dir / feature_set.path, labels)
    if matched == 0:
        raise no_join(
            "no received label joins the feature set on example_id; use a feature set "
            "that covers its example_ids",
            num_labels=manifest.num_labels,
            num_features=feature_set.num_rows,
            matched=matched,
            unmatched=unmatched,
        )
    relative = Path("received") / f"{manifest.sha256}.parquet"
    publish(tmp, settings.data_dir / relative)  # durable before its row commits
    return matched, unmatched, relative


def receive(
    session: Session, settings: Settings, request: ReceivedLabelsCreate
) -> tuple[ReceivedLabelsRead, bool]:
    """The received release and whether it was recorded now (False: this feature set
    holds it already, as a retry whose answer was lost finds it, and that row is
    the answer)."""
    feature_set = FeatureSetRepository(session).get(request.feature_set_id)
    end_reads(session)
    request, pending = _with_key(session, request)
    tmp = settings.data_dir / "tmp" / f"{uuid.uuid4().hex}.parquet"
    try:
        with make_client(
            settings, request.labels_party_url, request.token.get_secret_value()
        ) as client:
            if request.release is not None:
                _check_room(settings, client, request.dataset_id, tmp)
            try:
                manifest = _fetch(client, request, tmp)
            except FeaturePartyError as exc:
                if exc.code in ANSWERED:  # the caller has the answer; a new request is new
                    _forget(session, pending, request)
                    session.commit()
                raise
        known = _known(session, feature_set.id, request, manifest.id)
        if known is not None:  # a retry: no join to count again
            _forget(session, pending, request)
            session.commit()
            return known, False
        try:
            matched, unmatched, relative = _store(settings, feature_set, manifest, tmp)
        except FeaturePartyError as exc:
            raise _naming_release(exc, manifest.id, request) from None
        except OSError as exc:
            if storage_problem(exc) is None:
                raise
            raise _naming_release(StorageUnavailableError(exc), manifest.id, request) from None
    finally:
        tmp.unlink(missing_ok=True)

    # Two receipts of one release at once both found none above: the second to get
    # here answers with the first's row (the file is the same, by hash). Locked only
    # now, after the download and the join: on SQLite this is the write lock.
    lock_name(session, f"receive-{feature_set.id}-{request.labels_party_url}-"
                       f"{request.dataset_id}-{manifest.id}")  # fmt: skip
    known = _known(session, feature_set.id, request, manifest.id)
    _forget(session, pending, request)
    if known is not None:
        session.commit()
        return known, False
    row = _record_naming_release(
        session,
        ReceivedLabels(
            id=uuid.uuid4().hex,
            feature_set_id=feature_set.id,
            labels_party_url=request.labels_party_url,
            dataset_id=request.dataset_id,
            release_id=manifest.id,
            manifest=manifest.model_dump(mode="json"),
            sha256=manifest.sha256,
            path=str(relative),
            num_labels=manifest.num_labels,
            matched=matched,
            unmatched=unmatched,
        ),
        request,
    )
    return to_read(row), True


def _known(
    session: Session, feature_set_id: str, request: ReceivedLabelsCreate, release_id: str
) -> ReceivedLabelsRead | None:
    row = ReceivedLabelsRepository(session).find(
        feature_set_id, request.labels_party_url, request.dataset_id, release_id
    )
    return None if row is None else to_read(row)


def _record_naming_release(
    session: Session, row: ReceivedLabels, request: ReceivedLabelsCreate
) -> ReceivedLabels:
    """The commit of the row of a release the labels party has charged for (and of
    the end of its pending key, if this service made one). A database that refuses
    it (full, or a value past a column's size) must answer with the release and the
    key to fetch it again at no cost, which the request's unit of work, committing
    after the answer was built, could not."""
    release_id = row.release_id
    try:
        ReceivedLabelsRepository(session).add(row)
        session.commit()
    except DBAPIError as exc:
        session.rollback()
        error: FeaturePartyError = (
            StorageUnavailableError(exc)
            if storage_problem(exc) is not None
            else FeaturePartyError(
                f"the service could not record the release ({type(exc).__name__})"
            )
        )
        raise _naming_release(error, release_id, request) from None
    return row


def get(session: Session, id_: str) -> ReceivedLabelsRead:
    return to_read(ReceivedLabelsRepository(session).get(id_))


def list_page(
    session: Session, pager: Pager, *, feature_set_id: str | None, dataset_id: str | None
) -> list[ReceivedLabelsRead]:
    query = select(ReceivedLabels)
    if feature_set_id is not None:
        query = query.where(ReceivedLabels.feature_set_id == feature_set_id)
    if dataset_id is not None:
        query = query.where(ReceivedLabels.dataset_id == dataset_id)
    return [to_read(row) for row in pager.rows(session, query, ReceivedLabels)]


def to_read(row: ReceivedLabels) -> ReceivedLabelsRead:
    return ReceivedLabelsRead(
        id=row.id,
        feature_set_id=row.feature_set_id,
        dataset_id=row.dataset_id,
        release_id=row.release_id,
        num_labels=row.num_labels,
        matched=row.matched,
        unmatched=row.unmatched,
        sha256=row.sha256,
        manifest=row.manifest,
        created_at=row.created_at,
    )
