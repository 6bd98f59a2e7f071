from __future__ import annotations

import threading
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from label_party.deps import PrincipalDep, SettingsDep
from label_party.exception_handlers import responses
from label_party.exceptions import BusyError, InvalidRequestError
from label_party.mechanisms.preview import preview

router = APIRouter(tags=["mechanisms"])


class PreviewRequest(BaseModel):
    """The same inputs as ``labeldp mechanism preview`` (no data, no budget)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mechanism: str
    epsilon: float = Field(gt=0)
    values: list[float] = Field(min_length=1, max_length=100_000)
    prior: list[float] = Field(min_length=1, max_length=100_000)
    loss: Literal["squared", "absolute", "poisson", "zero-one"] | None = None
    mesh: int | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class PreviewRead(BaseModel):
    mechanism: str
    selected: str = Field(description="the fitted mechanism (``auto`` names its choice)")
    params: dict[str, Any] = Field(
        default_factory=dict, description="its parameters; ``auto`` adds ``reason``"
    )
    epsilon: float
    loss: str
    outputs: list[float] | None
    matrix: list[list[float]] | None
    noisy_label_loss: float | None = Field(
        description="E[ℓ(ŷ, y)] under the prior; null for the Poisson loss of a mechanism "
        "with an output ≤ 0 (unbiased, additive), where it is undefined"
    )
    max_abs_bias: float
    seconds: float


@router.post(
    "/v1/mechanisms/preview",
    response_model=PreviewRead,
    responses=responses(401, 422, 429),
    summary="Fit a mechanism to a given prior: outputs, matrix, loss, bias (any role)",
    description="At most as many values as a dataset's grid may have "
    "(`LABELDP_MAX_GRID_SIZE`); `LABELDP_MAX_CONCURRENT_PREVIEWS` fits at once, "
    "429 `busy` (with `Retry-After`) beyond; a fit that runs past "
    "`LABELDP_PREVIEW_SECONDS` (the unbiased LP on a large grid) is 422 "
    "`invalid_mechanism`.",
)
def preview_mechanism(
    request: Request, body: PreviewRequest, principal: PrincipalDep, settings: SettingsDep
) -> PreviewRead:
    del principal  # any authenticated caller; no data is involved
    if len(body.values) > settings.max_grid_size:
        raise InvalidRequestError(
            f"at most {settings.max_grid_size} values (LABELDP_MAX_GRID_SIZE, the largest "
            f"grid a dataset may declare), got {len(body.values)}",
        )
    slots: threading.BoundedSemaphore = request.app.state.preview_slots
    # A fit runs on after its client leaves: bounding them bounds the memory and CPU
    # that any token, an auditor's included, can take.
    if not slots.acquire(blocking=False):
        raise BusyError(
            f"{settings.max_concurrent_previews} previews are being fitted; retry shortly"
        )
    try:
        result = preview(
            mechanism=body.mechanism,
            epsilon=body.epsilon,
            values=body.values,
            prior=body.prior,
            loss=body.loss,
            mesh=body.mesh,
            params=body.params,
            time_limit=settings.preview_seconds,
        )
    finally:
        slots.release()
    return PreviewRead.model_validate(result)
