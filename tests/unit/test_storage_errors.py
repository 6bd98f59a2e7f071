"""Storage refusing writes is the operator's to fix: 507 with the errno's name,
never a path or the OS's text; the log says the errno and where, not the text."""

from __future__ import annotations

import errno
import json
import logging

from shared.errors import unexpected_error_response
from shared.logging import JsonFormatter

LOGGER = logging.getLogger("tests.storage_errors")


def _raised(exc: OSError) -> OSError:
    try:
        raise exc
    except OSError as caught:
        return caught


def test_a_full_disk_is_507_naming_the_errno_and_nothing_else() -> None:
    exc = _raised(OSError(errno.ENOSPC, "No space left on device", "/data/labels/secret-ds"))
    response = unexpected_error_response(LOGGER, exc)
    body = json.loads(bytes(response.body))
    assert response.status_code == 507
    assert body["error"] == "storage_unavailable" and body["detail"] == {"errno": "ENOSPC"}
    assert "secret-ds" not in json.dumps(body) and "No space" not in json.dumps(body)
    read_only = unexpected_error_response(LOGGER, _raised(OSError(errno.EROFS, "ro")))
    assert read_only.status_code == 507


def test_other_errors_stay_a_plain_500() -> None:
    for exc in (_raised(OSError(errno.EIO, "io")), ValueError("label 42.0 is odd")):
        response = unexpected_error_response(LOGGER, exc)
        assert response.status_code == 500
        assert json.loads(bytes(response.body))["message"] == "internal error"


def test_the_log_names_the_errno_and_where_never_the_text() -> None:
    exc = _raised(OSError(errno.ENOSPC, "No space left on device", "/data/secret-ds"))
    record = LOGGER.makeRecord(LOGGER.name, logging.ERROR, __file__, 1, "unhandled error", (),
                               (type(exc), exc, exc.__traceback__))  # fmt: skip
    entry = json.loads(JsonFormatter().format(record))
    assert entry["exception"] == "OSError" and entry["errno"] == "ENOSPC"
    assert entry["where"].startswith(__file__)
    assert "secret-ds" not in json.dumps(entry)
