from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import pyarrow.parquet as pq
from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import FileResponse, StreamingResponse

from label_party.deps import (
    PrincipalDep,
    SessionDep,
    SettingsDep,
    WriterDep,
    in_dataset_queue,
    with_idempotency_key,
)
from label_party.exception_handlers import responses
from label_party.releases import service
from label_party.storage import persisted, release_path
from shared import pagination
from shared.protocol import PARQUET_MEDIA_TYPE, ReleaseCreate, ReleaseRead
from shared.spending import IdempotencyKeyHeader

router = APIRouter(tags=["releases"])


@router.post(
    "/v1/datasets/{dataset_id}/releases",
    status_code=status.HTTP_201_CREATED,
    response_model=ReleaseRead,
    responses={
        200: {"model": ReleaseRead, "description": "Idempotent replay: nothing spent"},
        **responses(401, 403, 404, 409, 422, 507),
    },
    summary="Spend ε on a randomized release of the labels (admin, granted client)",
    description="`epsilon` is the total the release spends, its private prior "
    "included. 409 `budget_exceeded` leaves the budget untouched; a repeated "
    "`idempotency_key` (or `Idempotency-Key` header) returns the same release (200) "
    "and spends nothing. "
    "`rr-with-prior` takes `prior_source`: `global` (default; a noisy class histogram "
    "at `prior_epsilon`), `groups` (with `prior_id` of a `groups` prior set: noisy "
    "per-group histograms at `prior_epsilon`, default min(√(G·K/n), ε/2), charged once "
    "for all groups) or `example` (with `prior_id` of a `probabilities` prior set: no ε "
    "for the prior, `prior_epsilon` must be omitted). Every example in scope must be "
    "covered by the prior set (else 422 listing up to 100 ids, nothing spent).",
)
async def create_release(
    dataset_id: str,
    body: ReleaseCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: WriterDep,
    idempotency_key: IdempotencyKeyHeader = None,
) -> ReleaseRead:
    body = with_idempotency_key(body, idempotency_key)
    unlocked = request.app.state.db.reader

    def work() -> tuple[ReleaseRead, bool]:
        release, created = service.create(
            session, settings, principal, dataset_id, body, unlocked=unlocked
        )
        return service.to_read(session, release), created

    manifest, created = await in_dataset_queue(request, dataset_id, work)
    if not created:
        response.status_code = status.HTTP_200_OK
    return manifest


@router.get(
    "/v1/datasets/{dataset_id}/releases",
    response_model=list[ReleaseRead],
    responses=responses(401, 403, 404, 422),
    summary="Releases of a dataset (a client: its own), oldest first, a page at a time",
    description="At most `limit` manifests; while more follow, the `Link` header's "
    '`rel="next"` URL gives the next page.',
)
def list_releases(
    dataset_id: str,
    request: Request,
    response: Response,
    session: SessionDep,
    principal: PrincipalDep,
    after: pagination.After = None,
    limit: pagination.Limit = pagination.DEFAULT_LIMIT,
) -> list[ReleaseRead]:
    releases, more = service.list_visible(session, principal, dataset_id, after=after, limit=limit)
    if more:
        pagination.link_next(request, response, releases[-1].id, limit)
    return releases


@router.get(
    "/v1/releases/{release_id}",
    response_model=ReleaseRead,
    responses=responses(401, 403, 404),
    summary="A release's manifest (admin, the client that made it)",
)
def get_release(release_id: str, session: SessionDep, principal: PrincipalDep) -> ReleaseRead:
    return service.to_read(session, service.get_visible(session, principal, release_id))


def _json_stream(path: Path, release_id: str) -> Iterator[bytes]:
    """``{"release_id", "example_id": [...], "label": [...]}``, column by column."""
    yield b'{"release_id": ' + json.dumps(release_id).encode()
    parquet = pq.ParquetFile(path)
    for column in ("example_id", "label"):
        yield b', "' + column.encode() + b'": ['
        first = True
        for batch in parquet.iter_batches(batch_size=1 << 18, columns=[column]):
            text = json.dumps(batch.column(0).to_pylist())[1:-1]
            if text:
                yield (b"" if first else b", ") + text.encode()
                first = False
        yield b"]"
    yield b"}"


@router.get(
    "/v1/releases/{release_id}/labels",
    responses={
        200: {
            "description": "The noisy labels: Parquet (`example_id`, `label`) or JSON "
            '`{"release_id", "example_id": [...], "label": [...]}`; the same bytes every time',
            "content": {PARQUET_MEDIA_TYPE: {}, "application/json": {}},
        },
        **responses(401, 403, 404, 500),
    },
    response_class=Response,
    summary="Download a release's noisy labels (free: the persisted bytes)",
)
def download_release(
    release_id: str,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    format: Annotated[Literal["parquet", "json"], Query()] = "parquet",
) -> Response:
    release = service.get_visible(session, principal, release_id)
    path = persisted(settings, release_path(settings, release.sha256), f"release {release.id}")
    if format == "json":
        return StreamingResponse(_json_stream(path, release.id), media_type="application/json")
    return FileResponse(
        path,
        media_type=PARQUET_MEDIA_TYPE,
        filename=f"release-{release.id}.parquet",
        headers={"ETag": f'"{release.sha256}"'},
    )
