"""``shared.torch_files.save_torch_file``: atomic, and a storage refusal is the
``OSError`` that stopped the write (torch's own writer says only RuntimeError),
which is how both workers tell a full disk (retry) from a bug (fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from shared.torch_files import save_torch_file
from tests.file_limits import file_size_limit

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import errno, sys, torch
from pathlib import Path
from shared.torch_files import save_torch_file
try:
    save_torch_file(Path(sys.argv[1]), {"w": torch.zeros(100_000)})
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def test_round_trip_leaves_only_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "model.pt"
    save_torch_file(path, {"w": torch.arange(4)}, fsync=True)
    save_torch_file(path, {"w": torch.arange(5)})
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(5))
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]


def test_a_refused_write_is_its_os_error_and_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_torch_file(path, {"w": torch.arange(3)})
    before = path.read_bytes()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=file_size_limit(64 << 10),
        check=True,
    )
    assert out.stdout.strip() == "EFBIG", out.stderr[-2000:]
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
