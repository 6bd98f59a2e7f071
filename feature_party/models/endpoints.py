"""``/v1/models``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.datastructures import UploadFile

from feature_party.config import Settings
from feature_party.deps import SessionDep, SettingsDep
from feature_party.errors import InvalidInputError
from feature_party.exception_handlers import ERROR_RESPONSES
from feature_party.models import service
from feature_party.models.schemas import ModelImport, ModelRead, Predictions, PredictRows
from feature_party.uploads import spooled
from shared.limits import is_multipart
from shared.pagination import PAGED, PagerDep
from shared.protocol import ErrorBody

router = APIRouter(prefix="/v1/models", tags=["models"], responses=ERROR_RESPONSES)

_PREDICT_BODY: dict[str, Any] = {
    "requestBody": {
        "content": {
            "application/json": {"schema": PredictRows.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
        }
    }
}


def _predict_upload(
    session: Session, settings: Settings, model_id: str, upload: UploadFile
) -> service.PredictionAnswer:
    directory = settings.data_dir / "tmp"
    with spooled(upload, directory=directory, max_bytes=settings.max_upload_bytes) as path:
        return service.predict_file(session, settings, model_id, path, upload.filename)


@router.post(
    "/import",
    response_model=ModelRead,
    status_code=201,
    responses={
        409: {"model": ErrorBody, "description": "training_not_ready: it has not succeeded"},
        502: {"model": ErrorBody, "description": "labels party unreachable or failing, or "
              "invalid_model: the model does not load"},
    },
)  # fmt: skip
def import_model(
    session: SessionDep, settings: SettingsDep, body: ModelImport, response: Response
) -> ModelRead:
    """Import a model the labels party trained with LabelDP-Pro
    (``GET /v1/trainings/{id}/model`` there): its SHA-256 is checked against the
    training's, and it predicts like any model here (``POST /v1/models/{id}/predict``).
    Importing the same training again returns the model it registered, with 200."""
    model, created = service.import_training(session, settings, body)
    if not created:
        response.status_code = 200
    return model


@router.get(
    "",
    response_model=list[ModelRead],
    summary="Models: trained here and imported",
    description=PAGED,
)
def list_models(session: SessionDep, pager: PagerDep) -> list[ModelRead]:
    return service.list_page(session, pager)


@router.get("/{model_id}", response_model=ModelRead)
def get_model(session: SessionDep, model_id: str) -> ModelRead:
    return service.get(session, model_id)


@router.get("/{model_id}/artifact", response_class=FileResponse)
def download_artifact(session: SessionDep, settings: SettingsDep, model_id: str) -> FileResponse:
    """The model file: weights, column roles, vocabularies and scalers
    (``torch.load(path, weights_only=True)``)."""
    path = service.artifact_path(session, settings, model_id)
    return FileResponse(path, media_type="application/octet-stream", filename=f"{model_id}.pt")


@router.post("/{model_id}/predict", response_model=Predictions, openapi_extra=_PREDICT_BODY)
async def predict(
    request: Request, session: SessionDep, settings: SettingsDep, model_id: str
) -> StreamingResponse:
    """Predict from a multipart ``file`` (CSV or Parquet) or JSON ``{"rows": [...]}``.
    Every row is checked before the answer starts; it is then sent in batches."""
    answer = await _answer(request, session, settings, model_id)
    return StreamingResponse(answer.json_chunks(), media_type="application/json")


async def _answer(
    request: Request, session: Session, settings: Settings, model_id: str
) -> service.PredictionAnswer:
    if is_multipart(request.headers.get("content-type")):
        async with request.form() as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidInputError("multipart requests need a 'file' field")
            return await run_in_threadpool(_predict_upload, session, settings, model_id, upload)
    try:
        body = PredictRows.model_validate_json(await request.body())
    except ValidationError as exc:
        raise InvalidInputError(
            'send JSON {"rows": [...]} or a multipart file',
            detail=[{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()],
        ) from None
    return await run_in_threadpool(service.predict_rows, session, settings, model_id, body.rows)
