"""Real storage refusals. ``RLIMIT_FSIZE`` (``ulimit -f``) makes a child process's
every write past ``limit`` bytes of a file fail with EFBIG, as a full disk fails
with ENOSPC: it works as root (where a read-only directory does not) and needs no
mount; SIGXFSZ is ignored so the write fails instead of killing. Where a disk
must really be full (a write that grows no file), :func:`full_disk` mounts a
small tmpfs."""

from __future__ import annotations

import errno
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest


def run_under_limit(command: list[str], env: Mapping[str, str], limit: int,
                    cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python -m …`` ``command`` to its end, its files stopping at ``limit`` bytes."""
    return subprocess.run(
        [sys.executable, "-m", *command],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=file_size_limit(limit),
    )


def file_size_limit(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child's files stop at ``limit``
    bytes (an ignored signal stays ignored across exec)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@contextmanager
def full_disk(directory: Path, size: int = 256 << 10) -> Iterator[Path]:
    """A real full filesystem: a ``size``-byte tmpfs mounted on ``directory``, the
    caller's to fill. Skips where mounting is not permitted (not root, a container
    without the capability)."""
    directory.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path) -> None:
    """Write to ``directory`` until its filesystem has no block left."""
    with (directory / "filler").open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
