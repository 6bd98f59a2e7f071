"""Optimizers of the training loop: the configured one (RMSProp, Adam, SGD) for the
dense layers, and the same algorithm applied *lazily, row by row* to the
embedding table.

Why lazy rows. A batch of 8192 Criteo-shaped examples touches a few tens of
thousands of the embedding table's rows (hundreds of thousands in all). A dense
update walks every row on every step — the gradient is scattered into a full
table-sized tensor, then RMSProp reads and writes the whole table and its
moment buffers — and on a CPU that costs more than the MLP itself. With sparse
embedding gradients (``TabularMLP.sparse_gradients``) :class:`LazyRowOptimizer`
sums the gradient per touched row and applies the configured update to those
rows only — the way TensorFlow/Keras apply sparse (``IndexedSlices``) gradients
with RMSProp, Adam (LazyAdam) and momentum SGD, i.e. as the papers' models were
trained.

What differs from the dense update, for the embedding rows only:

* a row absent from a batch is left alone: its moment estimates do not decay and
  the L2 weight-decay term is not applied to it that step (it is applied, as part
  of the gradient, on the steps that touch the row);
* Adam's bias correction uses the global step count (as ``torch.optim.SparseAdam``
  and LazyAdam do).

Rows touched by a batch get exactly the configured update (same formulas and
hyper-parameters as ``torch.optim.RMSprop`` / ``Adam`` / ``SGD``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
from torch import nn

from feature_party.training.config import TrainingConfig

__all__ = ["Algorithm", "LazyRowOptimizer", "build_optimizers"]

Algorithm = Literal["rmsprop", "adam", "sgd"]

#: Hyper-parameters the dense optimizers use by default (torch's defaults).
_RMSPROP_ALPHA, _ADAM_BETAS, _EPS = 0.99, (0.9, 0.999), 1e-8


class LazyRowOptimizer(torch.optim.Optimizer):
    """RMSProp, Adam or momentum SGD on the rows of 2-D parameters that have a
    gradient: sparse gradients (duplicate rows allowed) update only the rows they
    name; a dense gradient updates every row (then this is the dense algorithm,
    with Adam's step counted per parameter)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        algorithm: Algorithm,
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum}
        super().__init__(params, defaults)
        self.algorithm: Algorithm = algorithm
        # Scratch space for summing duplicate rows; not optimizer state (never saved).
        self._scratch: dict[int, torch.Tensor] = {}

    def _rows(self, p: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Touched row indices (ascending, unique) and the summed gradient per row."""
        if not grad.is_sparse:
            return torch.arange(p.shape[0], device=p.device), grad
        index, values = grad._indices()[0], grad._values()
        buf = self._scratch.get(id(p))
        if buf is None or buf.shape != p.shape:
            buf = self._scratch[id(p)] = torch.zeros_like(p)
        # Sum duplicates in a table-sized scratch buffer (a scatter, no sort), find
        # the touched rows with a count, read them out and clear just those rows.
        buf.index_add_(0, index, values)
        rows = torch.bincount(index, minlength=p.shape[0]).nonzero().squeeze(1)
        summed = buf.index_select(0, rows)
        buf.index_fill_(0, rows, 0.0)
        return rows, summed

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                rows, g = self._rows(p, p.grad)
                w = p.index_select(0, rows)
                if wd:
                    g = g.add(w, alpha=wd)
                state = self.state[p]
                if self.algorithm == "rmsprop":
                    if not state:
                        state["square_avg"] = torch.zeros_like(p)
                    v = state["square_avg"].index_select(0, rows)
                    v.mul_(_RMSPROP_ALPHA).addcmul_(g, g, value=1 - _RMSPROP_ALPHA)
                    w.addcdiv_(g, v.sqrt().add_(_EPS), value=-lr)
                    state["square_avg"].index_copy_(0, rows, v)
                elif self.algorithm == "adam":
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float64)
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] += 1
                    t = float(state["step"])
                    b1, b2 = _ADAM_BETAS
                    m = state["exp_avg"].index_select(0, rows).lerp_(g, 1 - b1)
                    v = state["exp_avg_sq"].index_select(0, rows)
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                    denom = (v / (1 - b2**t)).sqrt_().add_(_EPS)
                    w.addcdiv_(m, denom, value=-lr / (1 - b1**t))
                    state["exp_avg"].index_copy_(0, rows, m)
                    state["exp_avg_sq"].index_copy_(0, rows, v)
                else:  # sgd
                    if momentum:
                        if not state:
                            state["momentum_buffer"] = torch.zeros_like(p)
                        b = state["momentum_buffer"].index_select(0, rows).mul_(momentum).add_(g)
                        state["momentum_buffer"].index_copy_(0, rows, b)
                        g = b
                    w.add_(g, alpha=-lr)
                p.index_copy_(0, rows, w)
        return loss


def _dense(params: list[torch.Tensor], config: TrainingConfig) -> torch.optim.Optimizer:
    lr, wd = config.learning_rate, config.weight_decay
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    return torch.optim.RMSprop(params, lr=lr, weight_decay=wd)


def build_optimizers(
    model: nn.Module, config: TrainingConfig, *, lazy: list[torch.Tensor] | None = None
) -> list[torch.optim.Optimizer]:
    """The configured optimizer for every parameter not in ``lazy``, then a
    :class:`LazyRowOptimizer` with the same algorithm and hyper-parameters for
    ``lazy`` (the embedding table, whose gradients are sparse)."""
    lazy = lazy or []
    lazy_ids = {id(p) for p in lazy}
    optimizers = [_dense([p for p in model.parameters() if id(p) not in lazy_ids], config)]
    if lazy:
        optimizers.append(
            LazyRowOptimizer(
                lazy,
                algorithm=config.optimizer,
                lr=config.learning_rate,
                weight_decay=config.weight_decay,
                momentum=config.momentum if config.optimizer == "sgd" else 0.0,
            )
        )
    return optimizers
