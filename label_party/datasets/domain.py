"""Declared label domains: public configuration, never computed from labels (DESIGN.md §3.2).

Regression: ``{"min", "max", "clip": false, "step" | "grid_size": 101}`` — the grid
is ``min, min+step, …, max`` or ``grid_size`` evenly spaced values. Classification:
``{"num_classes": K}`` or ``{"classes": [names…]}``; labels are class indices
``0 … K−1`` (uploads may use the names).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from label_party.mechanisms.base import FloatArray

#: The most values (grid points or classes) any domain may have; the operator's
#: ``LABELDP_MAX_GRID_SIZE`` (default 10,001) bounds datasets below it.
MAX_DOMAIN_SIZE = 100_000


class RegressionDomain(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["regression"] = "regression"
    min: float
    max: float
    clip: bool = False
    step: float | None = Field(default=None, gt=0)
    grid_size: int | None = Field(default=None, ge=2, le=MAX_DOMAIN_SIZE)

    @model_validator(mode="after")
    def _check(self) -> RegressionDomain:
        if not (math.isfinite(self.min) and math.isfinite(self.max)) or self.min >= self.max:
            raise ValueError("the domain needs finite min < max")
        if not math.isfinite(self.max - self.min):  # the sensitivity of additive noise
            raise ValueError("max − min must be a finite float (at most 1.8e308)")
        if self.step is not None and self.grid_size is not None:
            raise ValueError("give either step or grid_size, not both")
        if self.step is not None:
            count = (self.max - self.min) / self.step
            # At most as many steps as before MAX_DOMAIN_SIZE was named (a stored
            # domain of 100,000 steps must still read); LABELDP_MAX_GRID_SIZE, at
            # most MAX_DOMAIN_SIZE, refuses such a grid for a new dataset.
            if not count <= MAX_DOMAIN_SIZE:  # also an infinite count: a step of 1e-320
                raise ValueError(f"(max − min) / step must be at most {MAX_DOMAIN_SIZE:,} steps")
            if abs(count - round(count)) > 1e-9 * max(1.0, count):
                raise ValueError("(max − min) must be a whole number of steps")
        return self

    @property
    def size(self) -> int:
        if self.step is not None:
            return round((self.max - self.min) / self.step) + 1
        return self.grid_size or 101

    def grid(self) -> FloatArray:
        values: FloatArray = np.linspace(self.min, self.max, self.size)
        return values


#: The longest class name (as a dataset's name).
MAX_CLASS_NAME = 200


def check_text(text: str, what: str) -> None:
    """:class:`ValueError` for text a response cannot carry or a CSV cannot give:
    a lone surrogate (JSON's ``"\ud800"``: the answer's serialization failed, a
    500; helper-70), an empty string, or one longer than :data:`MAX_CLASS_NAME`."""
    if not 0 < len(text) <= MAX_CLASS_NAME:
        raise ValueError(f"{what} must be 1 to {MAX_CLASS_NAME} characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode (a lone surrogate)") from None


class ClassificationDomain(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["classification"] = "classification"
    num_classes: int | None = Field(default=None, ge=2, le=MAX_DOMAIN_SIZE)
    classes: list[str] | None = Field(default=None, min_length=2, max_length=MAX_DOMAIN_SIZE)

    @model_validator(mode="after")
    def _check(self) -> ClassificationDomain:
        if (self.num_classes is None) == (self.classes is None):
            raise ValueError("give exactly one of num_classes or classes")
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise ValueError("class names must be distinct")
        for name in self.classes or ():
            check_text(name, "a class name")
        return self

    @property
    def size(self) -> int:
        if self.classes is not None:
            return len(self.classes)
        assert self.num_classes is not None
        return self.num_classes

    def grid(self) -> FloatArray:
        values: FloatArray = np.arange(self.size, dtype=np.float64)
        return values


def parse_domain(task: str, raw: dict[str, object]) -> RegressionDomain | ClassificationDomain:
    """The domain of a ``task`` dataset; a ``kind`` in ``raw`` must name that task."""
    data = {"kind": task, **raw}
    if task == "regression":
        return RegressionDomain.model_validate(data)
    return ClassificationDomain.model_validate(data)
