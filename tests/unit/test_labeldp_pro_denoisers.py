"""Projection denoisers (``labeldp-pro.txt`` Table 1, §3.2, §3.3) against dense references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import nnls
from torch import Tensor, nn

from label_party.labeldp_pro.denoisers import (
    DensePerClassGradients,
    PerClassGradients,
    ProjectionMethod,
    denoise,
    eval_mode,
    origin_weights,
    per_class_gradients,
    project_convex_hull,
    project_simplex,
    project_span,
    projection_noise_bias,
    smooth,
)
from shared.torch_models import ImageCNN, ImageCNNConfig

K = 3


def _mlp(seed: int = 0, inputs: int = 4, hidden: int = 5, classes: int = K) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, classes))


def _reference_columns(model: nn.Module, x: Tensor, classes: int) -> Tensor:
    """G column by column with plain autograd: ∇θ −log softmax(f(x_i))_κ."""
    params = [p for p in model.parameters() if p.requires_grad]
    columns = []
    for i in range(x.shape[0]):
        for kappa in range(classes):
            loss = -torch.log_softmax(model(x[i : i + 1]), dim=-1)[0, kappa]
            grads = torch.autograd.grad(loss, params)
            columns.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(columns, dim=1)


def _hull_reference(g: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Projection onto conv(columns of g) by NNLS with a heavily weighted Σα = 1 row."""
    weight = 1e4
    a = np.vstack([g, weight * np.ones((1, g.shape[1]))])
    b = np.concatenate([target, [weight]])
    alpha, _ = nnls(a, b, maxiter=10_000)
    return g @ alpha


@pytest.mark.parametrize(
    ("model", "x", "classes"),
    [
        (_mlp(), torch.randn(4, 4, generator=torch.Generator().manual_seed(1)), K),
        (
            ImageCNN(ImageCNNConfig()),
            torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(2)),
            10,
        ),
    ],
    ids=["mlp", "table10a-cnn"],
)
def test_gu_and_gtv_match_dense_g(model: nn.Module, x: Tensor, classes: int) -> None:
    op = PerClassGradients(model, x, classes)
    reference = _reference_columns(model, x, classes)
    assert reference.shape == (op.dim, x.shape[0] * classes)
    torch.testing.assert_close(op.dense(), reference, rtol=1e-4, atol=1e-6)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):  # the recorded reverse pass replays correctly
        u = torch.randn(op.num_columns, generator=gen)
        torch.testing.assert_close(op.matvec(u), reference @ u, rtol=1e-4, atol=1e-5)
    v = torch.randn(op.dim, generator=gen)
    torch.testing.assert_close(op.rmatvec(v), reference.T @ v, rtol=1e-4, atol=1e-5)


def _bisection_simplex(v: np.ndarray) -> np.ndarray:
    """Independent reference: τ with Σ max(v − τ, 0) = 1, by bisection."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(200):
        tau = 0.5 * (lo + hi)
        if np.maximum(v - tau, 0).sum() > 1:
            lo = tau
        else:
            hi = tau
    return np.maximum(v - 0.5 * (lo + hi), 0)


def test_simplex_projection_matches_reference_batched() -> None:
    v = torch.randn(6, 9, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2
    out = project_simplex(v)
    assert torch.all(out >= 0)
    torch.testing.assert_close(out.sum(dim=-1), torch.ones(6, dtype=torch.float64))
    for row_in, row_out in zip(v.numpy(), out.numpy(), strict=True):
        np.testing.assert_allclose(row_out, _bisection_simplex(row_in), atol=1e-10)
    # Points of the simplex are fixed points.
    torch.testing.assert_close(project_simplex(out), out)


def test_simplex_projection_of_a_huge_float32_entry_is_its_vertex() -> None:
    """In float32 u₁ − (u₁ − 1) is 0 from 2²⁴ on: ρ was 0 and the gather raised (a
    large projection step, chosen by the client, failed a paid-for training)."""
    out = project_simplex(torch.tensor([[3e7, 1.0], [-1.0, 5e8]], dtype=torch.float32))
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


def test_point_inside_the_hull_projects_to_itself() -> None:
    model, x = (
        _mlp(seed=7, hidden=16),
        torch.randn(2, 4, generator=torch.Generator().manual_seed(7)),
    )
    op = PerClassGradients(model, x, K)
    weights = torch.randn(op.num_columns, generator=torch.Generator().manual_seed(6))
    inside = op.matvec(torch.softmax(weights, dim=0))
    alpha = project_convex_hull(op, inside, steps=150)
    assert torch.all(alpha >= 0)
    assert float(alpha.sum()) == pytest.approx(1.0, abs=1e-5)
    gap = torch.linalg.vector_norm(op.matvec(alpha) - inside) / torch.linalg.vector_norm(inside)
    assert float(gap) < 1e-3


@pytest.mark.parametrize(
    ("seed", "hidden", "examples", "method", "steps"),
    [(7, 6, 3, "pgd", 250), (5, 8, 2, "pgd", 250), (9, 6, 3, "fista", 150)],
)
def test_hull_projection_matches_qp_reference(
    seed: int, hidden: int, examples: int, method: ProjectionMethod, steps: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    model, x = _mlp(seed=seed, hidden=hidden), torch.randn(examples, 4, generator=gen)
    op = PerClassGradients(model, x, K)
    g = op.dense().double().numpy()
    noisy = op.matvec(torch.full((op.num_columns,), 1.0 / op.num_columns))
    noisy = noisy + 0.3 * torch.randn(op.dim, generator=gen)
    expected = _hull_reference(g, noisy.double().numpy())
    alpha = project_convex_hull(op, noisy, steps=steps, method=method)
    got = op.matvec(alpha).double().numpy()
    assert np.linalg.norm(got - expected) < 1e-3 * np.linalg.norm(expected)
    # KKT for min ‖Gα − g̃‖² on the simplex: the gradient Gᵀ(Gα − g̃) is smallest,
    # and the same, on the support of α.
    grad = g.T @ (g @ alpha.double().numpy() - noisy.double().numpy())
    support = alpha.numpy() > 1e-4
    scale = np.linalg.norm(g, axis=0).max() * np.linalg.norm(noisy.double().numpy())
    assert grad[support].max() - grad.min() < 1e-4 * scale
    # And it is no worse than the reference point.
    target = noisy.double().numpy()
    assert np.linalg.norm(got - target) <= np.linalg.norm(expected - target) * (1 + 1e-4)


def test_span_projection_matches_least_squares() -> None:
    gen = torch.Generator().manual_seed(10)
    model, x = _mlp(seed=10, hidden=6), torch.randn(2, 4, generator=gen)
    op = PerClassGradients(model, x, K)
    g = op.dense().double()
    noisy = torch.randn(op.dim, generator=gen)
    # Orthogonal projector from the SVD; singular values at float32 round-off
    # (each example's K columns are dependent: Σ_κ p_κ ∇ℓ(x, κ) = 0) are dropped.
    u, sv, _ = torch.linalg.svd(g, full_matrices=False)
    basis = u[:, sv > 1e-5 * sv.max()]
    expected = basis @ (basis.T @ noisy.double())
    got = op.matvec(project_span(op, noisy, steps=50)).double()
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
    # The residual is orthogonal to every column.
    assert float((g.T @ (noisy.double() - got)).abs().max()) < 1e-3


def test_smoothing_mixes_coefficients_with_uniform_weights() -> None:
    """§3.3: α̃ = λα + (1 − λ)/(K·n₂); λ = 0 returns the mean per-class gradient."""
    gen = torch.Generator().manual_seed(11)
    model, x = _mlp(seed=11), torch.randn(3, 4, generator=gen)
    op = PerClassGradients(model, x, K)
    noisy = torch.randn(op.dim, generator=gen)
    mean_column = op.dense().mean(dim=1)
    flat = denoise("alt-conv", noisy, model, x, K, steps=5, smoothing=0.0)
    torch.testing.assert_close(flat, mean_column, rtol=1e-4, atol=1e-6)
    alpha = project_convex_hull(op, noisy, steps=20)
    mixed = denoise("self-conv", noisy, model, x, K, steps=20, smoothing=0.75)
    torch.testing.assert_close(mixed, 0.75 * op.matvec(alpha) + 0.25 * mean_column)
    torch.testing.assert_close(smooth(alpha, 1.0), alpha)
    with pytest.raises(ValueError, match="smoothing"):
        smooth(alpha, 1.5)


def test_denoise_dispatch() -> None:
    gen = torch.Generator().manual_seed(12)
    model, x = _mlp(seed=12), torch.randn(2, 4, generator=gen)
    noisy = torch.randn(sum(p.numel() for p in model.parameters()), generator=gen)
    assert denoise("noop", noisy, model, None, K) is noisy
    assert torch.equal(denoise("alt-conv", noisy, model, x[:0], K), torch.zeros_like(noisy))
    span = denoise("self-span", noisy, model, x, K, steps=50)
    hull = denoise("self-conv", noisy, model, x, K, steps=100, smoothing=1.0)
    # The span contains the hull, so its projection is at least as close.
    assert torch.linalg.vector_norm(span - noisy) <= torch.linalg.vector_norm(hull - noisy) + 1e-5
    with pytest.raises(ValueError, match="unknown denoiser"):
        denoise("self-hull", noisy, model, x, K)  # type: ignore[arg-type]


def test_projection_runs_the_model_deterministically() -> None:
    """Dropout would make G·u and Gᵀ·v transposes of different matrices."""
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.Linear(6, K))
    model.train()
    with eval_mode(model):
        assert not model.training
    assert model.training
    x = torch.randn(2, 4)
    noisy = torch.randn(sum(p.numel() for p in model.parameters()))
    first = denoise("alt-conv", noisy, model, x, K, steps=20)
    second = denoise("alt-conv", noisy, model, x, K, steps=20)
    torch.testing.assert_close(first, second)
    assert model.training


def test_pgd_starts_at_the_zero_gradient() -> None:
    """α₀[i, κ] = p_i(κ)/n lies on the simplex and Gα₀ = 0 (Σ_κ p(κ)∇ℓ(x, κ) = 0)."""
    model, x = _mlp(seed=14), torch.randn(5, 4, generator=torch.Generator().manual_seed(14))
    op = PerClassGradients(model, x, K)
    alpha0 = origin_weights(op)
    assert torch.all(alpha0 >= 0)
    assert float(alpha0.sum()) == pytest.approx(1.0, abs=1e-6)
    column_scale = float(torch.linalg.vector_norm(op.dense(), dim=0).mean())
    assert float(torch.linalg.vector_norm(op.matvec(alpha0))) < 1e-5 * column_scale
    # Zero PGD steps return the start; the uniform weights would not be zero.
    assert torch.equal(project_convex_hull(op, torch.ones(op.dim), steps=0), alpha0)
    uniform = torch.full((op.num_columns,), 1.0 / op.num_columns)
    assert float(torch.linalg.vector_norm(op.matvec(uniform))) > 1e-3 * column_scale


def test_wrong_output_width_is_refused() -> None:
    with pytest.raises(ValueError, match="expected"):
        PerClassGradients(_mlp(classes=4), torch.randn(2, 4), K)


def test_clipped_columns_are_the_raw_columns_scaled_to_norm_at_most_c() -> None:
    model, x = (
        _mlp(seed=11, hidden=8),
        torch.randn(5, 4, generator=torch.Generator().manual_seed(11)),
    )
    raw = _reference_columns(model, x, K)
    norms = torch.linalg.vector_norm(raw, dim=0)
    clip = float(norms.median())  # some columns clipped, some not
    op = PerClassGradients(model, x, K, clip_norm=clip)
    expected = raw * torch.clamp(clip / norms, max=1.0)
    torch.testing.assert_close(op.dense(), expected, rtol=1e-4, atol=1e-6)
    assert float(torch.linalg.vector_norm(op.dense(), dim=0).max()) <= clip * (1 + 1e-5)
    gen = torch.Generator().manual_seed(12)
    u, v = torch.randn(op.num_columns, generator=gen), torch.randn(op.dim, generator=gen)
    torch.testing.assert_close(op.matvec(u), expected @ u, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(op.rmatvec(v), expected.T @ v, rtol=1e-4, atol=1e-5)
    # The column norms computed in chunks equal the dense ones.
    torch.testing.assert_close(op.column_norms(max_floats=1), norms, rtol=1e-4, atol=1e-6)
    # α₀ still maps to the zero gradient once the columns are rescaled.
    zero = op.matvec(origin_weights(op))
    assert float(torch.linalg.vector_norm(zero)) < 1e-5 * float(norms.max())


def test_the_mean_clipped_gradient_lies_in_the_hull_of_clipped_columns() -> None:
    """§3.1's premise, for Algorithm 1's signal: the batch's mean *clipped* true-label
    gradient is in conv(clipped per-class gradients), so SELFCONV keeps it intact."""
    gen = torch.Generator().manual_seed(13)
    model, x = _mlp(seed=13, hidden=16), torch.randn(4, 4, generator=gen)
    labels = torch.randint(0, K, (4,), generator=gen)
    raw = _reference_columns(model, x, K)
    clip = 0.5 * float(torch.linalg.vector_norm(raw, dim=0).min())  # every column clipped
    true_columns = raw[:, torch.arange(4) * K + labels]
    signal = (true_columns * torch.clamp(clip / true_columns.norm(dim=0), max=1.0)).mean(dim=1)
    clipped = PerClassGradients(model, x, K, clip_norm=clip)
    alpha = project_convex_hull(clipped, signal, steps=400, method="fista")
    gap = torch.linalg.vector_norm(clipped.matvec(alpha) - signal) / signal.norm()
    assert float(gap) < 1e-3


def test_denoise_clips_the_hull_but_not_the_span() -> None:
    gen = torch.Generator().manual_seed(14)
    model, x = _mlp(seed=14, hidden=8), torch.randn(3, 4, generator=gen)
    noisy = torch.randn(sum(p.numel() for p in model.parameters()), generator=gen)
    clip = 1e-3
    hull = denoise("alt-conv", noisy, model, x, K, steps=50, smoothing=1.0, vertex_clip_norm=clip)
    assert float(torch.linalg.vector_norm(hull)) <= clip * (1 + 1e-4)
    span = denoise("self-span", noisy, model, x, K, steps=50, vertex_clip_norm=clip)
    unclipped = denoise("self-span", noisy, model, x, K, steps=50)
    torch.testing.assert_close(span, unclipped)


_DENSE_CASES = [
    (_mlp(seed=17, hidden=8), torch.randn(5, 4, generator=torch.Generator().manual_seed(17)), K),
    (
        ImageCNN(ImageCNNConfig()),
        torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(18)),
        10,
    ),
]


@pytest.mark.parametrize(("model", "x", "classes"), _DENSE_CASES, ids=["mlp", "table10a-cnn"])
@pytest.mark.parametrize("clipped", [False, True], ids=["raw", "clipped"])
def test_the_dense_backend_holds_g_itself(
    model: nn.Module, x: Tensor, classes: int, clipped: bool
) -> None:
    raw = _reference_columns(model, x, classes)
    norms = torch.linalg.vector_norm(raw, dim=0)
    clip = float(norms.median()) if clipped else None
    expected = raw if clip is None else raw * torch.clamp(clip / norms, max=1.0)
    op = DensePerClassGradients(model, x, classes, clip_norm=clip)
    torch.testing.assert_close(op.dense(), expected, rtol=1e-4, atol=1e-6)
    gen = torch.Generator().manual_seed(19)
    u, v = torch.randn(op.num_columns, generator=gen), torch.randn(op.dim, generator=gen)
    torch.testing.assert_close(op.matvec(u), expected @ u, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(op.rmatvec(v), expected.T @ v, rtol=1e-4, atol=1e-5)
    autodiff = PerClassGradients(model, x, classes, clip_norm=clip)
    torch.testing.assert_close(op.probabilities, autodiff.probabilities, rtol=1e-5, atol=1e-7)
    assert (op.scales is None) == (autodiff.scales is None)
    if op.scales is not None and autodiff.scales is not None:
        torch.testing.assert_close(op.scales, autodiff.scales, rtol=1e-5, atol=1e-7)
    # α₀ maps to the zero gradient through this backend too.
    zero = op.matvec(origin_weights(op))
    assert float(torch.linalg.vector_norm(zero)) < 1e-5 * float(norms.max())


@pytest.mark.parametrize("denoiser", ["alt-conv", "self-conv", "self-span"])
def test_both_backends_denoise_alike(denoiser: str) -> None:
    gen = torch.Generator().manual_seed(20)
    model, x = _mlp(seed=20, hidden=8), torch.randn(4, 4, generator=gen)
    noisy = 0.2 * torch.randn(sum(p.numel() for p in model.parameters()), generator=gen)
    out = {
        backend: denoise(
            denoiser,  # type: ignore[arg-type]
            noisy,
            model,
            x,
            K,
            steps=60,
            method="fista",
            vertex_clip_norm=0.5,
            backend=backend,  # type: ignore[arg-type]
        )
        for backend in ("autodiff", "dense")
    }
    torch.testing.assert_close(out["dense"], out["autodiff"], rtol=1e-4, atol=1e-6)


def test_the_dense_backend_keeps_to_its_memory_limit() -> None:
    model, x = _mlp(hidden=8), torch.randn(5, 4)
    dim = sum(p.numel() for p in model.parameters())
    size = 5 * K * dim * 4
    DensePerClassGradients(model, x, K, max_bytes=size)  # exactly at the limit: fine
    with pytest.raises(ValueError, match="MiB limit; use the autodiff backend"):
        DensePerClassGradients(model, x, K, max_bytes=size - 1)
    assert isinstance(per_class_gradients(model, x, K, backend="dense"), DensePerClassGradients)
    assert isinstance(per_class_gradients(model, x, K), PerClassGradients)
    # Asked for dense past the limit, the factory applies G by autodiff instead.
    fallback = per_class_gradients(model, x, K, backend="dense", max_dense_bytes=size - 1)
    assert isinstance(fallback, PerClassGradients)
    with pytest.raises(ValueError, match="backend must be one of"):
        per_class_gradients(model, x, K, backend="sparse")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected"):
        DensePerClassGradients(_mlp(classes=4), x, K)


@pytest.mark.slow
def test_the_noise_bias_estimate_centres_the_projection() -> None:
    """Noise pushes a hull point's projection off it on average; subtracting
    :func:`projection_noise_bias` removes that shift when the point is drawn as the
    estimate draws its own (labels from the model's probabilities)."""
    n, std, draws = 32, 0.4, 300
    model = _mlp(seed=3, hidden=2)
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(3))
    op = DensePerClassGradients(model, x, K, clip_norm=1.0)
    gen = torch.Generator().manual_seed(0)
    plain, debiased = [], []
    for _ in range(draws):
        labels = torch.multinomial(op.probabilities, 1, generator=gen).reshape(-1)
        weights = torch.zeros(op.num_columns)
        weights[torch.arange(n) * K + labels] = 1.0 / n
        point = op.matvec(weights)
        noisy = point + std * torch.randn(point.shape, generator=gen)
        shift = op.matvec(project_convex_hull(op, noisy, steps=100, method="fista")) - point
        plain.append(shift)
        bias = projection_noise_bias(op, std, draws=1, generator=gen, steps=100, method="fista")
        debiased.append(shift - bias)

    def mean_and_error(shifts: list[Tensor]) -> tuple[float, float]:
        stacked = torch.stack(shifts)
        return float(stacked.mean(0).norm()), float(stacked.std(0).norm()) / draws**0.5

    (bias_plain, se_plain), (bias_debiased, se_debiased) = map(mean_and_error, (plain, debiased))
    assert bias_plain > 3 * se_plain  # the projection is biased under noise
    assert bias_debiased < 2 * se_debiased  # and the estimate takes it away
    assert bias_debiased < bias_plain / 2


def test_without_noise_the_bias_estimate_is_zero() -> None:
    model = _mlp(seed=3, hidden=4)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(4))
    op = DensePerClassGradients(model, x, K, clip_norm=1.0)
    gen = torch.Generator().manual_seed(1)
    bias = projection_noise_bias(op, 0.0, draws=3, generator=gen, steps=300, method="fista")
    assert float(bias.norm()) < 1e-3  # every column is clipped to norm 1
    with pytest.raises(ValueError, match="draws"):
        projection_noise_bias(op, 0.1, draws=0, generator=gen)
