"""Feature sets: ingest an upload, store it as Parquet, describe it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow.parquet as pq
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.config import Settings
from feature_party.errors import InvalidInputError
from feature_party.feature_sets.ingest import ingest
from feature_party.feature_sets.repository import FeatureSetRepository
from feature_party.feature_sets.schemas import ColumnInfo, FeatureSetRead, SchemaDeclaration
from feature_party.orm import FeatureSet
from feature_party.training.data import ColumnRoles
from shared import strict_json
from shared.pagination import Pager
from shared.strict_json import DuplicateKeyError


def parse_schema(text: str | None) -> SchemaDeclaration | None:
    if text is None or not text.strip():
        return None
    message = 'schema must be JSON {"numeric": [...], "categorical": [...]}'
    try:
        return SchemaDeclaration.model_validate(strict_json.loads(text))
    except DuplicateKeyError as exc:
        raise InvalidInputError(message, detail=[{"loc": ["schema"], "msg": str(exc)}]) from None
    except json.JSONDecodeError as exc:
        detail = [{"loc": ["schema"], "msg": f"not JSON: {exc.msg}"}]
        raise InvalidInputError(message, detail=detail) from None
    except RecursionError:
        detail = [{"loc": ["schema"], "msg": "nested too deeply"}]
        raise InvalidInputError(message, detail=detail) from None
    except ValidationError as exc:
        # The same shape as any other 422 here: where, and what is wrong.
        detail = [{"loc": ["schema", *map(str, e["loc"])], "msg": e["msg"]} for e in exc.errors()]
        raise InvalidInputError(message, detail=detail) from None


def create(
    session: Session,
    settings: Settings,
    *,
    upload: Path,
    filename: str | None,
    schema: SchemaDeclaration | None,
    name: str | None = None,
) -> FeatureSetRead:
    ingested = ingest(upload, filename=filename, schema=schema)
    id_ = uuid.uuid4().hex
    relative = Path("feature_sets") / f"{id_}.parquet"
    target = settings.data_dir / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    pq.write_table(ingested.table, tmp, compression="zstd")
    tmp.replace(target)
    row = FeatureSetRepository(session).add(
        FeatureSet(
            id=id_,
            name=name,
            num_rows=ingested.table.num_rows,
            columns=[c.model_dump() for c in ingested.columns],
            roles=ingested.roles.to_dict(),
            path=str(relative),
        )
    )
    return to_read(row)


def get(session: Session, id_: str) -> FeatureSetRead:
    return to_read(FeatureSetRepository(session).get(id_))


def list_page(session: Session, pager: Pager) -> list[FeatureSetRead]:
    return [to_read(row) for row in pager.rows(session, select(FeatureSet), FeatureSet)]


def to_read(row: FeatureSet) -> FeatureSetRead:
    return FeatureSetRead(
        id=row.id,
        name=row.name,
        num_rows=row.num_rows,
        columns=[ColumnInfo.model_validate(c) for c in row.columns],
        created_at=row.created_at,
    )


def roles_of(row: FeatureSet) -> ColumnRoles:
    return ColumnRoles(tuple(row.roles["numeric"]), tuple(row.roles["categorical"]))
