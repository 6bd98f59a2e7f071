"""``/v1/datasets/{id}/priors``: upload and list prior sets (admin, granted client)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from starlette.datastructures import UploadFile

from label_party.auth import require, visible_dataset
from label_party.deps import (
    PrincipalDep,
    SessionDep,
    SettingsDep,
    in_worker_thread,
    visible_before_upload,
)
from label_party.example_priors import service
from label_party.exception_handlers import responses
from label_party.exceptions import InvalidRequestError
from label_party.labels.endpoints import multipart_body
from label_party.labels.validation import file_format
from label_party.models import PriorSet
from shared.protocol import PriorSetRead

router = APIRouter(tags=["priors"])

PRIORS_BODY = multipart_body(
    "groups: .csv, .parquet or .jsonl (example_id, group); probabilities: .parquet or "
    ".jsonl (example_id, prior list of K, or p_0 … p_{K-1})",
    {"kind": {"type": "string", "enum": list(service.KINDS)}},
)


def _read(prior: PriorSet, unmatched: int | None = None) -> PriorSetRead:
    return PriorSetRead(
        id=prior.id,
        dataset_id=prior.dataset_id,
        kind=prior.kind,  # type: ignore[arg-type]
        num_rows=prior.num_rows,
        num_groups=prior.num_groups,
        num_classes=prior.num_classes,
        num_unmatched=unmatched,
        sha256=prior.sha256,
        created_at=prior.created_at,
    )


@router.post(
    "/v1/datasets/{dataset_id}/priors",
    status_code=status.HTTP_201_CREATED,
    response_model=PriorSetRead,
    responses=responses(401, 403, 404, 413, 422),
    openapi_extra=PRIORS_BODY,
    summary="Upload example priors for rr-with-prior releases (admin, granted client)",
    description="Multipart `file` and `kind` (`groups` | `probabilities`; or the query "
    "parameter `kind`). Computed from features only. All or nothing: 422 "
    "`invalid_priors` lists up to 100 bad rows by row number and reason. Example ids "
    "the labels lack are kept and counted in `num_unmatched`; a release refuses a "
    "scope with an example the set does not cover.",
)
async def upload_priors(
    dataset_id: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    kind: Annotated[str | None, Query()] = None,
) -> PriorSetRead:
    require(principal, "admin", "client")
    await visible_before_upload(request, principal, dataset_id)
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get("file")
    try:
        if not isinstance(upload, UploadFile):
            raise InvalidRequestError("the multipart field 'file' is required")
        form_kind = form.get("kind")
        chosen = form_kind if isinstance(form_kind, str) else kind
        if chosen not in service.KINDS:
            raise InvalidRequestError(f"kind must be one of {', '.join(service.KINDS)}")
        fmt = file_format(upload.filename, upload.content_type)
        source = upload.file

        def store() -> tuple[PriorSet, int | None]:
            return service.upload(session, settings, principal, dataset_id, source, fmt, chosen,
                                  unlocked=request.app.state.db.reader)  # fmt: skip

        prior, unmatched = await in_worker_thread(store)
    finally:
        await form.close()
    return _read(prior, unmatched)


@router.get(
    "/v1/datasets/{dataset_id}/priors",
    response_model=list[PriorSetRead],
    responses=responses(401, 403, 404),
    summary="The dataset's prior sets",
)
def list_priors(
    dataset_id: str, session: SessionDep, principal: PrincipalDep
) -> list[PriorSetRead]:
    require(principal, "admin", "client")
    dataset = visible_dataset(session, principal, dataset_id)
    return [_read(p) for p in service.list_for_dataset(session, principal, dataset.id)]


@router.get(
    "/v1/datasets/{dataset_id}/priors/{prior_id}",
    response_model=PriorSetRead,
    responses=responses(401, 403, 404),
    summary="One prior set",
)
def get_prior(
    dataset_id: str, prior_id: str, session: SessionDep, principal: PrincipalDep
) -> PriorSetRead:
    require(principal, "admin", "client")
    dataset = visible_dataset(session, principal, dataset_id)
    return _read(service.get(session, principal, dataset.id, prior_id))
