"""DP-SGD with denoisers: Algorithm 1 of ``labeldp-pro.txt``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from label_party.labeldp_pro.accounting import calibrate_noise, epsilon_for
from label_party.labeldp_pro.denoisers import trainable_parameters
from label_party.labeldp_pro.dpsgd import (
    Checkpoint,
    Checkpointing,
    DivergedError,
    EpochSummary,
    LabelDPProConfig,
    ProgressEvent,
    SecretDraws,
    clip_per_example,
    clipped_gradient_sum,
    per_example_gradients,
    poisson_sample,
    privatize,
    secure_torch_generator,
    train_labeldp_pro,
)

CLASSES = 4


def _blobs(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Four well-separated Gaussian blobs in 2-D: a problem any learner solves."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    angles = labels.double() * (2 * math.pi / CLASSES)
    centers = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * 3
    return (centers + 0.5 * torch.randn(n, 2, generator=gen, dtype=torch.float64)).float(), labels


def _linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(2, CLASSES)


def _config(**overrides: object) -> LabelDPProConfig:
    base: dict[str, object] = {
        "epsilon": 4.0,
        "delta": 1e-3,
        "num_classes": CLASSES,
        "epochs": 4,
        "expected_batch_size": 40,
        "clip_norm": 1.0,
        "learning_rate": 0.5,
        "alt_batch_size": 4,
        "projection_steps": 10,
    }
    return LabelDPProConfig(**(base | overrides))  # type: ignore[arg-type]


def test_clipping_bounds_norms_and_keeps_small_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(50, 30, generator=gen) * torch.logspace(-2, 1, 50).unsqueeze(1)
    clipped = clip_per_example(rows, 1.5)
    norms = torch.linalg.vector_norm(clipped, dim=1)
    assert float(norms.max()) <= 1.5 + 1e-6
    small = torch.linalg.vector_norm(rows, dim=1) <= 1.5
    assert small.any() and (~small).any()
    assert torch.equal(clipped[small], rows[small])
    # Large rows keep their direction and land on the sphere of radius C.
    torch.testing.assert_close(norms[~small], torch.full_like(norms[~small], 1.5))
    cosine = torch.nn.functional.cosine_similarity(clipped[~small], rows[~small], dim=1)
    torch.testing.assert_close(cosine, torch.ones_like(cosine))


def test_per_example_gradients_match_autograd_and_sum_is_clipped() -> None:
    model = _linear()
    x, y = _blobs(6, seed=1)
    params = trainable_parameters(model)
    flat, losses = per_example_gradients(model, params, x, y)
    for i in range(6):
        loss = nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        torch.testing.assert_close(flat[i], torch.cat([g.reshape(-1) for g in grads]))
        torch.testing.assert_close(losses[i], loss.detach())
    # Some rows clipped and some kept: the sum, taken a block of parameters at a
    # time, is that of the flat rows clipped.
    median = float(torch.linalg.vector_norm(flat, dim=1).median())
    for clip in (0.1, median):
        total, _ = clipped_gradient_sum(model, params, x, y, clip_norm=clip, physical_batch_size=4)
        torch.testing.assert_close(total, clip_per_example(flat, clip).sum(dim=0))


def test_noise_std_is_sigma_c_over_expected_batch() -> None:
    """Zero gradients: ĝ is pure noise with per-coordinate std σC/B (Algorithm 1 line 5)."""
    sigma, clip, batch = 2.5, 1.5, 50
    out = privatize(
        torch.zeros(200_000),
        noise_multiplier=sigma,
        clip_norm=clip,
        expected_batch_size=batch,
        draws=SecretDraws(),  # the service's own: 128 OS bits
    )
    expected = sigma * clip / batch
    assert float(out.std()) == pytest.approx(expected, rel=0.01)
    assert abs(float(out.mean())) < 4 * expected / math.sqrt(out.numel())


def test_secure_generators_differ() -> None:
    a = torch.rand(4, generator=secure_torch_generator())
    b = torch.rand(4, generator=secure_torch_generator())
    assert not torch.equal(a, b)


def test_the_secret_draws_have_more_than_32_bits_of_seed() -> None:
    """torch's CPU generator keeps the low 32 bits of its seed: 2³² noise streams,
    which a search of the released weights told apart, recovering a training's
    noise and a label (helper-76). The noise and the coins come from a 128-bit
    stream; seeds that differ only above bit 32 give other draws there."""
    low, high = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5 + (1 << 40))
    assert torch.equal(torch.randn(3, generator=low), torch.randn(3, generator=high))
    like = torch.zeros(8)
    assert not torch.equal(SecretDraws().noise_like(like), SecretDraws().noise_like(like))
    draws = SecretDraws()
    assert draws._numpy is not None
    assert draws._numpy.bit_generator.state["bit_generator"] == "PCG64DXSM"


def test_a_poisson_coin_never_comes_up_more_often_than_q() -> None:
    """Float32 uniforms are multiples of 2⁻²⁴: ``rand < q`` came up ⌈q·2²⁴⌉/2²⁴ of
    the time, 1.3 % above q = 10⁻⁶ (helper-76). The coins compare 53-bit integers
    with ⌊q·2⁵³⌋."""
    q = 1e-6
    assert torch.rand(1, generator=torch.Generator().manual_seed(0)).dtype == torch.float32
    assert math.ceil(q * 2**24) / 2**24 > q * 1.013
    assert math.floor(math.ldexp(q, 53)) / 2**53 <= q
    hits = sum(int(SecretDraws().coins(10**6, 0.25, torch.device("cpu")).sum()) for _ in range(4))
    assert abs(hits / 4e6 - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 4e6)


@pytest.mark.parametrize(
    ("denoiser", "debias_draws"), [("noop", 0), ("alt-conv", 0), ("alt-conv", 1)]
)
def test_training_learns_a_separable_problem(denoiser: str, debias_draws: int) -> None:
    x, y = _blobs(400, seed=4)
    events: list[ProgressEvent] = []
    result = train_labeldp_pro(
        _linear(),
        x,
        y,
        config=_config(denoiser=denoiser, smoothing=1.0, epochs=2, debias_draws=debias_draws),
        report=events.append,
        generator=torch.Generator().manual_seed(5),
    )
    x_test, y_test = _blobs(400, seed=6)
    with torch.no_grad():
        accuracy = float((result.model(x_test).argmax(dim=1) == y_test).float().mean())
    assert accuracy > 0.8  # chance is 0.25
    record = result.accounting
    assert record.epsilon <= 4.0
    assert record.amplification
    assert record.sampling_rate == pytest.approx(0.1)
    assert record.steps == 2 * 10
    assert [e.step for e in events] == list(range(1, 21))
    assert events[-1].eta_seconds == 0.0
    assert all(e.loss is None for e in events)  # the private loss is not reported
    assert len(result.history) == 2
    assert all(h.loss is None for h in result.history)
    # The sampled batches' sizes are the subsampling's secret: nothing reports them.
    assert not any("batch" in name for name in asdict(result.history[0]))


def test_poisson_sampling_draws_each_example_independently() -> None:
    """Batch sizes are Binomial(n, q): mean nq and variance nq(1−q), not fixed."""
    draws = SecretDraws()  # the service's own: 128 OS bits
    batches = [poisson_sample(1000, 0.04, draws, torch.device("cpu")) for _ in range(400)]
    sizes = np.array([b.numel() for b in batches], dtype=np.float64)
    assert abs(sizes.mean() - 40) < 4 * math.sqrt(38.4 / 400)
    assert 38.4 * 0.75 < sizes.var(ddof=1) < 38.4 * 1.3
    hits = np.bincount(torch.cat(batches).numpy(), minlength=1000)
    assert hits.min() > 0 and abs(hits.mean() - 16) < 0.5  # every example, at rate q
    assert all(bool((b[1:] > b[:-1]).all()) for b in batches)  # indices, each once


def test_self_denoisers_are_accounted_without_amplification() -> None:
    x, y = _blobs(200, seed=7)
    config = _config(denoiser="self-conv", epochs=1, projection_steps=3)
    result = train_labeldp_pro(
        _linear(), x, y, config=config, generator=torch.Generator().manual_seed(8)
    )
    record = result.accounting
    assert not record.amplification
    steps, q = 5, 40 / 200
    assert record.steps == steps
    assert record.noise_multiplier == pytest.approx(
        calibrate_noise(4.0, 1e-3, q, steps, amplification=False)
    )
    assert record.noise_multiplier > calibrate_noise(4.0, 1e-3, q, steps, amplification=True)
    assert record.epsilon == pytest.approx(
        epsilon_for(record.noise_multiplier, q, steps, 1e-3, amplification=False)
    )


def test_seeded_runs_repeat_and_loss_is_opt_in() -> None:
    x, y = _blobs(120, seed=9)
    config = _config(denoiser="noop", epochs=1, report_training_loss=True)

    def run() -> tuple[nn.Module, list[ProgressEvent]]:
        events: list[ProgressEvent] = []
        result = train_labeldp_pro(
            _linear(), x, y, config=config, report=events.append,
            generator=torch.Generator().manual_seed(10),
        )  # fmt: skip
        return result.model, events

    first, events = run()
    second, _ = run()
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(e.loss is not None and e.loss > 0 for e in events)


def test_the_dense_backend_trains_the_same_model() -> None:
    """The backend changes how G is applied, not the projection: a seeded run ends
    at the same weights (to float rounding) either way."""
    x, y = _blobs(120, seed=15)

    def run(backend: str) -> nn.Module:
        config = _config(epochs=2, projection_method="fista", projection_backend=backend)
        gen = torch.Generator().manual_seed(16)
        return train_labeldp_pro(_linear(), x, y, config=config, generator=gen).model

    autodiff, dense = run("autodiff"), run("dense")
    for a, b in zip(autodiff.parameters(), dense.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"num_classes": 1}, "num_classes"),
        ({"denoiser": "self-hull"}, "denoiser"),
        ({"optimizer": "lbfgs"}, "optimizer"),
        ({"smoothing": 1.5}, "smoothing"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"projection_step_size": 0.0}, "projection_step_size"),
        ({"projection_method": "newton"}, "projection_method"),
        ({"projection_backend": "gpu"}, "projection_backend"),
        ({"debias_draws": -1}, "debias_draws"),
        ({"denoiser": "noop", "debias_draws": 1}, "debias_draws applies to"),
        ({"denoiser": "self-span", "debias_draws": 1}, "debias_draws applies to"),
    ],
)
def test_bad_config_is_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**overrides)


def test_bad_data_is_refused_without_echoing_labels() -> None:
    x, y = _blobs(100, seed=11)
    bad = y.clone()
    bad[7] = 17  # a private value that must not appear in the message
    with pytest.raises(ValueError, match=r"class indices in \[0, num_classes\)") as info:
        train_labeldp_pro(_linear(), x, bad, config=_config())
    assert "17" not in str(info.value)
    with pytest.raises(ValueError, match="one entry per feature row"):
        train_labeldp_pro(_linear(), x, y[:50], config=_config())
    with pytest.raises(ValueError, match="expected_batch_size"):
        train_labeldp_pro(_linear(), x, y, config=_config(expected_batch_size=500))
    with pytest.raises(ValueError, match="batch normalization"):
        model = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Linear(8, CLASSES))
        train_labeldp_pro(model, x, y, config=_config())


def test_a_planned_noise_multiplier_is_used_only_within_the_budget() -> None:
    """The labels party plans σ at acceptance; the trainer re-accounts it: a larger σ
    trains (smaller ε), a σ below the calibrated one is refused before any step."""
    x, y = _blobs(200, seed=21)
    config = _config(epochs=1)
    q, steps = 40 / 200, 1 * 5
    calibrated = calibrate_noise(config.epsilon, config.delta, q, steps)
    noisier = train_labeldp_pro(
        _linear(), x, y, config=config, generator=torch.Generator().manual_seed(1),
        noise_multiplier=2 * calibrated,
    )  # fmt: skip
    assert noisier.accounting.noise_multiplier == 2 * calibrated
    assert noisier.accounting.steps == steps
    assert noisier.accounting.epsilon < config.epsilon
    model = _linear()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="above the configured"):
        train_labeldp_pro(model, x, y, config=config, noise_multiplier=calibrated / 2)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class _StopError(Exception):
    pass


@pytest.mark.parametrize("denoiser", ["noop", "alt-conv"])
def test_a_run_resumed_from_a_checkpoint_ends_where_the_uninterrupted_run_does(
    denoiser: str,
) -> None:
    """Stopped right after the step-6 checkpoint of 10 steps and resumed from it (with
    the generator where it stood), the run ends with the uninterrupted run's weights:
    model, optimizer (momentum buffers) and epoch history all carry over."""
    x, y = _blobs(200, seed=22)
    config = _config(epochs=2, optimizer="momentum", denoiser=denoiser)
    straight = train_labeldp_pro(
        _linear(), x, y, config=config, generator=torch.Generator().manual_seed(3)
    )
    saved: list[Checkpoint] = []

    def save_then_stop_at_six(checkpoint: Checkpoint) -> None:
        saved.append(checkpoint)
        if checkpoint.step == 6:
            raise _StopError

    gen = torch.Generator().manual_seed(3)
    with pytest.raises(_StopError):
        train_labeldp_pro(
            _linear(), x, y, config=config, generator=gen,
            checkpointing=Checkpointing(every_steps=3, save=save_then_stop_at_six),
        )  # fmt: skip
    assert [c.step for c in saved] == [3, 6]
    assert [h.epoch for h in saved[1].history] == [0]  # epoch 0 is steps 1-5
    fresh = _linear(seed=9)  # other initial weights: the checkpoint must replace them
    resumed = train_labeldp_pro(
        fresh, x, y, config=config, generator=gen,
        checkpointing=Checkpointing(every_steps=3, save=saved.append, resume=saved[1]),
    )  # fmt: skip
    assert [c.step for c in saved] == [3, 6, 9]  # and never after the last step
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert resumed.accounting == straight.accounting
    assert [h.epoch for h in resumed.history] == [0, 1]
    # Epoch 1 was resumed after its first step: its summary covers all five (it
    # counted the four since the resume, and averaged over them alone).
    assert saved[1].partial is not None and saved[1].partial.steps == 1
    for whole, again in zip(straight.history, resumed.history, strict=True):
        assert whole.steps == again.steps == 5
        assert again.noisy_gradient_norm == pytest.approx(whole.noisy_gradient_norm, rel=1e-5)
        assert again.denoised_gradient_norm == pytest.approx(whole.denoised_gradient_norm, rel=1e-5)


def test_checkpoint_outside_the_run_is_refused() -> None:
    x, y = _blobs(200, seed=23)
    config = _config(epochs=1)
    model = _linear()
    bad = Checkpoint(step=5, model=model.state_dict(), optimizer={}, history=[])
    with pytest.raises(ValueError, match="outside this run"):
        train_labeldp_pro(
            model, x, y, config=config,
            checkpointing=Checkpointing(every_steps=1, save=lambda c: None, resume=bad),
        )  # fmt: skip


@pytest.mark.parametrize("denoiser", ["noop", "alt-conv"])
def test_a_run_that_diverges_says_so(denoiser: str) -> None:
    """Noise σ·C beyond float32's range: the run stops with what to change, instead
    of an IndexError deep in the simplex projection of a non-finite gradient."""
    x, y = _blobs(120, seed=3)
    config = _config(denoiser=denoiser, clip_norm=1e38, epochs=1)
    with pytest.raises(DivergedError, match="smaller learning_rate or clip_norm"):
        train_labeldp_pro(_linear(), x, y, config=config,
                          generator=torch.Generator().manual_seed(1))  # fmt: skip


class _StopError(Exception):
    pass


@pytest.mark.parametrize(
    ("denoiser", "physical_batch_size"), [("alt-conv", 1024), ("self-span", 1024), ("noop", 1)]
)
def test_poll_stops_a_run_within_its_first_step(denoiser: str, physical_batch_size: int) -> None:
    """A cancelled training must not wait out a step: ``poll`` runs before each
    physical batch and each projection step, and what it raises ends the run there
    (with one physical batch, the 2nd to 5th polls are the projection's)."""
    x, y = _blobs(400, seed=2)
    calls: list[int] = []

    def poll() -> None:
        calls.append(1)
        if len(calls) == 5:
            raise _StopError

    reports: list[ProgressEvent] = []
    config = _config(denoiser=denoiser, expected_batch_size=200, projection_steps=50,
                     physical_batch_size=physical_batch_size, epochs=1)  # fmt: skip
    with pytest.raises(_StopError):
        train_labeldp_pro(_linear(), x, y, config=config, report=reports.append, poll=poll,
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert reports == [] and len(calls) == 5  # stopped inside step 1


def test_a_checkpoint_at_an_epoch_s_end_has_no_epoch_under_way() -> None:
    """Saved right after an epoch's summary, the epoch under way has no step yet:
    summarizing it divided by zero, and every training whose checkpoints fell on
    epoch ends (one step an epoch: every small dataset) failed after its charge."""
    x, y = _blobs(200, seed=22)
    saved: list[Checkpoint] = []
    result = train_labeldp_pro(
        _linear(), x, y, config=_config(epochs=3), generator=torch.Generator().manual_seed(3),
        checkpointing=Checkpointing(every_steps=5, save=saved.append),
    )  # fmt: skip
    assert [c.step for c in saved] == [5, 10] and all(c.partial is None for c in saved)
    assert [h.steps for h in result.history] == [5, 5, 5]


def test_a_checkpoint_file_keeps_the_epoch_under_way(tmp_path: Path) -> None:
    """The worker resumes from the file, not the object: the epoch under way must
    survive the round trip (a file from before it had none: that reads as None)."""
    from label_party.trainings.training import read_checkpoint, write_checkpoint

    so_far = EpochSummary(epoch=1, steps=2, seconds=0.5, noisy_gradient_norm=3.0,
                          denoised_gradient_norm=1.0, loss=None)  # fmt: skip
    state = Checkpoint(step=7, model={"w": torch.ones(2)}, optimizer={}, history=[],
                       partial=so_far)  # fmt: skip
    plan = {"steps": 10}
    write_checkpoint(tmp_path / "c.pt", state, plan)
    back = read_checkpoint(tmp_path / "c.pt", plan)
    assert back is not None and back.partial == so_far
    write_checkpoint(tmp_path / "c.pt", dataclasses.replace(state, partial=None), plan)
    back = read_checkpoint(tmp_path / "c.pt", plan)
    assert back is not None and back.partial is None


def test_an_example_whose_gradient_overflows_counts_nothing_and_breaks_no_step() -> None:
    """Its inf made the clipped sum NaN and the training failed as diverged; whether
    a gradient overflows can depend on the label (here label 1 overflows, label 0
    does not), so failure told one label apart with certainty (helper-76)."""
    model = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 2, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(1e-20)
        model[1].weight.copy_(torch.tensor([[1e20], [-1e20]]))
    params = trainable_parameters(model)
    x = torch.full((2, 1), 1e20)
    for labels, finite in (([0, 0], True), ([0, 1], False)):
        per_example, _ = per_example_gradients(model, params, x, torch.tensor(labels))
        assert bool(torch.isfinite(per_example).all()) == finite
        total, _ = clipped_gradient_sum(model, params, x, torch.tensor(labels), clip_norm=1.0,
                                        physical_batch_size=2)  # fmt: skip
        assert bool(torch.isfinite(total).all()), labels
        assert float(total.abs().max()) <= 1.0  # one clipped example at most; the other 0
