"""``/v1/datasets/{id}/trainings`` and ``/v1/trainings/{id}``: LabelDP-Pro model releases."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile

from label_party.auth import require
from label_party.deps import (
    PrincipalDep,
    SessionDep,
    SettingsDep,
    in_worker_thread,
    visible_before_upload,
    with_idempotency_key,
)
from label_party.exception_handlers import responses
from label_party.exceptions import InvalidRequestError
from label_party.labels.endpoints import multipart_body
from label_party.labels.validation import file_format
from label_party.trainings import service
from label_party.trainings.schemas import TrainingRead
from shared import pagination
from shared.spending import IdempotencyKeyHeader

#: A spec is a small JSON object; a larger "spec" part is a mistake, not a spec.
MAX_SPEC_BYTES = 64 * 1024


async def _spec_text(part: UploadFile) -> str:
    data = await part.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise InvalidRequestError(f"the spec is over {MAX_SPEC_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError("the spec is not UTF-8 JSON") from None


router = APIRouter(tags=["trainings"])

TRAINING_BODY = multipart_body(
    "public features: .parquet, .csv or .jsonl with example_id and numeric columns",
    {"spec": {"type": "string", "description": "JSON training spec (TrainingSpec)"}},
)


@router.post(
    "/v1/datasets/{dataset_id}/trainings",
    status_code=status.HTTP_201_CREATED,
    response_model=TrainingRead,
    responses={
        200: {"model": TrainingRead, "description": "Idempotent replay: nothing spent"},
        **responses(401, 403, 404, 409, 413, 422),
    },
    openapi_extra=TRAINING_BODY,
    summary="Spend (ε, δ) on a LabelDP-Pro model trained on your features (admin, granted client)",
    description="Multipart `file` (public features: `example_id` and numeric columns) and "
    "`spec` (JSON: `epsilon`, `delta` (default 1/n), `denoiser`, `architecture`, "
    "`epochs`, …). Classification datasets only. Before anything is charged the noise "
    "plan the worker will train with (sampling rate, steps, noise multiplier σ) is "
    "calibrated and returned in `spec.plan`; a spec that cannot be trained as asked "
    "(σ above B·√T, δ not below 1) is refused with 422 and spends nothing. The budget "
    "is charged now, in the request's transaction, and never refunded; 409 "
    "`budget_exceeded` stores nothing. A labels-party worker trains the model; follow "
    "`GET /v1/trainings/{id}`.",
)
async def create_training(
    dataset_id: str,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> TrainingRead:
    require(principal, "admin", "client")
    await visible_before_upload(request, principal, dataset_id)
    # Two files at most: curl's -F spec=@spec.json sends the spec as one.
    form = await request.form(max_files=2, max_fields=10)
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequestError("the multipart field 'file' is required")
        raw_spec = form.get("spec")
        if isinstance(raw_spec, UploadFile):
            raw_spec = await _spec_text(raw_spec)
        spec = service.parse_spec(raw_spec if isinstance(raw_spec, str) else None)
        spec = with_idempotency_key(spec, idempotency_key)
        fmt = file_format(upload.filename, upload.content_type)
        source = upload.file

        def work() -> tuple[TrainingRead, bool]:
            training, created = service.create(
                session, settings, principal, dataset_id, spec, source, fmt,
                unlocked=request.app.state.db.reader,
            )  # fmt: skip
            return service.to_read(session, training), created

        read, created = await in_worker_thread(work)
    finally:
        await form.close()
    if not created:
        response.status_code = status.HTTP_200_OK
    return read


@router.get(
    "/v1/datasets/{dataset_id}/trainings",
    response_model=list[TrainingRead],
    responses=responses(401, 403, 404, 422),
    summary="Trainings of a dataset (a client: its own), oldest first, a page at a time",
    description="At most `limit` trainings; while more follow, the `Link` header's "
    '`rel="next"` URL gives the next page.',
)
def list_trainings(
    dataset_id: str,
    request: Request,
    response: Response,
    session: SessionDep,
    principal: PrincipalDep,
    after: pagination.After = None,
    limit: pagination.Limit = pagination.DEFAULT_LIMIT,
) -> list[TrainingRead]:
    trainings, more = service.list_visible(session, principal, dataset_id, after=after, limit=limit)
    if more:
        pagination.link_next(request, response, trainings[-1].id, limit)
    return trainings


@router.get(
    "/v1/trainings/{training_id}",
    response_model=TrainingRead,
    responses=responses(401, 403, 404),
    summary="A training: status, progress, and its accounting record once done",
)
def get_training(training_id: str, session: SessionDep, principal: PrincipalDep) -> TrainingRead:
    return service.to_read(session, service.get_visible(session, principal, training_id))


@router.delete(
    "/v1/trainings/{training_id}",
    response_model=TrainingRead,
    responses=responses(401, 403, 404, 409),
    summary="Cancel a queued or running training (its budget stays spent)",
)
async def cancel_training(
    training_id: str, session: SessionDep, settings: SettingsDep, principal: PrincipalDep
) -> TrainingRead:
    def work() -> TrainingRead:
        cancelled = service.cancel(session, settings, principal, training_id)
        return service.to_read(session, cancelled)

    return await in_worker_thread(work)


@router.get(
    "/v1/trainings/{training_id}/model",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The model artifact (`labeldp-model/1`, "
            "`torch.load(path, weights_only=True)`); the same bytes every time",
            "content": {"application/octet-stream": {}},
        },
        **responses(401, 403, 404, 409, 500),
    },
    summary="Download a trained model (free: the persisted bytes)",
)
def download_model(
    training_id: str, session: SessionDep, settings: SettingsDep, principal: PrincipalDep
) -> FileResponse:
    training, path = service.model_file(session, settings, principal, training_id)
    sha = training.model_sha256 or ""
    return FileResponse(
        path,
        media_type="application/octet-stream",
        filename=f"training-{training.id}.pt",
        headers={"X-Content-SHA256": sha, "ETag": f'"{sha}"'},
    )
