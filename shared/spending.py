"""Idempotency keys of the requests and commands that spend ε.

The ``Idempotency-Key`` header, which both parties take beside a body's
``idempotency_key`` (:func:`merged_key`). And the key of a command
(:func:`command_key`): a release or training is charged when the labels party
accepts it, so a command cut short (Ctrl-C, a dropped connection, a timeout) may
have spent ε with nothing to show for it; run again without a key, it would spend
again. Every spending command therefore sends a key, and says it before sending:
rerun with that key, the labels party returns what the first run made and
charges nothing (docs/protocol.md, "Idempotency").
"""

from __future__ import annotations

import sys
import uuid
from typing import Annotated

from fastapi import Header

__all__ = ["IdempotencyKeyHeader", "command_key", "merged_key"]

# The IETF draft's header, for clients written from the protocol diagram; the body's
# `idempotency_key` (DESIGN.md §6) means the same.
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        description="Same as the body's `idempotency_key`; if both are sent they must be equal",
    ),
]


def merged_key(body_key: str | None, header_key: str | None) -> str | None:
    """The request's key, from its body or its header. A retry that sends the key
    only as a header must replay, not spend again; a header that disagrees with the
    body is a ValueError (the service's 422), since either could be the one meant."""
    if header_key is None or header_key == body_key:
        return body_key
    if body_key is not None:
        raise ValueError(
            "the Idempotency-Key header and the body's idempotency_key differ; send one"
        )
    return header_key


def command_key(given: str | None) -> str:
    """``given``, or a fresh key announced on stderr with how to use it."""
    if given:
        return given
    key = f"cli-{uuid.uuid4().hex}"
    print(
        f"labeldp: idempotency key {key}: if this command is cut short, run it again with "
        f"--idempotency-key {key} (what it made is returned, not paid for twice)",
        file=sys.stderr,
        flush=True,
    )
    return key
