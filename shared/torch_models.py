"""The torch model zoo both parties can import (DESIGN.md §5).

Two architectures, one calling convention — ``forward(numeric, categorical,
mix=None)`` — so the training loop, the artifact and prediction do not care
which one they hold:

* :class:`TabularMLP` for tabular features (below);
* :class:`ImageCNN`, the small CNN of ``labeldp-pro.txt`` Table 10a for 28×28
  grey images (the LP-MST and LabelDP-Pro image experiments), reading its pixels
  from the numeric columns.

:class:`TabularMLP` is the model of the papers' appendices (Appendix E of
``rr-on-bins-regression.txt``): one embedding per categorical column (index 0 of
each column is its out-of-vocabulary bucket), standardized numeric columns
concatenated to the embeddings, then fully connected ReLU layers.

All categorical columns share one embedding table with per-column offsets, so the
forward pass is a single gather whatever the number of columns — no per-column
Python loop on the hot path. The table has exactly one row per vocabulary entry
of each column (plus its OOV row), so it is as small as per-column tables.

Two gradient layouts for the table: dense (the default; what DistributedDataParallel
all-reduces) or, with ``sparse_gradients = True``, a sparse COO gradient holding
only the looked-up rows — for an optimizer that updates just those rows
(``feature_party.training.optim.LazyRowOptimizer``). The forward pass is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = [
    "ImageCNN",
    "ImageCNNConfig",
    "TabularMLP",
    "TabularMLPConfig",
    "build_model",
    "model_config_from_dict",
]


@dataclass(frozen=True)
class TabularMLPConfig:
    """Shape of a :class:`TabularMLP`.

    ``vocab_sizes`` counts each categorical column's rows *including* its
    out-of-vocabulary bucket (index 0).
    """

    num_numeric: int
    vocab_sizes: tuple[int, ...] = ()
    embedding_dim: int = 8
    hidden: tuple[int, ...] = (128, 64)
    outputs: int = 1
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["vocab_sizes"] = list(self.vocab_sizes)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TabularMLPConfig:
        return cls(
            num_numeric=int(d["num_numeric"]),
            vocab_sizes=tuple(int(v) for v in d.get("vocab_sizes", ())),
            embedding_dim=int(d.get("embedding_dim", 8)),
            hidden=tuple(int(h) for h in d.get("hidden", (128, 64))),
            outputs=int(d.get("outputs", 1)),
            dropout=float(d.get("dropout", 0.0)),
        )


class TabularMLP(nn.Module):
    """Embeddings for categorical columns + standardized numerics → MLP.

    ``forward(numeric, categorical)`` takes ``numeric`` ``float32[B, num_numeric]``
    and ``categorical`` ``int64[B, num_categorical]`` (per-column indices, 0 = OOV)
    and returns ``float32[B, outputs]``.
    """

    offsets: torch.Tensor

    def __init__(self, config: TabularMLPConfig) -> None:
        super().__init__()
        self.config = config
        #: Sparse gradients for the embedding table (see the module docstring).
        self.sparse_gradients = False
        sizes: Sequence[int] = config.vocab_sizes
        if any(v < 1 for v in sizes):
            raise ValueError("every vocabulary needs at least its OOV bucket")
        offsets = torch.zeros(len(sizes), dtype=torch.int64)
        if sizes:
            offsets[1:] = torch.cumsum(torch.tensor(sizes[:-1], dtype=torch.int64), 0)
        self.register_buffer("offsets", offsets, persistent=False)
        self.embedding = nn.Embedding(int(sum(sizes)), config.embedding_dim) if sizes else None
        width = config.num_numeric + len(sizes) * config.embedding_dim
        if width == 0:
            raise ValueError("the model needs at least one input column")
        layers: list[nn.Module] = []
        for h in config.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if config.dropout > 0:
                layers.append(nn.Dropout(config.dropout))
            width = h
        self.body = nn.Sequential(*layers)
        self.out = nn.Linear(width, config.outputs)

    def encode(self, numeric: torch.Tensor, categorical: torch.Tensor | None) -> torch.Tensor:
        """The dense input row: numerics followed by the flattened embeddings."""
        if self.embedding is None:
            return numeric
        if categorical is None:
            raise ValueError("this model has categorical columns: pass their indices")
        flat = (categorical + self.offsets).flatten()
        if self.sparse_gradients:
            # Backward is just (indices, values): no table-sized scatter.
            emb = functional.embedding(flat, self.embedding.weight, sparse=True)
        else:
            # index_select's backward (index_add) is cheaper on CPU than embedding's.
            emb = self.embedding.weight.index_select(0, flat)
        emb = emb.view(categorical.shape[0], -1)
        if numeric.shape[1] == 0:
            return emb
        return torch.cat([numeric, emb], dim=1)

    def head(self, dense: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.body(dense))
        return out

    def forward(
        self,
        numeric: torch.Tensor,
        categorical: torch.Tensor | None = None,
        mix: tuple[torch.Tensor, float] | None = None,
    ) -> torch.Tensor:
        """Outputs. ``categorical`` may be left out when the model has no categorical
        columns (so ``model(x)`` works, as DP-SGD trainers call it). ``mix=(perm,
        lam)`` applies mixup to the dense representation, ``lam·h + (1 − lam)·h[perm]``
        (inside ``forward`` so DDP sees it)."""
        dense = self.encode(numeric, categorical)
        if mix is not None:
            perm, lam = mix
            dense = lam * dense + (1.0 - lam) * dense[perm]
        return self.head(dense)


@dataclass(frozen=True)
class ImageCNNConfig:
    """Shape of an :class:`ImageCNN`. The defaults are ``labeldp-pro.txt`` Table 10a
    (MNIST, Fashion-MNIST, KMNIST): two 3×3 convolutions with 16 channels, each
    followed by ReLU and 2×2 average pooling, then a 16-unit ReLU layer."""

    channels: int = 1
    height: int = 28
    width: int = 28
    conv: tuple[int, ...] = (16, 16)
    hidden: int = 16
    outputs: int = 10

    architecture = "cnn"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["conv"] = list(self.conv)
        d["architecture"] = self.architecture
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImageCNNConfig:
        return cls(
            channels=int(d["channels"]),
            height=int(d["height"]),
            width=int(d["width"]),
            conv=tuple(int(c) for c in d["conv"]),
            hidden=int(d["hidden"]),
            outputs=int(d["outputs"]),
        )


class ImageCNN(nn.Module):
    """Conv → ReLU → AvgPool blocks, then two fully connected layers.

    Takes the same ``(numeric, categorical, mix)`` arguments as :class:`TabularMLP`:
    ``numeric`` holds the ``channels·height·width`` pixels of each image row-major
    (``categorical``, if given, must have no columns, so ``model(pixels)`` works).
    Mixup, when asked, mixes the input images.
    """

    #: The training loop checks these two to choose embedding updates.
    embedding: None = None
    sparse_gradients = False

    def __init__(self, config: ImageCNNConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        channels, height, width = config.channels, config.height, config.width
        for out_channels in config.conv:
            layers += [nn.Conv2d(channels, out_channels, 3), nn.ReLU(), nn.AvgPool2d(2, 2)]
            channels, height, width = out_channels, (height - 2) // 2, (width - 2) // 2
            if height < 1 or width < 1:
                raise ValueError("the image is too small for that many convolutions")
        self.body = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(channels * height * width, config.hidden), nn.ReLU())
        self.out = nn.Linear(config.hidden, config.outputs)

    def forward(
        self,
        numeric: torch.Tensor,
        categorical: torch.Tensor | None = None,
        mix: tuple[torch.Tensor, float] | None = None,
    ) -> torch.Tensor:
        c = self.config
        images = numeric.view(-1, c.channels, c.height, c.width)
        if mix is not None:
            perm, lam = mix
            images = lam * images + (1.0 - lam) * images[perm]
        out: torch.Tensor = self.out(self.fc(self.body(images)))
        return out


ModelConfig = TabularMLPConfig | ImageCNNConfig


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """The config a ``to_dict`` wrote (no ``architecture`` key: a tabular MLP)."""
    if d.get("architecture") == "cnn":
        return ImageCNNConfig.from_dict(d)
    return TabularMLPConfig.from_dict(d)


def build_model(config: ModelConfig) -> TabularMLP | ImageCNN:
    """The untrained model of ``config``."""
    if isinstance(config, ImageCNNConfig):
        return ImageCNN(config)
    return TabularMLP(config)
