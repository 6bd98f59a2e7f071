"""Domain errors of the features party, rendered once by
``feature_party.exception_handlers`` into ``{"error", "message", "detail"}``::

    FeaturePartyError
    ├── NotFoundError            404 not_found
    ├── ConflictError            409 conflict (budget_exceeded from the labels party)
    ├── PayloadTooLargeError     413 payload_too_large
    ├── InvalidInputError        422 invalid_request / bad_file / no_join /
    │                                release_dataset_mismatch
    ├── LabelsPartyRefusedError  4xx labels_party_refused (the labels party's 4xx)
    ├── StorageUnavailableError  507 storage_unavailable (the data directory refuses writes)
    │   └── NoRoomError              … or plainly has no room (before any ε is spent)
    └── UpstreamError            502 labels_party_unavailable / labels_party_error /
                                     release_integrity_error
"""

from __future__ import annotations

from typing import Any

from shared.errors import ServiceError, storage_message, storage_problem


class FeaturePartyError(ServiceError):
    """Every domain error of the features party."""


class NotFoundError(FeaturePartyError):
    status_code = 404
    code = "not_found"


class ConflictError(FeaturePartyError):
    status_code = 409
    code = "conflict"


class PayloadTooLargeError(FeaturePartyError):
    status_code = 413
    code = "payload_too_large"


class InvalidInputError(FeaturePartyError):
    status_code = 422
    code = "invalid_request"  # the labels party's code too: one vocabulary for clients


class UpstreamError(FeaturePartyError):
    status_code = 502
    code = "labels_party_error"


class LabelsPartyRefusedError(FeaturePartyError):
    """The labels party refused what the request asked of it (an unknown release,
    an invalid mechanism, a token it does not know): the caller's to fix, so a 4xx
    here too. Its status is the labels party's, except that its 401 — the
    forwarded token — is 403 here, not to be read as this service's own 401."""

    code = "labels_party_refused"

    def __init__(self, message: str, status: int, detail: Any = None) -> None:
        super().__init__(message, detail)
        self.status_code = 403 if status == 401 else status


class StorageUnavailableError(FeaturePartyError):
    """The data directory refused a write (full, read-only): the operator's to fix."""

    status_code = 507
    code = "storage_unavailable"

    def __init__(self, exc: BaseException) -> None:
        name = storage_problem(exc) or type(exc).__name__
        super().__init__(storage_message(name), {"errno": name})


class NoRoomError(StorageUnavailableError):
    """The data directory plainly cannot take what a request would write (checked
    before anything is asked of the labels party)."""

    def __init__(self, message: str, detail: Any = None) -> None:
        FeaturePartyError.__init__(self, message, detail)


def not_found(kind: str, id_: str) -> NotFoundError:
    return NotFoundError(f"no {kind} with id {id_!r}", detail={"kind": kind, "id": id_})


def no_join(message: str, *, num_labels: int, num_features: int, matched: int, unmatched: int
            ) -> InvalidInputError:  # fmt: skip
    """422 ``no_join``: labels and features share no ``example_id`` (counts only)."""
    detail = {"num_labels": num_labels, "num_features": num_features, "matched": matched,
              "unmatched": unmatched}  # fmt: skip
    return InvalidInputError(message, code="no_join", detail=detail)
