from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from label_party.auth import require
from label_party.deps import PrincipalDep, SessionDep, SettingsDep, in_worker_thread
from label_party.exception_handlers import responses
from label_party.exceptions import InvalidRequestError
from label_party.labels import service
from label_party.labels.validation import file_format

router = APIRouter(tags=["labels"])


def multipart_body(file_description: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAPI for an upload endpoint that reads its multipart body itself
    (:func:`read_upload`): a required ``file`` plus optional form fields."""
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": file_description},
        **(extra or {}),
    }
    schema = {"type": "object", "required": ["file"], "properties": properties}
    return {
        "requestBody": {
            "required": True,
            "content": {"multipart/form-data": {"schema": schema}},
        }
    }


MULTIPART_BODY = multipart_body(".csv, .parquet or .jsonl")


class LabelsUploaded(BaseModel):
    num_labels: int


async def read_upload(request: Request) -> UploadFile:
    """The multipart ``file`` part, spooled to disk by Starlette as it streams in.

    The body size limit (413) is enforced by :class:`shared.limits.BodyLimitMiddleware`.
    """
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidRequestError("the multipart field 'file' is required")
    return upload


@router.post(
    "/v1/datasets/{dataset_id}/labels",
    response_model=LabelsUploaded,
    responses=responses(401, 403, 404, 409, 413, 422),
    openapi_extra=MULTIPART_BODY,
    summary="Upload the dataset's labels (admin); all or nothing",
    description="Multipart field `file`: CSV, Parquet or JSON lines with columns "
    "`example_id` and `label`. 422 lists up to 100 bad rows by row number and reason; "
    "409 once a release exists.",
)
async def upload_labels(
    dataset_id: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> LabelsUploaded:
    require(principal, "admin")
    upload = await read_upload(request)
    try:
        fmt = file_format(upload.filename, upload.content_type)

        def store() -> int:
            # One worker-thread call: the transaction's first statement (and so
            # SQLite's write lock) happens here, never across two thread hops.
            return service.upload(session, settings, principal, dataset_id, upload.file, fmt,
                                  unlocked=request.app.state.db.reader)  # fmt: skip

        count = await in_worker_thread(store)
    finally:
        await upload.close()
    return LabelsUploaded(num_labels=count)
