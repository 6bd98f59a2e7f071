"""LabelDP-Pro on a CUDA device (``LabelDPProConfig.device = "cuda"``): the same
clipping, projection and accounting as on the CPU. Skipped where torch sees no
GPU (tests/cuda.py); the device machine runs them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

from label_party.labeldp_pro.denoisers import denoise, trainable_parameters
from label_party.labeldp_pro.dpsgd import (
    LabelDPProConfig,
    clipped_gradient_sum,
    secure_torch_generator,
    train_labeldp_pro,
)
from shared.torch_models import ImageCNN, ImageCNNConfig
from tests.cuda import needs_cuda

CLASSES = 10


@pytest.fixture
def exact_cuda() -> Iterator[None]:
    """Full float32 on the GPU: cuDNN's TF32 convolutions (on by default) round
    to 10 mantissa bits, which would hide a real difference from the CPU."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ImageCNN(ImageCNNConfig())


def _images(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Images whose mean brightness carries the class: a CNN learns them fast."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    pixels = torch.randn(n, 1, 28, 28, generator=gen) * 0.5
    return pixels + (labels.float() / CLASSES - 0.5).view(-1, 1, 1, 1) * 4, labels


@needs_cuda
@pytest.mark.parametrize("backend", ["autodiff", "dense"])
def test_the_projection_on_the_gpu_is_the_cpu_projection(exact_cuda: None, backend: str) -> None:
    model, (x, _y) = _cnn(0), _images(16, seed=1)
    dim = sum(p.numel() for p in model.parameters())
    noisy = 0.05 * torch.randn(dim, generator=torch.Generator().manual_seed(2))
    kwargs = {"steps": 50, "method": "fista", "vertex_clip_norm": 1.0, "backend": backend}
    on_cpu = denoise("alt-conv", noisy, model, x, CLASSES, **kwargs)  # type: ignore[arg-type]
    gpu = _cnn(0).cuda()
    on_gpu = denoise("alt-conv", noisy.cuda(), gpu, x.cuda(), CLASSES, **kwargs)  # type: ignore[arg-type]
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-6)


@needs_cuda
def test_the_clipped_sum_on_the_gpu_is_bounded_and_is_the_cpu_sum(exact_cuda: None) -> None:
    model, (x, y) = _cnn(3).cuda(), _images(40, seed=4)
    params = trainable_parameters(model)
    total, _loss = clipped_gradient_sum(
        model, params, x.cuda(), y.cuda(), clip_norm=0.1, physical_batch_size=16
    )
    cpu_model = _cnn(3)
    cpu_total, _ = clipped_gradient_sum(
        cpu_model, trainable_parameters(cpu_model), x, y, clip_norm=0.1, physical_batch_size=16
    )
    assert total.device.type == "cuda"
    assert float(torch.linalg.vector_norm(total)) <= 40 * 0.1 * (1 + 1e-5)
    torch.testing.assert_close(total.cpu(), cpu_total, rtol=1e-4, atol=1e-6)


def _config(**overrides: object) -> LabelDPProConfig:
    base: dict[str, object] = {
        "epsilon": 8.0,
        "delta": 1e-3,
        "num_classes": CLASSES,
        "epochs": 3,
        "expected_batch_size": 64,
        "learning_rate": 0.3,
        "optimizer": "momentum",
        "alt_batch_size": 32,
        "projection_steps": 30,
        "projection_method": "fista",
        "device": "cuda",
    }
    return LabelDPProConfig(**(base | overrides))  # type: ignore[arg-type]


@needs_cuda
def test_a_training_on_the_gpu_learns_and_is_accounted_as_on_the_cpu() -> None:
    """OS-seeded generator on the GPU (the service's path): the model stays on the
    GPU, learns, and its (ε, δ) record is the one the CPU computes for the plan."""
    x, y = _images(640, seed=5)
    result = train_labeldp_pro(_cnn(6), x, y, config=_config())
    assert all(p.device.type == "cuda" for p in result.model.parameters())
    with torch.no_grad():
        accuracy = float((result.model(x.cuda()).argmax(1).cpu() == y).float().mean())
    assert accuracy > 0.3, accuracy  # chance is 0.1; the CPU run reaches 0.55
    on_cpu = train_labeldp_pro(_cnn(6), x, y, config=_config(device="cpu", projection_steps=1))
    assert result.accounting.to_dict() == on_cpu.accounting.to_dict()
    assert result.accounting.epsilon <= 8.0 and result.accounting.delta == 1e-3


@needs_cuda
def test_both_backends_train_the_same_model_on_the_gpu(exact_cuda: None) -> None:
    x, y = _images(256, seed=7)

    def run(backend: str) -> nn.Module:
        gen = secure_torch_generator("cuda").manual_seed(8)
        config = _config(epochs=1, projection_backend=backend)
        return train_labeldp_pro(_cnn(9), x, y, config=config, generator=gen).model

    autodiff, dense = run("autodiff"), run("dense")
    for a, b in zip(autodiff.parameters(), dense.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
