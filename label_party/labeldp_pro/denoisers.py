"""Projection denoisers of LabelDP-Pro (``labeldp-pro.txt`` Table 1, §3.2, §3.3).

A denoiser maps the privatized gradient ``g̃`` of Algorithm 1 (line 6) to a better
estimate using only public information: the model weights and *features*. Every
projection set is built from the per-example per-class gradients

    G = [∇_θ ℓ(θ, (x_i, κ))]_{i ∈ I, κ ∈ [K]}        (d × |I|·K, §3.2)

of examples ``I`` — the batch itself (SELFSPAN, SELFCONV) or an independent batch
``I^P`` (ALTCONV) — with every class label, so no label enters.

``G`` is never materialized (§3.2, Appendix C). With the stacked loss map
``L : θ ↦ [ℓ(θ, (x_i, κ))]_{i, κ}`` (so ``Gᵀ`` is its Jacobian):

* ``G·u`` is a vector-Jacobian product of ``L`` with cotangent ``u`` (reverse mode);
* ``Gᵀ·v`` is a Jacobian-vector product of ``L`` in direction ``v`` (forward mode).

**Vertices are clipped like the signal.** Algorithm 1 privatizes the mean of
*clipped* gradients ``ḡ = g / max(1, ‖g‖/C)`` (line 4). That mean lies in the hull
of the *clipped* per-class gradients — §3.1's premise, in the C-bounded setting of
Lemma 4 — and that hull is on the signal's scale. (It also lies in the raw hull,
which contains 0, but that set is far larger: on the Table-10a CNN after a few
steps the raw columns are ~50× ‖ḡ‖.) A larger set keeps more of the noise, and
§3.3's smoothing term ``(1 − λ)·Gβ`` over raw columns swamps the signal: on
Fashion-MNIST the denoised gradient's cosine with the true one fell to ≈ 0 with
raw columns and λ = 0.75 (bench/README.md, "LabelDP-Pro").
So ``G``'s columns are scaled by ``s_{iκ} = min(1, C/‖∇ℓ(x_i, κ)‖)``: ``G_C = G·diag(s)``,
``G_C·u = G·(s ⊙ u)`` and ``G_Cᵀ·v = s ⊙ (Gᵀ·v)``. The ``|I|·K`` column norms are
computed once per projection, a chunk of examples at a time, so ``G`` is still
never held whole. ``clip_norm=None`` keeps the raw columns (ablation only).

**Two backends, one operator.** ``autodiff`` (the default) is §3.2's: ``G·u`` and
``Gᵀ·v`` by reverse and forward mode, memory ``O(d + |I|·K)``, one network pass
each. ``dense`` builds ``G`` once per projection, a chunk of per-example Jacobians
at a time — the very pass that the column norms already make — and then every
step is two matrix-vector products. It holds ``|I|·K·d`` floats, so past
:data:`DENSE_MAX_BYTES` it falls back to ``autodiff``. On the Table-10a CNN
(d = 9,066) ``G`` takes 23 MiB at n₂ = 64 and 354 MiB at n₂ = 1024
(bench/README.md, "Projection backends", for the time each saves). The
projection's result is the same up to float rounding
(tests/unit/test_labeldp_pro_denoisers.py).

Columns are ordered example-major: column ``i·K + κ`` is example ``i``, class ``κ``.
Flat parameter vectors concatenate the model's trainable parameters in
``named_parameters`` order (:func:`trainable_parameters`).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal, get_args

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

DenoiserName = Literal["noop", "self-span", "self-conv", "alt-conv"]
DENOISERS: Final[tuple[str, ...]] = get_args(DenoiserName)
#: The denoisers that project onto a convex hull (Table 1).
CONVEX_HULL_DENOISERS: Final[tuple[str, ...]] = ("self-conv", "alt-conv")
ProjectionMethod = Literal["pgd", "fista"]
PROJECTION_METHODS: Final[tuple[str, ...]] = get_args(ProjectionMethod)
ProjectionBackend = Literal["autodiff", "dense"]
PROJECTION_BACKENDS: Final[tuple[str, ...]] = get_args(ProjectionBackend)

#: §3.3: "a λ value of 0.75 yields the best results".
DEFAULT_SMOOTHING: Final = 0.75
#: Appendix D.4: "we run 200 steps to solve the projection coefficients".
DEFAULT_PROJECTION_STEPS: Final = 200
#: Power iterations for the automatic PGD step size.
POWER_ITERATIONS: Final = 8
#: Per-example Jacobian entries held at once while computing column norms (64 MiB).
NORM_CHUNK_FLOATS: Final = 16 * 2**20
#: The most memory the ``dense`` backend may hold for ``G`` (1 GiB).
DENSE_MAX_BYTES: Final = 2**30

Params = dict[str, Tensor]


def trainable_parameters(model: nn.Module) -> Params:
    """Detached trainable parameters by name, in ``named_parameters`` order."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def flatten(tensors: Params) -> Tensor:
    """Concatenate a parameter-shaped dict into one flat vector."""
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def unflatten(vector: Tensor, like: Params) -> Params:
    """Split a flat vector back into the shapes of ``like`` (views, no copy)."""
    sizes = [t.numel() for t in like.values()]
    parts = torch.split(vector, sizes)
    return {name: part.view_as(t) for (name, t), part in zip(like.items(), parts, strict=True)}


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` deterministically (no dropout), restoring its mode after.

    ``G·u`` and ``Gᵀ·v`` must see the same function ``L``; a dropout mask drawn
    afresh on every call would make them transposes of different matrices.
    """
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@functools.cache
def _prepare_forward_mode() -> None:
    """Load torch's forward-mode decompositions once, hiding the warning they raise.

    The first dual tensor makes torch ``jit.script`` its own JVP decompositions,
    which torch ≥ 2.10 flags with a ``DeprecationWarning`` about itself; nothing
    here uses ``jit``. Only that message is silenced, only during the load.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`torch\.jit\.script` is deprecated", category=DeprecationWarning
        )
        with torch.autograd.forward_ad.dual_level():
            torch.autograd.forward_ad.make_dual(  # type: ignore[no-untyped-call]
                torch.zeros(1), torch.zeros(1)
            )


def _check_arguments(num_classes: int, clip_norm: float | None) -> None:
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")


def _check_output(logits: Tensor, inputs: Tensor, num_classes: int) -> None:
    """The model must give one logit per declared class for every input."""
    expected = (int(inputs.shape[0]), num_classes)
    if tuple(logits.shape) != expected:
        raise ValueError(f"model output has shape {tuple(logits.shape)}, expected {expected}")


class PerClassGradients:
    """The matrix ``G`` of §3.2 as a linear operator, built without materializing it.

    ``inputs`` are the features of the examples whose per-class gradients span the
    projection set; ``K = num_classes`` columns per example. The loss is the
    cross-entropy ``ℓ(v, κ) = −log softmax(v)_κ`` (§2, Appendix C).
    ``clip_norm`` ``C`` clips every column like Algorithm 1 clips the signal
    (module docstring); ``None`` keeps raw columns.
    ``probabilities`` ``[n, K]`` are the model's softmax outputs on ``inputs``
    (a by-product of the recorded forward pass; features only, no labels).
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: Tensor,
        num_classes: int,
        *,
        clip_norm: float | None = None,
    ) -> None:
        _check_arguments(num_classes, clip_norm)
        _prepare_forward_mode()
        self.model = model
        self.inputs = inputs
        self.num_classes = num_classes
        self.params = trainable_parameters(model)
        self.buffers = {name: b.detach() for name, b in model.named_buffers()}
        self.num_columns = int(inputs.shape[0]) * num_classes
        self.dim = sum(p.numel() for p in self.params.values())
        # The reverse pass is linear in the cotangent: record it once, replay it
        # for every G·u of the projection loop.
        losses, self._vjp_fn = vjp(self.stacked_losses, self.params)[:2]
        self.probabilities = torch.exp(-losses.detach()).reshape(-1, num_classes)
        self.scales: Tensor | None = None
        if clip_norm is not None:
            norms = self.column_norms()
            self.scales = torch.clamp(clip_norm / torch.clamp(norms, min=1e-12), max=1.0)

    def stacked_losses(self, params: Params) -> Tensor:
        """``L(θ)``: the loss of every (example, class) pair, example-major."""
        logits = functional_call(self.model, (params, self.buffers), (self.inputs,))
        _check_output(logits, self.inputs, self.num_classes)
        return (-torch.log_softmax(logits, dim=-1)).reshape(-1)

    def matvec(self, u: Tensor) -> Tensor:
        """``G·u`` (``u`` ∈ R^{|I|·K}) → R^d: a VJP of ``L`` with cotangent ``u``."""
        if self.scales is not None:
            u = u * self.scales
        # Under no_grad the replay builds no graph for a second derivative.
        with torch.no_grad():
            (grads,) = self._vjp_fn(u.to(dtype=self._dtype))
        return flatten(grads)

    def rmatvec(self, v: Tensor) -> Tensor:
        """``Gᵀ·v`` (``v`` ∈ R^d) → R^{|I|·K}: a JVP of ``L`` in direction ``v``."""
        tangent = unflatten(v.to(dtype=self._dtype), self.params)
        with torch.no_grad():
            out: Tensor = jvp(self.stacked_losses, (self.params,), (tangent,))[1]
        return out if self.scales is None else out * self.scales

    def column_norms(self, max_floats: int = NORM_CHUNK_FLOATS) -> Tensor:
        """``‖∇ℓ(x_i, κ)‖`` of the *raw* columns, example-major like ``G``.

        A block of at most ``max_floats`` Jacobian entries at a time
        (:func:`_jacobian_rows`), reduced to norms and dropped.
        """
        blocks = _jacobian_rows(
            self.model, self.params, self.buffers, self.inputs, self.num_classes, max_floats
        )
        return torch.cat([torch.linalg.vector_norm(rows, dim=1) for rows in blocks])

    def dense(self) -> Tensor:
        """``G`` itself, ``d × |I|·K``, through ``jacrev``. For tests on small models."""
        jac = jacrev(self.stacked_losses)(self.params)
        rows = [j.reshape(self.num_columns, -1) for j in jac.values()]
        g = torch.cat(rows, dim=1).T
        return g if self.scales is None else g * self.scales

    @property
    def _dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype


def _jacobian_rows(
    model: nn.Module,
    params: Params,
    buffers: Params,
    inputs: Tensor,
    num_classes: int,
    max_floats: int = NORM_CHUNK_FLOATS,
) -> Iterator[Tensor]:
    """The raw columns of ``G`` as rows: ``[chunk·K, d]`` blocks, example-major.

    Per-example Jacobians of the ``K`` losses by ``vmap(jacrev)``, at most
    ``max_floats`` entries a block, their parameters in ``named_parameters`` order
    (:func:`flatten`'s).
    """
    n = int(inputs.shape[0])
    dim = sum(p.numel() for p in params.values())
    chunk = max(1, max_floats // (num_classes * max(dim, 1)))

    def losses_one(p: Params, x: Tensor) -> Tensor:
        logits = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return -torch.log_softmax(logits, dim=-1).reshape(-1)

    per_example = vmap(jacrev(losses_one), in_dims=(None, 0))
    with torch.no_grad():
        for start in range(0, n, chunk):
            jac = per_example(params, inputs[start : start + chunk])
            yield torch.cat([j.reshape(j.shape[0] * num_classes, -1) for j in jac.values()], dim=1)


def _dense_bytes(params: Params, num_columns: int) -> int:
    """The memory ``G`` takes when held: ``num_columns × d`` entries of the parameters' dtype."""
    return num_columns * sum(p.numel() * p.element_size() for p in params.values())


class DensePerClassGradients:
    """``G`` held whole: the ``dense`` backend (module docstring).

    The same operator as :class:`PerClassGradients` — ``matvec``, ``rmatvec``,
    ``probabilities``, ``scales`` — built from :func:`_jacobian_rows` into one
    ``[|I|·K, d]`` matrix whose rows are ``G``'s (clipped) columns. Refuses, before
    allocating, when that matrix would exceed ``max_bytes``.
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: Tensor,
        num_classes: int,
        *,
        clip_norm: float | None = None,
        max_bytes: int = DENSE_MAX_BYTES,
    ) -> None:
        _check_arguments(num_classes, clip_norm)
        self.inputs = inputs
        self.num_classes = num_classes
        self.params = trainable_parameters(model)
        buffers = {name: b.detach() for name, b in model.named_buffers()}
        self.num_columns = int(inputs.shape[0]) * num_classes
        self.dim = sum(p.numel() for p in self.params.values())
        dtype = next(iter(self.params.values())).dtype
        size = _dense_bytes(self.params, self.num_columns)
        if size > max_bytes:
            raise ValueError(
                f"the dense projection would hold G of {size / 2**20:.0f} MiB "
                f"({self.num_columns} columns × {self.dim} parameters), over its "
                f"{max_bytes / 2**20:.0f} MiB limit; use the autodiff backend"
            )
        with torch.no_grad():
            logits = functional_call(model, (self.params, buffers), (inputs,))
        _check_output(logits, inputs, num_classes)
        self.probabilities = torch.softmax(logits, dim=-1)
        self.rows = torch.empty(self.num_columns, self.dim, dtype=dtype, device=inputs.device)
        start = 0
        for block in _jacobian_rows(model, self.params, buffers, inputs, num_classes):
            self.rows[start : start + block.shape[0]] = block
            start += block.shape[0]
        self.scales: Tensor | None = None
        if clip_norm is not None:
            norms = torch.linalg.vector_norm(self.rows, dim=1)
            self.scales = torch.clamp(clip_norm / torch.clamp(norms, min=1e-12), max=1.0)
            self.rows.mul_(self.scales.unsqueeze(1))

    def matvec(self, u: Tensor) -> Tensor:
        """``G·u`` → R^d."""
        return u.to(self.rows.dtype) @ self.rows

    def rmatvec(self, v: Tensor) -> Tensor:
        """``Gᵀ·v`` → R^{|I|·K}."""
        return self.rows @ v.to(self.rows.dtype)

    def dense(self) -> Tensor:
        """``G``, ``d × |I|·K`` (a view)."""
        return self.rows.T


GradientOperator = PerClassGradients | DensePerClassGradients
#: Called between a projection's steps; it raises to stop the run (a cancelled or
#: shut-down training must not wait out a projection of many steps).
Poll = Callable[[], None]


def no_poll() -> None:
    """The default :data:`Poll`: never stops a run."""


def per_class_gradients(
    model: nn.Module,
    inputs: Tensor,
    num_classes: int,
    *,
    clip_norm: float | None = None,
    backend: ProjectionBackend = "autodiff",
    max_dense_bytes: int = DENSE_MAX_BYTES,
) -> GradientOperator:
    """``G`` as an operator, by the named backend (module docstring).

    ``dense`` falls back to ``autodiff`` — the same projection — for a ``G`` over
    ``max_dense_bytes``: a training asked for ``dense`` never fails for memory
    mid-run, after its budget was charged (SELF* batches are Poisson-sized).
    """
    if backend not in PROJECTION_BACKENDS:
        names = ", ".join(PROJECTION_BACKENDS)
        raise ValueError(f"backend must be one of {names}, got {backend!r}")
    columns = int(inputs.shape[0]) * num_classes
    if backend == "dense" and _dense_bytes(trainable_parameters(model), columns) <= max_dense_bytes:
        return DensePerClassGradients(
            model, inputs, num_classes, clip_norm=clip_norm, max_bytes=max_dense_bytes
        )
    return PerClassGradients(model, inputs, num_classes, clip_norm=clip_norm)


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of each row (last axis) onto the unit simplex.

    The sort-based algorithm of Wang & Carreira-Perpiñán (2013), cited in §3.2:
    with ``u`` sorted descending, ``ρ = max{j : u_j + (1 − Σ_{r≤j} u_r)/j > 0}``,
    ``τ = (Σ_{r≤ρ} u_r − 1)/ρ``, and the projection is ``max(v − τ, 0)``.
    Vectorized over leading axes.
    """
    m = v.shape[-1]
    # In float64: in float32, u₁ − (u₁ − 1) is 0 once u₁ ≥ 2²⁴ (a large step size
    # makes such entries), which left ρ at 0 and the gather out of range.
    wide = v.to(torch.float64)
    u, _ = torch.sort(wide, dim=-1, descending=True)
    excess = u.cumsum(dim=-1) - 1.0
    ranks = torch.arange(1, m + 1, device=v.device, dtype=torch.float64)
    # The condition holds on a prefix of the sorted entries, so counting its
    # True entries gives ρ without a data-dependent loop; it holds at j = 1.
    rho = (u - excess / ranks > 0).sum(dim=-1, keepdim=True).clamp(min=1)
    tau = excess.gather(-1, rho - 1) / rho.to(torch.float64)
    return torch.clamp(wide - tau, min=0.0).to(v.dtype)


def estimate_step_size(op: GradientOperator, iterations: int = POWER_ITERATIONS) -> float:
    """A PGD step ``η`` for §3.2's update ``α ← Proj_Δ(α − 2η Gᵀ(Gα − g̃))``.

    ``η = 1/(2λ̂)`` with ``λ̂`` a power-iteration estimate of ``λ_max(GᵀG)``: the
    objective's gradient is ``2λ_max``-Lipschitz and PGD converges for any step
    below ``1/λ_max``, which a power estimate (from below, but within 2×) keeps.
    """
    x = torch.full((op.num_columns,), op.num_columns**-0.5, device=op.inputs.device)
    lam = torch.zeros((), device=x.device)
    for _ in range(iterations):
        y = op.rmatvec(op.matvec(x))
        lam = torch.linalg.vector_norm(y)
        x = y / torch.clamp(lam, min=torch.finfo(y.dtype).tiny)
    lam_value = float(lam)
    return 0.5 / lam_value if lam_value > 0 else 1.0


def origin_weights(op: GradientOperator) -> Tensor:
    """``α₀ ∈ Δ`` with ``Gα₀ = 0``: each example's classes weighted by the model's
    own probabilities, ``α₀[i, κ] ∝ p_i(κ)/s_{iκ}`` (``s`` the column scales, 1 when
    unclipped), each example's weights summing to ``1/n``.

    For cross-entropy ``Σ_κ p(κ)∇ℓ(x, κ) = Jᵀ(p − Σ_κ p(κ)e_κ) = 0``, and a clipped
    column is ``s_{iκ}∇ℓ(x_i, κ)``, so PGD starts at the zero gradient, the hull
    point that carries no information, instead of the uniform weights, whose
    image (the mean per-class gradient) points away from the signal once the
    model is confident.
    """
    n = op.probabilities.shape[0]
    weights = op.probabilities
    if op.scales is not None:
        weights = weights / op.scales.reshape(n, -1)
    weights = weights / weights.sum(dim=1, keepdim=True) / n
    return weights.reshape(-1)


def project_convex_hull(
    op: GradientOperator,
    target: Tensor,
    *,
    steps: int = DEFAULT_PROJECTION_STEPS,
    step_size: float | None = None,
    method: ProjectionMethod = "pgd",
    poll: Poll = no_poll,
) -> Tensor:
    """Coefficients ``α ∈ Δ`` of the projection of ``target`` onto ``conv(G)`` (§3.2).

    Projected gradient descent on ``min_{α∈Δ} ‖Gα − g̃‖²``,
    ``α ← Proj_Δ(α − 2η Gᵀ(Gα − g̃))``: one VJP and one JVP a step, from
    :func:`origin_weights` (§3.2 leaves ``α₀ ∈ Δ`` open). ``step_size`` is ``η``;
    ``None`` picks it by :func:`estimate_step_size`.

    ``method="fista"`` adds Nesterov/FISTA momentum (Beck & Teboulle, 2009) to the
    same step at the same cost per step; it reaches in ~30 steps what plain PGD,
    the paper's method and the default, reaches in ~200.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if method not in PROJECTION_METHODS:
        raise ValueError(f"method must be one of {', '.join(PROJECTION_METHODS)}, got {method!r}")
    eta = estimate_step_size(op) if step_size is None else float(step_size)
    if eta <= 0:
        raise ValueError(f"step_size must be > 0, got {step_size}")
    alpha = origin_weights(op)
    point, t = alpha, 1.0
    for _ in range(steps):
        poll()
        residual = op.matvec(point) - target
        updated = project_simplex(point - 2.0 * eta * op.rmatvec(residual))
        if method == "fista":
            t_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
            point = updated + ((t - 1.0) / t_next) * (updated - alpha)
            t = t_next
        else:
            point = updated
        alpha = updated
    return alpha


def project_span(
    op: GradientOperator,
    target: Tensor,
    *,
    steps: int = DEFAULT_PROJECTION_STEPS,
    rtol: float = 1e-6,
    poll: Poll = no_poll,
) -> Tensor:
    """Coefficients ``α`` of the projection of ``target`` onto ``span(G)`` (SELFSPAN).

    Conjugate gradients on the normal equations ``GᵀGα = Gᵀg̃`` from ``α = 0``;
    the right-hand side lies in the range of ``GᵀG``, so CG converges to a
    least-squares solution even when ``G`` is rank deficient. At most ``steps``
    iterations; stops when the residual falls below ``rtol`` of the start.
    """
    rhs = op.rmatvec(target)
    alpha = torch.zeros_like(rhs)
    residual = rhs.clone()
    direction = residual.clone()
    rs = torch.dot(residual, residual)
    stop = float(rs) * rtol**2
    for _ in range(steps):
        poll()
        if float(rs) <= stop or float(rs) == 0.0:
            break
        a_dir = op.rmatvec(op.matvec(direction))
        curvature = torch.dot(direction, a_dir)
        if float(curvature) <= 0.0:
            break
        step = rs / curvature
        alpha = alpha + step * direction
        residual = residual - step * a_dir
        rs_next = torch.dot(residual, residual)
        direction = residual + (rs_next / rs) * direction
        rs = rs_next
    return alpha


def smooth(alpha: Tensor, smoothing: float) -> Tensor:
    """§3.3's smoothed coefficients ``α̃ = λα + (1 − λ)β``, ``β`` uniform ``1/(K·n₂)``.

    ``λ = 1`` is the plain projection; smaller ``λ`` pulls toward the mean of all
    per-class gradients, like label smoothing.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    return smoothing * alpha + (1.0 - smoothing) / alpha.numel()


@dataclass(frozen=True)
class Debias:
    """What :func:`projection_noise_bias` needs from the training: its draws, the
    noise's standard deviation on the mean gradient (``σC/B``) and the generator."""

    draws: int
    noise_std: float
    generator: torch.Generator


def projection_noise_bias(
    op: GradientOperator,
    noise_std: float,
    *,
    draws: int,
    generator: torch.Generator,
    steps: int = DEFAULT_PROJECTION_STEPS,
    step_size: float | None = None,
    method: ProjectionMethod = "pgd",
    poll: Poll = no_poll,
) -> Tensor:
    """An estimate of ``E[Proj(h + e)] − h``, the bias noise alone gives the
    projection, from public data only (beyond the paper; bench/README.md).

    Projecting onto a convex set is not linear, so the projection of a noisy
    gradient is not, on average, the projection of the gradient: the noise pushes
    it toward the hull's faces. Each draw takes a hull point ``h`` (every example
    of the projection set with a label drawn from the model's own probabilities,
    weight ``1/n``), adds fresh noise ``e ~ N(0, noise_std²I)`` — the noise
    Algorithm 1 adds, per coordinate of the mean gradient — projects, and
    measures the shift. It reads no label, so subtracting it is post-processing
    and costs no privacy; each draw costs one more projection.
    """
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    probabilities = op.probabilities
    n, k = probabilities.shape
    total: Tensor | None = None
    for _ in range(draws):
        labels = torch.multinomial(probabilities, 1, generator=generator).reshape(-1)
        weights = torch.zeros(n * k, device=probabilities.device, dtype=probabilities.dtype)
        weights[torch.arange(n, device=labels.device) * k + labels] = 1.0 / n
        point = op.matvec(weights)
        noise = torch.randn(point.shape, generator=generator, device=point.device,
                            dtype=point.dtype)  # fmt: skip
        alpha = project_convex_hull(op, point + noise_std * noise, steps=steps,
                                    step_size=step_size, method=method, poll=poll)  # fmt: skip
        shift = op.matvec(alpha) - point
        total = shift if total is None else total + shift
    assert total is not None
    return total / draws


def denoise(
    denoiser: DenoiserName,
    noisy_gradient: Tensor,
    model: nn.Module,
    inputs: Tensor | None,
    num_classes: int,
    *,
    steps: int = DEFAULT_PROJECTION_STEPS,
    step_size: float | None = None,
    smoothing: float = DEFAULT_SMOOTHING,
    method: ProjectionMethod = "pgd",
    vertex_clip_norm: float | None = None,
    backend: ProjectionBackend = "autodiff",
    debias: Debias | None = None,
    poll: Poll = no_poll,
) -> Tensor:
    """Table 1: the denoised gradient, a flat vector like ``noisy_gradient``.

    ``inputs`` are the features spanning the projection set: the batch ``I^G`` for
    SELFSPAN / SELFCONV, the independent batch ``I^P`` for ALTCONV, unused by NOOP.
    The convex-hull denoisers return ``G·α̃`` with §3.3's smoothed coefficients
    over the hull of per-class gradients clipped to ``vertex_clip_norm`` (the
    signal's ``C``; module docstring); SELFSPAN returns the plain orthogonal
    projection ``G·α`` (smoothing is defined for convex weights only; clipping
    columns does not change a span). With no examples to project on, the result
    is zero. ``backend`` picks how ``G`` is applied (module docstring).
    ``debias`` (convex hulls only) subtracts :func:`projection_noise_bias` from
    the projection, scaled by λ like the projection it corrects. ``poll`` is
    called between projection steps, and may raise to stop.
    """
    if denoiser == "noop":
        return noisy_gradient
    if denoiser not in DENOISERS:
        raise ValueError(f"unknown denoiser {denoiser!r}; expected one of {', '.join(DENOISERS)}")
    if inputs is None or inputs.shape[0] == 0:
        return torch.zeros_like(noisy_gradient)
    with eval_mode(model):
        if denoiser == "self-span":
            span = per_class_gradients(model, inputs, num_classes, backend=backend)
            return span.matvec(project_span(span, noisy_gradient, steps=steps, poll=poll))
        op = per_class_gradients(
            model, inputs, num_classes, clip_norm=vertex_clip_norm, backend=backend
        )
        alpha = project_convex_hull(
            op, noisy_gradient, steps=steps, step_size=step_size, method=method, poll=poll
        )
        denoised = op.matvec(smooth(alpha, smoothing))
        if debias is None or debias.draws == 0:
            return denoised
        bias = projection_noise_bias(op, debias.noise_std, draws=debias.draws,
                                     generator=debias.generator, steps=steps,
                                     step_size=step_size, method=method,
                                     poll=poll)  # fmt: skip
        return denoised - smoothing * bias
