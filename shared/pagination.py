"""Keyset pagination of both parties' lists (releases, trainings; feature sets,
received labels, jobs, models, LP-MST runs).

A page is ``limit`` rows in (created_at, id) order after the row ``after`` names;
the response's ``Link: <…>; rel="next"`` header (RFC 8288) gives the next page's
URL while there is one, so a client follows links and never misses or repeats a
row that another request adds meanwhile (new rows sort last). The body stays the
list the contract specifies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import httpx
from fastapi import Depends, Query, Request, Response
from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import Session

from shared.errors import ServiceError

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

Limit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description="rows per page; the Link header has the next page")
]


class UnknownCursorError(ServiceError):
    """``after`` names no row of the list (each party renders every ServiceError)."""

    status_code = 422
    code = "invalid_request"


After = Annotated[
    str | None,
    Query(max_length=36, description="the id of the previous page's last row (from its Link)"),
]


def page(
    session: Session,
    query: Select[Any],
    table: Any,
    *,
    after: str | None,
    limit: int,
    scope: Select[Any] | None = None,
) -> tuple[list[Any], bool]:
    """The page of ``query`` (rows of ``table``, already filtered to what the caller
    may see) after the row ``after``, and whether another page follows. ``after``
    is looked up in ``scope`` (default ``query``): what the caller may see, without
    the filters a row can leave (a job's status), or following a page's link failed
    once its last row had changed."""
    if after is not None:
        cursor = session.scalars(
            (query if scope is None else scope).where(table.id == after)
        ).first()
        if cursor is None:
            raise UnknownCursorError(f"after: {after!r} is not a row of this list")
        query = query.where(
            or_(
                table.created_at > cursor.created_at,
                and_(table.created_at == cursor.created_at, table.id > cursor.id),
            )
        )
    rows = list(session.scalars(query.order_by(table.created_at, table.id).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def link_next(request: Request, response: Response, last_id: str, limit: int) -> None:
    """Point ``response`` at the page after the row ``last_id``."""
    url = request.url.include_query_params(after=last_id, limit=limit)
    response.headers["Link"] = f'<{url}>; rel="next"'


def every_row(first: httpx.Response, get: Callable[[str], httpx.Response]) -> list[Any]:
    """A client's side: the rows of ``first`` and of every page after it, fetched
    by ``get(path_and_query)`` along the ``Link: rel="next"`` headers. Only the
    link's path and query are followed: behind a proxy the server may see another
    host than the client's."""
    rows: list[Any] = []
    response = first
    while True:
        rows += response.json()
        following = response.links.get("next", {}).get("url")
        if not following:
            return rows
        response = get(httpx.URL(following).raw_path.decode("ascii"))


class Pager:
    """A list request's page (``after``, ``limit`` from the query), as an endpoint
    dependency: :meth:`rows` reads the page and sets the next page's ``Link``."""

    def __init__(
        self,
        request: Request,
        response: Response,
        after: After = None,
        limit: Limit = DEFAULT_LIMIT,
    ) -> None:
        self.request, self.response = request, response
        self.after, self.limit = after, limit

    def rows(
        self, session: Session, query: Select[Any], table: Any, scope: Select[Any] | None = None
    ) -> list[Any]:
        """The page of ``query``, rows of ``table`` oldest first (``scope``: :func:`page`)."""
        rows, more = page(session, query, table, after=self.after, limit=self.limit, scope=scope)
        if more:
            link_next(self.request, self.response, rows[-1].id, self.limit)
        return rows


PagerDep = Annotated[Pager, Depends()]

#: An endpoint's description of its paging.
PAGED = (
    "Oldest first, at most `limit` a page; while more follow, the `Link` header's "
    '`rel="next"` URL gives the next page.'
)
