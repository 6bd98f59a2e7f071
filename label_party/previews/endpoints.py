from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from label_party.deps import PrincipalDep
from label_party.exception_handlers import responses
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
    noisy_label_loss: float
    max_abs_bias: float
    seconds: float


@router.post(
    "/v1/mechanisms/preview",
    response_model=PreviewRead,
    responses=responses(401, 422),
    summary="Fit a mechanism to a given prior: outputs, matrix, loss, bias (any role)",
)
def preview_mechanism(body: PreviewRequest, principal: PrincipalDep) -> PreviewRead:
    del principal  # any authenticated caller; no data is involved
    result = preview(
        mechanism=body.mechanism,
        epsilon=body.epsilon,
        values=body.values,
        prior=body.prior,
        loss=body.loss,
        mesh=body.mesh,
        params=body.params,
    )
    return PreviewRead.model_validate(result)
