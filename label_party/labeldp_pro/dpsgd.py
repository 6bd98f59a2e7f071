"""DP-SGD with a projection denoiser: Algorithm 1 of ``labeldp-pro.txt``.

Each step (Algorithm 1, lines 2–7):

1. Poisson-sample a batch ``I^G``: every example independently with rate
   ``q = B/n`` (the sampling the accountant assumes, §3.4; batch size varies);
2. per-example gradients ``∇_θ ℓ(θ, (x_i, y_i))`` by ``vmap(grad(...))``;
3. clip each to norm ``C``;
4. ``g̃ = (Σ clipped + N(0, σ²C²I)) / B`` with the *expected* batch size ``B`` —
   dividing by the realized size would make the scale label-independent but
   data-dependent in a way the accountant does not cover;
5. ``ĝ = Denoiser(g̃, θ, features)`` (Table 1; :mod:`.denoisers`);
6. an optimizer step with ``ĝ`` as the gradient.

σ is calibrated to the requested (ε, δ) before training (:mod:`.accounting`), with
amplification by subsampling only for the denoisers that keep it (Table 1).

What leaves this module is the model, the accounting record and a history of
label-free quantities (norms of the privatized gradient, timings). The training loss
on the private labels is *not* differentially private; it is only computed when
``report_training_loss`` is set, for in-process diagnostics (DESIGN.md §3.1).
"""

from __future__ import annotations

import copy
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional

from label_party.labeldp_pro.accounting import (
    AccountingRecord,
    account,
    amplification_for,
    calibrate_noise,
)
from label_party.labeldp_pro.denoisers import (
    CONVEX_HULL_DENOISERS,
    DEFAULT_PROJECTION_STEPS,
    DEFAULT_SMOOTHING,
    DENOISERS,
    PROJECTION_BACKENDS,
    PROJECTION_METHODS,
    Debias,
    DenoiserName,
    Params,
    Poll,
    ProjectionBackend,
    ProjectionMethod,
    denoise,
    no_poll,
    trainable_parameters,
    unflatten,
)

OptimizerName = Literal["sgd", "momentum", "adam", "rmsprop"]
OPTIMIZERS: Final[tuple[str, ...]] = get_args(OptimizerName)


class DivergedError(ValueError):
    """The weights or gradients stopped being finite numbers (too large a step)."""


@dataclass(frozen=True)
class LabelDPProConfig:
    """Public configuration of one LabelDP-Pro run (Algorithm 1; Appendix D.2).

    ``num_classes`` is the declared label domain (DESIGN.md §3.2), never read off
    the labels. ``alt_batch_size`` is ALTCONV's ``n₂``; ``projection_steps`` and
    ``projection_step_size`` drive §3.2's PGD (``None``: automatic step;
    ``projection_method="fista"`` accelerates it; ``projection_backend="dense"``
    holds ``G`` in memory, faster for small models: :mod:`.denoisers`);
    ``smoothing`` is §3.3's ``λ``; ``debias_draws`` > 0 subtracts a public-data
    estimate of the projection's noise-induced bias from each step's denoised
    gradient (convex hulls only; beyond the paper, post-processing:
    :func:`.denoisers.projection_noise_bias`); ``clip_vertices`` clips the projection set's
    per-class gradients at ``clip_norm`` like the signal (``False`` only for
    ablations; :mod:`.denoisers`). ``physical_batch_size`` bounds how many
    per-example gradients are held at once (memory only; no effect on privacy).
    """

    epsilon: float
    delta: float
    num_classes: int
    denoiser: DenoiserName = "alt-conv"
    epochs: int = 5
    expected_batch_size: int = 1024
    clip_norm: float = 1.0
    learning_rate: float = 0.1
    optimizer: OptimizerName = "sgd"
    momentum: float = 0.9
    alt_batch_size: int = 64
    projection_steps: int = DEFAULT_PROJECTION_STEPS
    projection_step_size: float | None = None
    projection_method: ProjectionMethod = "pgd"
    projection_backend: ProjectionBackend = "autodiff"
    smoothing: float = DEFAULT_SMOOTHING
    debias_draws: int = 0
    clip_vertices: bool = True
    physical_batch_size: int = 1024
    device: str = "cpu"
    report_training_loss: bool = False

    def __post_init__(self) -> None:
        _require(math.isfinite(self.epsilon) and self.epsilon > 0, "epsilon must be > 0")
        _require(0 < self.delta < 1, "delta must be in (0, 1)")
        _require(self.num_classes >= 2, "num_classes must be >= 2")
        _require(self.denoiser in DENOISERS, f"denoiser must be one of {', '.join(DENOISERS)}")
        _require(self.optimizer in OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        _require(self.epochs >= 1, "epochs must be >= 1")
        _require(self.expected_batch_size >= 1, "expected_batch_size must be >= 1")
        _require(self.clip_norm > 0, "clip_norm must be > 0")
        _require(self.learning_rate > 0, "learning_rate must be > 0")
        _require(0 <= self.momentum < 1, "momentum must be in [0, 1)")
        _require(self.alt_batch_size >= 1, "alt_batch_size must be >= 1")
        _require(self.projection_steps >= 0, "projection_steps must be >= 0")
        step = self.projection_step_size
        _require(step is None or step > 0, "projection_step_size must be > 0 or None")
        _require(0 <= self.smoothing <= 1, "smoothing must be in [0, 1]")
        _require(self.debias_draws >= 0, "debias_draws must be >= 0")
        _require(
            self.debias_draws == 0 or self.denoiser in CONVEX_HULL_DENOISERS,
            f"debias_draws applies to {' and '.join(CONVEX_HULL_DENOISERS)} only",
        )
        methods = ", ".join(PROJECTION_METHODS)
        _require(
            self.projection_method in PROJECTION_METHODS,
            f"projection_method must be one of {methods}",
        )
        _require(
            self.projection_backend in PROJECTION_BACKENDS,
            f"projection_backend must be one of {', '.join(PROJECTION_BACKENDS)}",
        )
        _require(self.physical_batch_size >= 1, "physical_batch_size must be >= 1")


@dataclass(frozen=True)
class ProgressEvent:
    """Sent to the ``report`` callback after every step.

    ``loss`` is None unless ``report_training_loss`` (it is not private).
    """

    epoch: int
    step: int
    total_steps: int
    elapsed_seconds: float
    eta_seconds: float
    loss: float | None = None


@dataclass(frozen=True)
class EpochSummary:
    """Label-free facts about one epoch; ``loss`` as in :class:`ProgressEvent`."""

    epoch: int
    steps: int
    seconds: float
    noisy_gradient_norm: float
    denoised_gradient_norm: float
    loss: float | None = None


@dataclass
class TrainingResult:
    """The trained model, its privacy guarantee and per-epoch history."""

    model: nn.Module
    accounting: AccountingRecord
    history: list[EpochSummary] = field(default_factory=list)


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class Checkpoint:
    """Where a run stands after ``step`` of its steps: enough to go on from there.

    Each state is a post-processing of the noisy gradients so far, so resuming
    from one and finishing is the same single DP-SGD run the plan accounted for;
    the rest of the run draws fresh noise (the generator is not part of it).
    """

    step: int
    model: dict[str, Tensor]
    optimizer: dict[str, Any]
    history: list[EpochSummary]
    #: The epoch under way, so far (None at an epoch's end): its summary, once
    #: resumed, covers the whole epoch, not only the steps since the resume.
    partial: EpochSummary | None = None


@dataclass(frozen=True)
class Checkpointing:
    """Save a :class:`Checkpoint` every ``every_steps`` steps (not after the last);
    start from ``resume`` when given."""

    every_steps: int
    save: Callable[[Checkpoint], None]
    resume: Checkpoint | None = None

    def __post_init__(self) -> None:
        _require(self.every_steps >= 1, "every_steps must be >= 1")


def secure_torch_generator(device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator seeded from the OS, for draws whose secrecy the guarantee
    does not rest on (ALTCONV's public batch, debiasing draws); the Poisson coins
    and the noise come from :class:`SecretDraws`. torch's CPU generator keeps only
    32 bits of its seed, whatever it is given."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(secrets.randbits(64))
    return gen


#: A Poisson coin compares a uniform 53-bit integer with ``⌊q·2⁵³⌋``, so that the
#: realized rate is never above the accounted ``q`` (float32 uniforms, multiples
#: of 2⁻²⁴, made it ``⌈q·2²⁴⌉/2²⁴``: +1.3 % at q = 10⁻⁶; helper-76).
_COIN_BITS = 53


class SecretDraws:
    """The draws the (ε, δ) guarantee rests on (DESIGN.md §3.5): the Poisson coins
    and the Gaussian noise. In production a numpy ``PCG64DXSM`` stream under 128
    fresh OS bits (the seeding of ``label_party.mechanisms.base.secure_generator``,
    whose ``PCG64`` the releases use):
    torch's CPU generator is an mt19937 that keeps 32 bits of any seed, and with
    2³² streams a features party that knows the initial weights and every other
    label found the seed, the noise and the label of a one-step training by search
    (helper-76). Tests pass a seeded torch generator instead, for repeatable runs."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self._torch = generator
        self._numpy = (
            None if generator is not None else np.random.Generator(
                np.random.PCG64DXSM(secrets.randbits(128))
            )
        )  # fmt: skip

    def noise_like(self, tensor: Tensor) -> Tensor:
        """Standard normal noise of ``tensor``'s shape, dtype and device."""
        if self._numpy is None:
            return torch.randn(tensor.shape, generator=self._torch, device=tensor.device,
                               dtype=tensor.dtype)  # fmt: skip
        draws = self._numpy.standard_normal(tensor.numel())
        return torch.from_numpy(draws).reshape(tensor.shape).to(tensor.device, tensor.dtype)

    def coins(self, n: int, q: float, device: torch.device) -> Tensor:
        """``n`` independent coins that come up with probability at most ``q``."""
        if self._numpy is None:
            return torch.rand(n, generator=self._torch, device=device) < q
        words = self._numpy.integers(0, 1 << _COIN_BITS, size=n, dtype=np.int64)
        return torch.from_numpy(words < math.floor(math.ldexp(q, _COIN_BITS))).to(device)


def clip_per_example(per_example: Tensor, clip_norm: float) -> Tensor:
    """Algorithm 1 line 4: scale row ``g`` by ``min(1, C/‖g‖)``; rows ``[b, d]``."""
    norms = torch.linalg.vector_norm(per_example, dim=1, keepdim=True)
    factors = torch.clamp(clip_norm / torch.clamp(norms, min=1e-12), max=1.0)
    return per_example * factors


def privatize(
    clipped_sum: Tensor,
    *,
    noise_multiplier: float,
    clip_norm: float,
    expected_batch_size: int,
    draws: SecretDraws,
) -> Tensor:
    """Algorithm 1 line 5: ``(Σ clipped + N(0, σ²C²I)) / B``, ``B`` the expected size."""
    noise = draws.noise_like(clipped_sum)
    return (clipped_sum + (noise_multiplier * clip_norm) * noise) / expected_batch_size


def per_example_gradients(
    model: nn.Module, params: Params, inputs: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor]:
    """Flat per-example gradients ``[b, d]`` and losses ``[b]`` via ``vmap(grad)``."""
    grads, losses = _per_example_gradients(model, params, inputs, labels)
    flat = torch.cat([g.reshape(inputs.shape[0], -1) for g in grads.values()], dim=1)
    return flat, losses


def _per_example_gradients(
    model: nn.Module, params: Params, inputs: Tensor, labels: Tensor
) -> tuple[Params, Tensor]:
    """Per-example gradients ``{name: [b, *shape]}`` and losses ``[b]``."""
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def loss_one(p: Params, x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return functional.cross_entropy(logits, y.unsqueeze(0))

    grads, losses = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0), randomness="different")(
        params, inputs, labels
    )
    return grads, losses


def _clip_factors(blocks: list[Tensor], clip_norm: float) -> Tensor:
    """``min(1, C/‖g_i‖)`` for each example's gradient, given as per-parameter blocks
    ``[b, d_k]``; an example whose gradient is not finite counts 0, its row zeroed
    in place. Its inf made the sum NaN and the training fail as diverged, and
    whether a gradient overflows can depend on its label: failure or success told
    one label apart with certainty (helper-76). Zero is within the sensitivity (a
    clipped row is at most C). Norms are summed in float64, whose squares of
    float32 values do not overflow."""
    squares = torch.stack(
        [torch.linalg.vector_norm(b, dim=1, dtype=torch.float64) ** 2 for b in blocks]
    )
    norms = squares.sum(dim=0).sqrt()
    broken = ~torch.isfinite(norms)
    if bool(broken.any()):
        for block in blocks:
            block[broken] = 0.0
        norms = torch.where(broken, torch.zeros_like(norms), norms)
    return torch.clamp(clip_norm / torch.clamp(norms, min=1e-12), max=1.0)


def clipped_gradient_sum(
    model: nn.Module,
    params: Params,
    inputs: Tensor,
    labels: Tensor,
    *,
    clip_norm: float,
    physical_batch_size: int,
    poll: Poll = no_poll,
) -> tuple[Tensor, Tensor]:
    """``Σ_i clip(g_i)`` over a batch (``physical_batch_size`` examples at a time,
    ``poll`` called before each) and the summed loss.

    Each example's norm is summed over the parameters' blocks, and each block is
    reduced by a weighted sum in place, so the per-example gradients are the only
    copy held: 4 bytes a parameter for each example of a physical batch (as
    :func:`clip_per_example` over a flat ``[b, d]`` matrix took three times that).
    """
    dim = sum(p.numel() for p in params.values())
    total = torch.zeros(dim, device=inputs.device, dtype=next(iter(params.values())).dtype)
    loss_sum = torch.zeros((), device=inputs.device)
    for start in range(0, int(inputs.shape[0]), physical_batch_size):
        poll()
        chunk = slice(start, start + physical_batch_size)
        grads, losses = _per_example_gradients(model, params, inputs[chunk], labels[chunk])
        blocks = [g.reshape(g.shape[0], -1) for g in grads.values()]
        factors = _clip_factors(blocks, clip_norm).to(total.dtype)
        total += torch.cat([factors @ block for block in blocks])
        loss_sum += losses.detach().sum()
        del grads, blocks  # before the next batch's, not after
    return total, loss_sum


def train_labeldp_pro(
    model: nn.Module,
    features: Tensor,
    labels: Tensor,
    *,
    config: LabelDPProConfig,
    report: ProgressCallback | None = None,
    generator: torch.Generator | None = None,
    noise_multiplier: float | None = None,
    checkpointing: Checkpointing | None = None,
    poll: Poll = no_poll,
) -> TrainingResult:
    """Train ``model`` with LabelDP-Pro (Algorithm 1) at the configured (ε, δ).

    ``features`` ``[n, ...]`` are public; ``labels`` ``[n]`` are the private class
    indices. ``generator`` drives the sampling and the noise; by default a fresh
    OS-seeded one (:func:`secure_torch_generator`) — pass one only in tests.
    ``noise_multiplier`` is a σ calibrated beforehand (the labels party plans it
    when it accepts a training); it is re-accounted here and refused if its ε
    exceeds the configured one. ``None`` calibrates σ here. ``checkpointing``
    saves the run's state as it goes and resumes an interrupted one. ``poll`` is
    called many times a step (between physical batches and projection steps); an
    exception it raises stops the run where it is (``report`` runs once a step).
    Returns the model (trained in place), its :class:`AccountingRecord` and history.
    """
    device = torch.device(config.device)
    _check_model(model)
    n = int(features.shape[0])
    _check_data(features, labels, n, config)
    x = features.to(device=device, dtype=torch.float32)
    y = labels.to(device=device, dtype=torch.int64)
    model.to(device)
    gen = generator if generator is not None else secure_torch_generator(device)
    draws = SecretDraws(generator)

    steps_per_epoch = max(1, round(n / config.expected_batch_size))
    total_steps = config.epochs * steps_per_epoch
    q = config.expected_batch_size / n
    amplification = amplification_for(config.denoiser)
    sigma = noise_multiplier
    if sigma is None:
        sigma = calibrate_noise(
            config.epsilon, config.delta, q, total_steps, amplification=amplification
        )
    record = account(sigma, q, total_steps, config.delta, amplification=amplification)
    if record.epsilon > config.epsilon:
        raise ValueError(
            f"noise multiplier {sigma:g} gives epsilon {record.epsilon:g} over "
            f"{total_steps} steps, above the configured {config.epsilon:g}"
        )

    optimizer = _make_optimizer(model, config)
    loop = _Loop(model, x, y, config, sigma, q, gen, draws, optimizer, poll)
    resume = checkpointing.resume if checkpointing is not None else None
    first = 0 if resume is None else _restore(model, optimizer, resume, total_steps)
    history: list[EpochSummary] = [] if resume is None else list(resume.history)
    started = time.perf_counter()
    partial = None if resume is None else resume.partial
    stats = _EpochStats(device, partial)
    epoch_start = started - (0.0 if partial is None else partial.seconds)
    for done in range(first + 1, total_steps + 1):
        epoch, within = divmod(done - 1, steps_per_epoch)
        loop.step(stats)
        if report is not None:
            report(_progress(epoch, done, first, total_steps, started, stats, config))
        if within == steps_per_epoch - 1:
            if device.type == "cuda":  # the epoch's kernels end before its clock stops
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            history.append(stats.summary(epoch, stats.steps, now - epoch_start))
            stats, epoch_start = _EpochStats(device), now
        if checkpointing is not None and _due(checkpointing, done, total_steps):
            so_far = None  # at an epoch's end: its summary is in the history
            if stats.steps:
                so_far = stats.summary(epoch, stats.steps, time.perf_counter() - epoch_start)
            checkpointing.save(_snapshot(model, optimizer, done, history, so_far))
    return TrainingResult(model=model, accounting=record, history=history)


def _due(checkpointing: Checkpointing, done: int, total_steps: int) -> bool:
    """Every ``every_steps`` steps, but not after the last (the model is the result)."""
    return done % checkpointing.every_steps == 0 and done < total_steps


def _snapshot(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    history: list[EpochSummary],
    partial: EpochSummary | None,
) -> Checkpoint:
    """Copies (on the CPU) of the state after ``step``: training goes on meanwhile."""
    return Checkpoint(
        step=step,
        model={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
        optimizer=copy.deepcopy(_to_cpu(optimizer.state_dict())),
        history=list(history),
        partial=partial,
    )


def _to_cpu(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


def _restore(
    model: nn.Module, optimizer: torch.optim.Optimizer, resume: Checkpoint, total_steps: int
) -> int:
    """Load ``resume`` into the model and optimizer; the step to go on from."""
    if not 0 < resume.step < total_steps:
        raise ValueError(
            f"checkpoint is at step {resume.step}, outside this run's 1..{total_steps - 1}"
        )
    model.load_state_dict(resume.model)
    optimizer.load_state_dict(resume.optimizer)
    return resume.step


class _Loop:
    """One step of Algorithm 1 with fixed public parameters."""

    def __init__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        config: LabelDPProConfig,
        sigma: float,
        q: float,
        generator: torch.Generator,
        draws: SecretDraws,
        optimizer: torch.optim.Optimizer,
        poll: Poll = no_poll,
    ) -> None:
        self.model, self.x, self.y, self.config = model, x, y, config
        self.sigma, self.q, self.gen, self.optimizer = sigma, q, generator, optimizer
        self.draws = draws
        self.poll = poll
        self.n = int(x.shape[0])

    def step(self, stats: _EpochStats) -> None:
        cfg = self.config
        params = trainable_parameters(self.model)
        batch = poisson_sample(self.n, self.q, self.draws, self.x.device)
        clipped, loss_sum = clipped_gradient_sum(
            self.model,
            params,
            self.x[batch],
            self.y[batch],
            clip_norm=cfg.clip_norm,
            physical_batch_size=cfg.physical_batch_size,
            poll=self.poll,
        )
        noisy = privatize(
            clipped,
            noise_multiplier=self.sigma,
            clip_norm=cfg.clip_norm,
            expected_batch_size=cfg.expected_batch_size,
            draws=self.draws,
        )
        if not bool(torch.isfinite(noisy).all()):  # a function of DP outputs: public
            raise DivergedError(
                "the model diverged: a noisy gradient is not finite; train with a "
                "smaller learning_rate or clip_norm"
            )
        denoised = denoise(
            cfg.denoiser,
            noisy,
            self.model,
            self._projection_inputs(batch),
            cfg.num_classes,
            steps=cfg.projection_steps,
            step_size=cfg.projection_step_size,
            smoothing=cfg.smoothing,
            method=cfg.projection_method,
            vertex_clip_norm=cfg.clip_norm if cfg.clip_vertices else None,
            backend=cfg.projection_backend,
            debias=self._debias(),
            poll=self.poll,
        )
        self._apply(params, denoised)
        stats.add(batch.numel(), noisy, denoised, loss_sum if cfg.report_training_loss else None)

    def _debias(self) -> Debias | None:
        cfg = self.config
        if cfg.debias_draws == 0:
            return None
        noise_std = self.sigma * cfg.clip_norm / cfg.expected_batch_size  # privatize's noise
        return Debias(draws=cfg.debias_draws, noise_std=noise_std, generator=self.gen)

    def _projection_inputs(self, batch: Tensor) -> Tensor | None:
        """Features spanning the projection set (Table 1): ``I^G`` or a fresh ``I^P``."""
        if self.config.denoiser == "noop":
            return None
        if self.config.denoiser == "alt-conv":
            # I^P: n₂ examples uniformly without replacement, independent of I^G.
            n2 = min(self.config.alt_batch_size, self.n)
            alt = torch.randperm(self.n, generator=self.gen, device=self.x.device)[:n2]
            return self.x[alt]
        return self.x[batch]

    def _apply(self, params: Params, gradient: Tensor) -> None:
        """Line 7: hand ``ĝ`` to the optimizer as the parameters' gradient."""
        grads = unflatten(gradient, params)
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                p.grad = grads[name].detach().clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def poisson_sample(n: int, q: float, draws: SecretDraws, device: torch.device) -> Tensor:
    """Algorithm 1, line 2 (Poisson sampling): the indices of a batch holding each of
    ``n`` examples independently with probability ``q``; its size varies."""
    return draws.coins(n, q, device).nonzero().squeeze(1)


class _EpochStats:
    """Running sums kept on the device, read once per epoch (no per-step sync)."""

    def __init__(self, device: torch.device, so_far: EpochSummary | None = None) -> None:
        """Empty, or going on from ``so_far`` (a checkpoint's epoch under way)."""
        steps = 0 if so_far is None else so_far.steps
        self.steps = steps
        self.noisy = torch.tensor(0.0 if so_far is None else so_far.noisy_gradient_norm * steps,
                                  device=device)  # fmt: skip
        self.denoised = torch.tensor(
            0.0 if so_far is None else so_far.denoised_gradient_norm * steps, device=device
        )
        self.loss: Tensor | None = None
        if so_far is not None and so_far.loss is not None:
            self.loss = torch.tensor(so_far.loss * steps, device=device)
        self.last_loss: Tensor | None = None

    def add(self, batch_size: int, noisy: Tensor, denoised: Tensor, loss: Tensor | None) -> None:
        # No batch sizes are kept: the sampled batch I^G is the subsampling's secret
        # (the accountant's amplification assumes it hidden), so nothing reports them.
        self.steps += 1
        self.noisy += torch.linalg.vector_norm(noisy)
        self.denoised += torch.linalg.vector_norm(denoised)
        if loss is not None:
            mean = loss / max(batch_size, 1)
            self.last_loss = mean
            self.loss = mean if self.loss is None else self.loss + mean

    def summary(self, epoch: int, steps: int, seconds: float) -> EpochSummary:
        return EpochSummary(
            epoch=epoch,
            steps=steps,
            seconds=seconds,
            noisy_gradient_norm=float(self.noisy) / steps,
            denoised_gradient_norm=float(self.denoised) / steps,
            loss=None if self.loss is None else float(self.loss) / steps,
        )


def _progress(
    epoch: int,
    done: int,
    first: int,
    total: int,
    started: float,
    stats: _EpochStats,
    config: LabelDPProConfig,
) -> ProgressEvent:
    """Step ``done`` of ``total``; the ETA from this process's pace (since ``first``)."""
    elapsed = time.perf_counter() - started
    loss = None
    if config.report_training_loss and stats.last_loss is not None:
        loss = float(stats.last_loss)
    return ProgressEvent(
        epoch=epoch,
        step=done,
        total_steps=total,
        elapsed_seconds=elapsed,
        eta_seconds=elapsed / (done - first) * (total - done),
        loss=loss,
    )


def _make_optimizer(model: nn.Module, config: LabelDPProConfig) -> torch.optim.Optimizer:
    """Table 8: SGD for the image tasks, RMSprop for Criteo; Adam and momentum too."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = config.learning_rate
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if config.optimizer == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.RMSprop(params, lr=lr)


def _check_model(model: nn.Module) -> None:
    """Per-example gradients need examples that do not see each other."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                "models with batch normalization are not supported by DP-SGD: "
                "batch statistics mix examples; use GroupNorm or LayerNorm"
            )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model has no trainable parameters")


def _check_data(features: Tensor, labels: Tensor, n: int, config: LabelDPProConfig) -> None:
    # Messages name the problem, never a label value or statistic (DESIGN.md §3.1).
    if labels.dim() != 1 or int(labels.shape[0]) != n:
        raise ValueError("labels must be a 1-D tensor with one entry per feature row")
    if n < 1:
        raise ValueError("no training examples")
    if config.expected_batch_size > n:
        raise ValueError("expected_batch_size must not exceed the number of examples")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError("labels must be integer class indices")
    in_domain = bool(((labels >= 0) & (labels < config.num_classes)).all())
    if not in_domain:
        raise ValueError("labels must be class indices in [0, num_classes)")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
