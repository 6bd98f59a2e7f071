"""The mark for tests of the CUDA paths: they run on a machine with a GPU (the
device machine, a GPU worker's host) and are skipped, with the reason, elsewhere
(CI has no GPU). ``pytest -m cuda`` selects only them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

F = TypeVar("F", bound=Callable[..., object])

_skip_without_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"
)


def needs_cuda(test: F) -> F:
    """Mark ``test`` ``cuda`` and skip it where torch sees no CUDA device."""
    marked: F = pytest.mark.cuda(_skip_without_cuda(test))
    return marked
