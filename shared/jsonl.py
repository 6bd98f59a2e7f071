"""JSON-lines uploads, read by Arrow only once their nesting is known to be shallow.

``pyarrow.json.read_json`` (26.0) parses recursively and crashes the process —
a segfault, every request in flight lost — on a line nested some thousands deep:
20 KB of ``[`` from any client with an upload. Every upload the services take
is one to two levels deep (an object, a list of class probabilities), so a file
nested deeper than :data:`MAX_DEPTH` is refused before Arrow sees it.
"""

from __future__ import annotations

import re
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson

#: The deepest nesting an upload may have (Arrow still parses 1,000 safely).
MAX_DEPTH = 64
#: Bytes scanned at a time (the scan holds about 20 times this).
CHUNK_BYTES = 1 << 22

# A JSON string: brackets inside one are text, not nesting. A string cannot hold a
# raw newline, so lines can be scanned apart.
_STRING = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[ord("["), ord("{")]] = 1
_DELTA[[ord("]"), ord("}")]] = -1


class TooDeepError(ValueError):
    """The file nests deeper than :data:`MAX_DEPTH` (it is not read)."""


def read_json_lines(source: IO[bytes]) -> pa.Table:
    """``source`` (JSON lines, read from its start) as a table, after checking its
    nesting; :class:`TooDeepError` for a file nested too deep, Arrow's errors for
    one it cannot parse or parses into an invalid table."""
    source.seek(0)
    if deepest(source) > MAX_DEPTH:
        raise TooDeepError(f"the file nests deeper than {MAX_DEPTH} levels")
    source.seek(0)
    table = pjson.read_json(source)
    # JSON has no times: Arrow reads strings like "2024-01-01" as timestamps, and an
    # id column of them was refused as "timestamp[s]" (helper-78). Read as written.
    stamped = [field.name for field in table.schema if pa.types.is_timestamp(field.type)]
    if stamped:
        source.seek(0)
        as_text = pa.schema([(name, pa.string()) for name in stamped])
        table = pjson.read_json(source, parse_options=pjson.ParseOptions(explicit_schema=as_text))
    # Arrow (26.0) builds an invalid list column from a list that starts with null
    # ([null, 0.5, 0.5]); used, it raised ArrowIndexError, a 500 (helper-70).
    table.validate(full=True)
    return table


def deepest(source: IO[bytes]) -> int:
    """An upper bound of how deep ``source`` nests, read a block of whole lines at a
    time (each line of JSON lines is a value of its own)."""
    worst, carry = 0, b""
    while True:
        block = source.read(CHUNK_BYTES)
        text = carry + block
        end = len(text) if not block else text.rfind(b"\n") + 1
        lines, carry = text[:end], text[end:]
        worst = max(worst, _deepest_lines(lines))
        if not block:
            return worst


def _deepest_lines(lines: bytes) -> int:
    """An upper bound of how deep ``lines`` nest. A line opens at least as many
    brackets as it nests deep, which numpy counts fast; only a line that opens
    more than :data:`MAX_DEPTH` is scanned exactly."""
    data = np.frombuffer(lines, dtype=np.uint8)
    openers = np.flatnonzero((data == ord("[")) | (data == ord("{")))
    if openers.size == 0:
        return 0
    line_of = np.searchsorted(np.flatnonzero(data == ord("\n")), openers)
    most = int(np.bincount(line_of).max())
    return most if most <= MAX_DEPTH else _nesting(lines)


def _nesting(lines: bytes) -> int:
    """The largest rise of the running count of opened minus closed brackets
    outside strings: exact on valid JSON; unbalanced lines only read deeper."""
    steps = _DELTA[np.frombuffer(_STRING.sub(b"", lines), dtype=np.uint8)]
    levels = np.cumsum(steps, dtype=np.int32)
    lows = np.minimum(np.minimum.accumulate(levels), 0)
    return int((levels - lows).max(initial=0))
