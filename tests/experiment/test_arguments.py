"""``labeldp experiment``: bad input is one line on stderr and exit status 2,
before any service starts; the user's own files are read and joined."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from labeldp.datasets import Dataset
from labeldp.experiment import load_user_data, main, parse_domain, subsample

GOOD = ["--dataset", "rand-hie-spend", "--method", "laplace", "--epsilon", "1"]


def _with(flag: str, value: str) -> list[str]:
    args = list(GOOD)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    return args


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (_with("--dataset", "census-nope"), "unknown dataset"),
        (_with("--method", "gaussian"), "unknown method"),
        (_with("--epsilon", "0"), "--epsilon must be > 0"),
        (_with("--epsilon", "-1"), "--epsilon must be > 0"),
        (_with("--epsilon", "nan"), "--epsilon must be > 0"),
        (_with("--seeds", "0"), "--seeds must be at least 1"),
        (_with("--epochs", "0"), "--epochs must be at least 1"),
        (_with("--batch-size", "0"), "--batch-size must be at least 1"),
        (_with("--learning-rate", "0"), "--learning-rate must be > 0"),
        (_with("--max-examples", "3"), "--max-examples must be at least 10"),
        (["--dataset", "rand-hie-spend", "--method", "laplace"], "--epsilon is required"),
        (["--method", "laplace", "--epsilon", "1"], "give --dataset NAME"),
        (_with("--labels", "x.csv"), "not both"),
        (_with("--labels-party", "http://127.0.0.1:1"), "give both"),
        # The task is checked before the domain, whose form it decides.
        (
            [
                "--labels",
                "l.csv",
                "--features",
                "f.csv",
                "--task",
                "classification",
                "--domain",
                '{"num_classes": 3}',
                "--method",
                "rr",
                "--epsilon",
                "1",
            ],
            "must be regression",
        ),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("labeldp: error: ") and needle in lines[0]
    assert captured.out == ""
    assert code == 2


def _tiny(tmp_path: Path) -> tuple[Path, Path]:
    labels = pa.table({"example_id": ["a", "b", "c"], "label": [1.0, 2.5, 0.0]})
    features = pa.table({
        "example_id": ["c", "b", "a", "z"], "age": [30, None, 50, 1],
        "city": ["x", "y", "x", "w"], "plan": [1, 2, 1, 3],
    })  # fmt: skip
    pacsv.write_csv(labels, tmp_path / "labels.csv")
    pacsv.write_csv(features, tmp_path / "features.csv")
    return tmp_path / "labels.csv", tmp_path / "features.csv"


def test_user_data_is_joined_on_example_id(tmp_path: Path) -> None:
    labels, features = _tiny(tmp_path)
    data = load_user_data(labels, features, task="regression",
                          domain={"min": 0, "max": 3}, categorical=["plan"])  # fmt: skip
    assert list(data.example_id) == ["a", "b", "c"]
    assert list(data.labels) == [1.0, 2.5, 0.0]
    assert data.categorical == ["city", "plan"] and data.numeric == ["age"]
    assert data.features.column("age").to_pylist() == [50, 0, 30]
    assert data.features_table().column("example_id").to_pylist() == ["a", "b", "c"]


def test_user_data_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels, features = _tiny(tmp_path)
    with pytest.raises(ValueError, match="must be regression"):
        load_user_data(labels, features, task="classification", domain={"min": 0, "max": 1})
    with pytest.raises(ValueError, match="lacks column"):
        load_user_data(features, labels, task="regression", domain={"min": 0, "max": 1})
    stray = tmp_path / "stray.parquet"
    pq.write_table(pa.table({"example_id": ["a", "q"], "label": [1.0, 2.0]}), stray)
    with pytest.raises(ValueError, match="1 labelled example_id"):
        load_user_data(stray, features, task="regression", domain={"min": 0, "max": 1})
    # Arrow's messages quote the cell: a label never reaches the error.
    secret = tmp_path / "secret.csv"
    secret.write_text("example_id,label\na,1.0\nb,secret-abc\n")
    with pytest.raises(ValueError, match="every label must be a number") as e:
        load_user_data(secret, features, task="regression", domain={"min": 0, "max": 1})
    assert "secret-abc" not in str(e.value)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("example_id,label\na,1.0,secret-abc\n")
    with pytest.raises(ValueError, match="not a readable csv") as e:
        load_user_data(ragged, features, task="regression", domain={"min": 0, "max": 1})
    assert "secret-abc" not in str(e.value)
    with pytest.raises(ValueError, match=r"--labels .*nofile\.csv"):
        load_user_data(tmp_path / "nofile.csv", features, task="regression",
                       domain={"min": 0, "max": 1})  # fmt: skip
    with pytest.raises(ValueError, match="min must be < max"):
        parse_domain('{"min": 3, "max": 1}')
    assert parse_domain(json.dumps({"min": 0, "max": 3, "step": 1}))["step"] == 1
    argv = ["--method", "laplace", "--epsilon", "1", "--labels", str(labels),
            "--features", str(features), "--domain", "not json"]  # fmt: skip
    assert main(argv) == 2
    assert "--domain" in capsys.readouterr().err


def test_subsample_ignores_labels() -> None:
    n = 50
    data = Dataset(name="t", task="regression", description="t",
                   example_id=np.array([f"e{i}" for i in range(n)]),
                   labels=np.arange(n, dtype=float), features=pa.table({"x": list(range(n))}),
                   label_domain={"min": 0, "max": n})  # fmt: skip
    other = dataclasses.replace(data, labels=data.labels[::-1].copy())
    a, b = subsample(data, 20), subsample(other, 20)
    assert len(a) == 20 and list(a.example_id) == list(b.example_id)
    assert a.features.column("x").to_pylist() == [int(i[1:]) for i in a.example_id]
    assert subsample(data, 100) is data


def test_human_output_names_the_metric() -> None:
    from labeldp.experiment import human

    result = {"dataset": "fashion-mnist", "method": "rr", "epsilon": 1.0, "seeds": 2,
              "mechanism_metric": "accuracy", "mechanism_mse": 0.25,
              "test": {"accuracy": 0.8, "accuracy_std": 0.01}, "epsilon_spent": 2.0,
              "seconds": 3.0}  # fmt: skip
    lines = human(result).splitlines()
    assert lines[1].split() == ["mechanism", "accuracy", "0.25"]
    assert lines[2].split() == ["test", "accuracy", "0.8", "±", "0.01"]
    # ε is each seed's budget; what was spent adds over the seeds.
    assert "ε = 1 per seed" in lines[0] and lines[3].split() == ["ε", "spent,", "all", "seeds", "2"]
