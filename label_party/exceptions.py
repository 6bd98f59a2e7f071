"""Domain errors of the labels party, rendered once by :mod:`label_party.exception_handlers`.

::

    LabelPartyError               status, stable ``code``, message, detail
    ├── UnauthorizedError         401 unauthorized   no or unknown bearer token
    ├── ForbiddenError            403 forbidden      the role may not do this
    ├── NotFoundError             404 not_found      unknown, or not visible to the caller
    ├── ConflictError             409 conflict       state conflict
    │   ├── BudgetExceededError   409 budget_exceeded (its audit entry is committed)
    │   ├── LabelsFrozenError     409 labels_frozen   (its audit entry is committed)
    │   └── IdempotencyConflictError 409 idempotency_conflict
    ├── PayloadTooLargeError      413 payload_too_large
    ├── StorageUnavailableError   507 storage_unavailable (refused before any ε is spent)
    └── InvalidRequestError       422 invalid_request
        ├── InvalidLabelsError    422 invalid_labels (detail lists bad rows)
        │   └── RejectedUploadError  the same, once its audit entry is written
        └── ReleaseFailedError    422 release_failed (its ε spent, reason withheld
                                      but for storage refusing the release's file)

Messages never quote a label value (DESIGN.md §3.1): upload errors name the row
and the problem only. ``commit_session`` marks refusals whose audit entry must
survive the rollback that an error otherwise causes; the service wrote nothing
else before raising them.
"""

from __future__ import annotations

from typing import ClassVar

from shared.errors import ServiceError


class LabelPartyError(ServiceError):
    commit_session: ClassVar[bool] = False


class UnauthorizedError(LabelPartyError):
    status_code = 401
    code = "unauthorized"


class ForbiddenError(LabelPartyError):
    status_code = 403
    code = "forbidden"


class NotFoundError(LabelPartyError):
    status_code = 404
    code = "not_found"


class ConflictError(LabelPartyError):
    status_code = 409
    code = "conflict"


class BudgetExceededError(ConflictError):
    code = "budget_exceeded"
    commit_session = True


class LabelsFrozenError(ConflictError):
    code = "labels_frozen"
    commit_session = True


class IdempotencyConflictError(ConflictError):
    code = "idempotency_conflict"


class PayloadTooLargeError(LabelPartyError):
    status_code = 413
    code = "payload_too_large"


class StorageUnavailableError(LabelPartyError):
    status_code = 507
    code = "storage_unavailable"


class FileMissingError(LabelPartyError):
    """A persisted file a row names is gone from the data directory (an operator's
    mistake, or a restore that missed it): its download cannot be answered."""

    status_code = 500
    code = "file_missing"


class BusyError(LabelPartyError):
    """As many of some bounded work as the service takes at once is running."""

    status_code = 429
    code = "busy"
    retry_after = 5


class InvalidRequestError(LabelPartyError):
    status_code = 422
    code = "invalid_request"


class InvalidLabelsError(InvalidRequestError):
    code = "invalid_labels"


class RejectedUploadError(InvalidLabelsError):
    """An upload refused for bad rows; its (count-free) audit entry is committed."""

    commit_session = True


class ReleaseFailedError(InvalidRequestError):
    """A mechanism failed after it read the labels: whether it fails may depend on
    them, so the failure is charged like a release (its ledger entry and its
    ``release.failed`` audit entry are committed) and its reason is withheld."""

    code = "release_failed"
    commit_session = True
