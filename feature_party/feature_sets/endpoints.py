"""``/v1/feature-sets``: thin — parse, call the service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile

from feature_party.deps import SessionDep, SettingsDep
from feature_party.exception_handlers import ERROR_RESPONSES
from feature_party.feature_sets import service
from feature_party.feature_sets.schemas import FeatureSetRead
from feature_party.uploads import spooled
from shared.pagination import PAGED, PagerDep
from shared.protocol import ErrorBody

router = APIRouter(prefix="/v1/feature-sets", tags=["feature sets"], responses=ERROR_RESPONSES)


@router.post(
    "",
    status_code=201,
    response_model=FeatureSetRead,
    responses={413: {"model": ErrorBody, "description": "larger than LABELDP_MAX_UPLOAD_BYTES"}},
)
def create_feature_set(
    session: SessionDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="CSV or Parquet with example_id")],
    declared_schema: Annotated[
        str | None, Form(alias="schema", description='{"numeric": [...], "categorical": [...]}')
    ] = None,
    name: Annotated[str | None, Form(max_length=200)] = None,
) -> FeatureSetRead:
    declared = service.parse_schema(declared_schema)
    with spooled(
        file, directory=settings.data_dir / "tmp", max_bytes=settings.max_upload_bytes
    ) as path:
        return service.create(
            session, settings, upload=path, filename=file.filename, schema=declared, name=name
        )


@router.get("", response_model=list[FeatureSetRead], summary="Feature sets", description=PAGED)
def list_feature_sets(session: SessionDep, pager: PagerDep) -> list[FeatureSetRead]:
    return service.list_page(session, pager)


@router.get("/{feature_set_id}", response_model=FeatureSetRead)
def get_feature_set(session: SessionDep, feature_set_id: str) -> FeatureSetRead:
    return service.get(session, feature_set_id)
