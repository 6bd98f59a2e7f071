"""How both services write their JSON columns (``create_engine(json_serializer=…)``).

JSON has no NaN or infinity. Python's ``json.dumps`` writes them anyway; SQLite
stores the text and Postgres refuses it (``invalid input syntax for type json``).
A training whose loss diverged put ``NaN`` in its progress: on Postgres every
heartbeat failed, the lease lapsed and the job ran five times before failing with
"the worker stopped responding". A number that is not finite is written as
``null`` on both databases instead: what the API would answer for it anyway.
"""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(value: Any) -> str:
    """``value`` as JSON, each float that is not finite as ``null``."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:  # rare: walk the value only when it holds one
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
