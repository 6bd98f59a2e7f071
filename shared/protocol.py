"""The wire contract between the two parties (DESIGN.md §6).

Both services and the Python client import these models, so a field means the
same thing on each side. Evolution rule (as in dp_accounting): never remove a
field, never change its meaning; only add optional ones.

Privacy amounts are :class:`decimal.Decimal` inside (exact ledger arithmetic,
DESIGN.md §3.4) and JSON numbers on the wire.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from decimal import ROUND_FLOOR, Context, Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

#: An amount sent as text: a JSON number's spelling, nothing more. ``Decimal``
#: alone also takes "1_0" (10), "١" (Arabic-Indic one), " 0.1 " and "+0.1", and a
#: release spent ε = 10 for "1_0" (helper-70). At most 40 digits either side of
#: the point and a 3-digit exponent: "1e99999999999999999999" overflowed Decimal's
#: context, a 500 (helper-74).
AMOUNT_TEXT = re.compile(r"-?[0-9]{1,40}(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,3})?")


def _amount_spelling(value: Any) -> Any:
    """The amount as a Decimal: text spelled as a number, or a number (a double as
    its shortest decimal); anything else is left for the Decimal schema to refuse.
    Converted here because after a before-validator a strict model (a training
    spec) takes only a Decimal instance."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if not AMOUNT_TEXT.fullmatch(value):
            raise ValueError(
                "an amount is a JSON number, or text spelled as one (digits, an optional "
                f"fraction and exponent), not {value[:40]!r}"
            )
        return Decimal(value)
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):  # float's repr: numpy's says "np.float64(0.5)"
        return Decimal(float.__repr__(value))
    return value


#: An ε or δ amount: exact decimal in Python, a JSON number on the wire.
PrivacyAmount = Annotated[
    Decimal,
    BeforeValidator(_amount_spelling),
    PlainSerializer(lambda d: float(d), return_type=float, when_used="json"),
]


def amount_text(amount: Decimal | None) -> str | None:
    """An amount as exact text, one spelling a value (``0.10`` and ``0.1`` alike,
    ``10``, not ``1E+1``): what a request's fingerprint compares. Its JSON number
    is a double, which two amounts the ledger tells apart can share."""
    return None if amount is None else format(amount.normalize(), "f")


def float_below(amount: Decimal) -> float:
    """The largest double not above ``amount``: what a mechanism runs at, so that it
    never uses more ε than the ledger charged (``float`` rounds to the nearest
    double, up half the time: at ε = 19.900000004948 randomized response kept its
    label e^ε·(1 + 7·10⁻¹⁶) times as often as the charge allowed; helper-69)."""
    nearest = float(amount)
    return math.nextafter(nearest, -math.inf) if Decimal(nearest) > amount else nearest


#: Wide enough that an amount of at most 10⁴¹ to 18 places never rounds.
WIDE = Context(prec=100)


#: The labels party's ledger counts ε in units of 10⁻¹² and δ in units of 10⁻¹⁸,
#: at most 2⁶² units: an amount it cannot hold exactly is refused, never rounded.
EPSILON_SCALE = 10**12
DELTA_SCALE = 10**18
MAX_UNITS = 2**62


def ledger_units(amount: Decimal, scale: int, what: str) -> int:
    """``amount`` in the ledger's units of ``1/scale``; :class:`ValueError` saying
    why for one it cannot hold (the features party checks an ε it will forward
    with this before acting on it)."""
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{what} must be a finite non-negative number")
    if amount.adjusted() > 40:  # far past MAX_UNITS, and WIDE holds every digit below it
        raise ValueError(f"{what} is too large: at most {largest_amount(scale):f}")
    places = len(str(scale)) - 1
    if amount != amount.quantize(Decimal(1).scaleb(-places), context=WIDE):
        # In a context wide enough to hold every digit: Decimal's default 28 digits
        # rounded 0.1000000000000000000000000000001 to 0.1 (helper-74).
        raise ValueError(f"{what} has more than {places} decimal places")
    units = int(amount.scaleb(places, WIDE))
    if units > MAX_UNITS:
        raise ValueError(f"{what} is too large: at most {largest_amount(scale):f}")
    return units


def largest_amount(scale: int) -> Decimal:
    """The largest amount the ledger holds, floored to 6 decimal places, so that
    the number stated in a refusal is accepted when sent back as a JSON double
    (the exact 2⁶²/10¹² rounds up to one past it)."""
    return (Decimal(MAX_UNITS) / scale).quantize(Decimal("0.000001"), rounding=ROUND_FLOOR)


#: An id either party made (a UUID, its hex, a short name): at most 200 of
#: ``[A-Za-z0-9_.:-]``. Any other text names nothing; refused as input, since a
#: lone surrogate in one reached the database driver as a 500.
Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")]

#: A name or key a user chose (a dataset's, a client's, an idempotency key): 1 to
#: 200 characters, no NUL (Postgres text cannot hold one: SQLite took it, Postgres
#: refused it with an error logged as a bug) and no lone surrogate (which a pattern
#: refuses as it reads the text; helper-70).
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]

PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"

Task = Literal["regression", "classification"]


#: A SHA-256 as the labels party writes it: 64 lowercase hex digits. A file is
#: named and checked by it, so anything else (empty: no check, and every such
#: release one file) is refused as the manifest is read.
SHA256_PATTERN = r"^[0-9a-f]{64}$"
Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]


class ErrorBody(BaseModel):
    """Every error response: a stable code, a human message, optional detail."""

    error: str
    message: str
    detail: Any = None


class MechanismChoice(BaseModel):
    """A release request's mechanism: its registry name plus its own options.

    Options other than ``name`` and ``loss`` are passed to the mechanism as
    parameters (``mesh``, ``clip``, …).
    """

    model_config = ConfigDict(extra="allow")

    name: str
    loss: Literal["squared", "absolute", "poisson", "zero-one"] | None = None

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ReleaseCreate(BaseModel):
    """``POST /v1/datasets/{id}/releases``.

    ``epsilon`` is everything the release spends, its private prior included;
    ``prior_epsilon`` sets the split (default ``min(√(k/n), ε/2)`` for mechanisms
    that use a prior).
    """

    model_config = ConfigDict(extra="forbid")

    mechanism: MechanismChoice
    epsilon: PrivacyAmount = Field(gt=0)
    prior_epsilon: PrivacyAmount | None = Field(default=None, ge=0)
    # Omitted: the whole dataset. An empty list would select nothing, so it is refused.
    parts: list[str] | None = Field(default=None, min_length=1)
    idempotency_key: Name | None = None


class MechanismDescription(BaseModel):
    """The public description of a fitted mechanism: what the features party needs
    to post-process (debias) the noisy labels. Finite mechanisms carry their
    input grid, outputs and transition matrix; additive ones their noise
    parameters in ``params``."""

    name: str
    epsilon: float
    params: dict[str, Any] = Field(default_factory=dict)
    inputs: list[float] | None = None
    outputs: list[float] | None = None
    matrix: list[list[float]] | None = None


class ReleaseRead(BaseModel):
    """A release manifest. ``sha256`` is the hash of the Parquet file's bytes as
    served by ``GET /v1/releases/{id}/labels?format=parquet``."""

    id: str
    dataset_id: str
    #: The dataset's task, so the features party can refuse a job of the other kind
    #: (None only in manifests from labels parties older than this field).
    task: Task | None = None
    epsilon: PrivacyAmount
    delta: PrivacyAmount = Decimal(0)
    prior_epsilon: PrivacyAmount = Decimal(0)
    mechanism: MechanismDescription
    prior: list[float] | None = None
    num_labels: int
    sha256: Sha256
    parts: list[str] | None = None
    idempotency_key: str | None = None
    created_at: datetime


class PriorSetRead(BaseModel):
    """``POST /v1/datasets/{id}/priors`` (multipart ``file``, ``kind``): a stored set
    of example priors for ``rr-with-prior`` releases (``prior_id`` = ``id``).

    ``kind`` ``groups``: a label-independent group per example (``num_groups``);
    ``probabilities``: K class probabilities per example (``num_classes``).
    ``num_unmatched``: in the upload's answer, rows whose ``example_id`` the dataset's
    labels then lacked (kept; ``None`` when no labels were uploaded yet). Reads of a
    stored set give ``None``: labels uploaded since would change the count."""

    id: str
    dataset_id: str
    kind: Literal["groups", "probabilities"]
    num_rows: int
    num_groups: int | None = None
    num_classes: int | None = None
    num_unmatched: int | None = Field(
        default=None, description="the upload's answer only: rows the labels then lacked"
    )
    sha256: Sha256
    created_at: datetime
