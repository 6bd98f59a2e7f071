"""Real datasets that ship inside installed packages, for the demo, the experiments
and the end-to-end tests. Nothing is downloaded at run time.

Each dataset is split into what each party holds: the labels party gets
``(example_id, label)``; the features party gets ``example_id`` plus feature
columns. Preprocessing, clip values and the label domain are public
configuration fixed here, never computed from the labels inside the labels party.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv


class DatasetUnavailableError(RuntimeError):
    """The package that ships a dataset is not installed."""


@dataclass(frozen=True)
class Dataset:
    """One real dataset, split between the two parties."""

    name: str
    task: str
    description: str
    example_id: np.ndarray
    labels: np.ndarray
    features: pa.Table
    label_domain: dict[str, Any]
    numeric: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.size)

    def labels_table(self, rows: np.ndarray | None = None) -> pa.Table:
        """``example_id, label``: what the labels party uploads."""
        sel = slice(None) if rows is None else rows
        return pa.table({"example_id": self.example_id[sel], "label": self.labels[sel]})

    def features_table(self, rows: np.ndarray | None = None) -> pa.Table:
        """``example_id`` plus feature columns: what the features party uploads."""
        table = self.features if rows is None else self.features.take(pa.array(rows))
        ids = self.example_id if rows is None else self.example_id[rows]
        return table.add_column(0, "example_id", pa.array(ids))

    def split(self, *, seed: int, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
        """Row indices of a seeded train/test split (public configuration)."""
        order = np.random.default_rng(seed).permutation(len(self))
        cut = round(len(self) * (1 - test_fraction))
        return np.sort(order[:cut]), np.sort(order[cut:])


# RAND HIE ------------------------------------------------------------------------

#: 95th percentile of ``meddol`` over the whole public dataset, rounded up: the
#: public clip value (the papers clip Criteo's conversion values the same way).
RAND_HIE_CLIP = 752.0

#: Columns that give the answer away (other spend and visit counts of the same
#: year) or identify the person; dropped from the features.
_RAND_HIE_DROP = {
    "meddol", "lnmeddol", "binexp", "outpdol", "drugdol", "suppdol", "mentdol",
    "inpdol", "totadm", "inpmis", "mentvis", "mdvis", "notmdvis", "tookphys", "zper",
}  # fmt: skip
_RAND_HIE_CATEGORICAL = ["plan", "site", "year", "female", "child", "fchild", "idp",
                         "hlthg", "hlthf", "hlthp"]  # fmt: skip


def _statsmodels_file(relative: str) -> Path:
    try:
        import statsmodels  # optional dependency: imported on demand
    except ImportError as exc:
        raise DatasetUnavailableError(
            "this dataset ships with statsmodels: pip install 'labeldp[demo]'"
        ) from exc
    return Path(os.path.dirname(statsmodels.__file__)) / relative


def rand_hie_spend() -> Dataset:
    """RAND Health Insurance Experiment: annual medical spend per person-year.

    20,190 rows; 22% zeros, a heavy tail (max ≈ $39k), clipped at $752 (its 95th
    percentile). Label domain [0, 752] on a $4 grid (189 values).
    """
    raw = pacsv.read_csv(_statsmodels_file("datasets/randhie/src/randhie.csv"))
    labels = np.minimum(raw.column("meddol").to_numpy(zero_copy_only=False), RAND_HIE_CLIP)
    keep = [c for c in raw.column_names if c not in _RAND_HIE_DROP]
    features = raw.select(keep)
    categorical = [c for c in _RAND_HIE_CATEGORICAL if c in keep]
    numeric = [c for c in keep if c not in categorical]
    filled = [
        pc.fill_null(features.column(c), 0) if c in numeric else features.column(c) for c in keep
    ]
    features = pa.table(dict(zip(keep, filled, strict=True)))
    ids = np.array([f"hie-{i:05d}" for i in range(labels.size)])
    return Dataset(
        name="rand-hie-spend",
        task="regression",
        description="RAND HIE annual medical spend (meddol, USD), clipped at $752",
        example_id=ids,
        labels=labels.astype(np.float64),
        features=features,
        label_domain={"min": 0.0, "max": RAND_HIE_CLIP, "step": 4.0, "clip": True},
        numeric=numeric,
        categorical=categorical,
    )


LOADERS = {"rand-hie-spend": rand_hie_spend}


def load(name: str) -> Dataset:
    try:
        loader = LOADERS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(LOADERS))}") from None
    return loader()
