"""``labeldp mechanism preview`` as a user runs it: the real console entry point."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from label_party.mechanisms.registry import MECHANISMS
from labeldp.cli import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "randhie-meddol-prior.json"
KEYS = {"mechanism", "epsilon", "outputs", "matrix", "noisy_label_loss", "max_abs_bias", "seconds"}


def _write(tmp_path: Path, values: list[float], prior: list[float]) -> Path:
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"values": values, "prior": prior}))
    return path


@pytest.mark.parametrize("name", sorted(n for n, s in MECHANISMS.items() if s.task == "regression"))
def test_every_regression_mechanism_answers_on_a_real_prior(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    params = ["--param", "grid_size=11"] if name == "randomized-rounding" else []
    assert main(["mechanism", "preview", "--mechanism", name, "--epsilon", "1",
                 "--input", str(EXAMPLE), "--json", *params]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out.keys() >= KEYS
    assert out["mechanism"] == name
    if MECHANISMS[name].finite:
        assert len(out["matrix"]) == len(json.loads(EXAMPLE.read_text())["values"])
        assert len(out["matrix"][0]) == len(out["outputs"])
    else:
        assert out["outputs"] is None and out["matrix"] is None
    assert out["noisy_label_loss"] >= 0


@pytest.mark.parametrize("name", ["rr", "rr-with-prior"])
def test_classification_mechanisms_take_class_indices(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, [0, 1, 2, 3], [0.6, 0.3, 0.1, 0.0])
    assert main(["mechanism", "preview", "--mechanism", name, "--epsilon", "2",
                 "--input", str(path), "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"] == [0, 1, 2, 3]
    assert 0 <= out["noisy_label_loss"] <= 1


def test_auto_says_what_it_chose_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["mechanism", "preview", "--mechanism", "auto", "--loss", "absolute", "--epsilon", "1",
            "--input", str(EXAMPLE)]  # fmt: skip
    assert main(argv) == 0
    chosen = [line for line in capsys.readouterr().out.splitlines() if line.startswith("selected")]
    assert chosen and chosen[0].split()[1] == "rr-on-bins:" and "absolute loss" in chosen[0]


def test_the_poisson_loss_previews_counts_that_start_at_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A release accepts them (RAND HIE's spend starts at $0); the preview refused
    them, so the Poisson loss could not be looked at before spending."""
    assert main(["mechanism", "preview", "--mechanism", "rr-on-bins", "--epsilon", "1",
                 "--loss", "poisson", "--input", str(EXAMPLE), "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert json.loads(EXAMPLE.read_text())["values"][0] == 0
    assert min(out["outputs"]) > 0 and math.isfinite(out["noisy_label_loss"])


def test_the_poisson_loss_of_an_output_below_zero_is_undefined_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``auto`` picks ``unbiased`` for the Poisson loss, whose outputs reach below
    zero: its preview failed with "not finite", so auto's choice could not be seen."""
    argv = ["mechanism", "preview", "--mechanism", "auto", "--epsilon", "1", "--loss", "poisson",
            "--input", str(EXAMPLE)]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["selected"] == "unbiased" and min(out["outputs"]) < 0
    assert out["noisy_label_loss"] is None and out["max_abs_bias"] <= 1e-7 * 752
    assert main(argv) == 0
    assert "noisy-label loss  undefined: an output ≤ 0" in capsys.readouterr().out


def test_unbiased_is_unbiased_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mechanism", "preview", "--mechanism", "unbiased", "--epsilon", "1",
                 "--mesh", "64", "--input", str(EXAMPLE), "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["max_abs_bias"] <= 1e-7 * 752


@pytest.mark.parametrize(
    ("values", "prior", "extra", "message"),
    [
        ([0, 1], [-0.5, 1.5], [], "non-negative"),
        ([0, 1], [0.5, 0.6], [], "sum to one"),
        ([1, 0], [0.5, 0.5], [], "sorted"),
        ([0, 0], [0.5, 0.5], [], "duplicates"),
        ([-1, 1], [0.5, 0.5], ["--loss", "poisson"], "Poisson loss needs non-negative"),
        ([0, 1], [0.5, 0.5], ["--epsilon", "0"], "epsilon"),
        ([0, 1], [0.5, 0.5], ["--epsilon", "-1"], "epsilon"),
        ([0, 1], [0.5, 0.5], ["--mechanism", "unbiased", "--mesh", "1"], "mesh"),
        ([0, 1], [0.5, 0.5], ["--time-limit", "0"], "--time-limit must be a positive"),
        (
            list(range(1000)),
            [1e-3] * 1000,
            ["--mechanism", "unbiased", "--time-limit", "0.2"],
            "not solved in the time allowed",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    values: list[float], prior: list[float], extra: list[str], message: str, tmp_path: Path
) -> None:
    path = _write(tmp_path, values, prior)
    args = ["--mechanism", "rr-on-bins", "--epsilon", "1", "--input", str(path), *extra]
    proc = subprocess.run(
        [sys.executable, "-m", "labeldp", "mechanism", "preview", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]


def test_unreadable_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "prior.parquet"
    binary.write_bytes(b"PAR1\xff\xfe\x00")
    assert main(["mechanism", "preview", "--mechanism", "rr", "--epsilon", "1",
                 "--input", str(binary)]) == 2  # fmt: skip
    assert f"{binary} is not UTF-8 text" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["mechanism", "preview", "--mechanism", "rr", "--epsilon", "1",
                 "--input", str(bad)]) == 2  # fmt: skip
    assert "not JSON" in capsys.readouterr().err
    assert main(["mechanism", "preview", "--mechanism", "rr", "--epsilon", "1",
                 "--input", str(tmp_path / "missing.json")]) == 2  # fmt: skip


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``labeldp … | head`` closed the pipe under a print: a BrokenPipeError traceback."""
    with subprocess.Popen(
        [sys.executable, "-m", "labeldp", "mechanism", "preview", "--mechanism", "rr-on-bins",
         "--epsilon", "1", "--input", str(EXAMPLE)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # long before the command, still importing, prints
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_url_that_is_not_one_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "labeldp", "label-party", "budget", "x", "--url", "http://[::1",
         "--token", "t" * 24],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("labeldp: error: not a URL")
