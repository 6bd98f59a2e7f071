"""Multi-process training with torch DistributedDataParallel.

The worker launches ``python -m torch.distributed.run --standalone
--nproc-per-node=N -m feature_party.training.distributed SPEC_DIR`` (torchrun);
each rank runs :func:`main`: it joins the process group (NCCL on GPUs, gloo on
CPU), wraps the model in DDP — gradients are averaged by DDP's bucketed
all-reduce, never by hand — and trains on its stride of every epoch's
permutation. Rank 0 writes checkpoints, the artifact, ``progress.json`` and
``result.json`` in ``SPEC_DIR``; every rank stops when ``SPEC_DIR/stop`` exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from feature_party.training.loop import Interrupted, Progress, resolve_device
from feature_party.training.runner import RunSpec, execute

SPEC = "spec.json"
PROGRESS = "progress.json"
RESULT = "result.json"
FAILURE = "failure.json"
STOP = "stop"
#: The failure report's size, allocated at launch: rank 0 writes it in place, so it
#: can say that the disk is full on a full disk.
FAILURE_BYTES = 2048


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def launch(run_dir: Path, spec: RunSpec, *, processes: int) -> subprocess.Popen[bytes]:
    """Start a torchrun launch of ``processes`` ranks on this machine."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (PROGRESS, RESULT, STOP):
        (run_dir / name).unlink(missing_ok=True)
    (run_dir / FAILURE).write_bytes(b" " * FAILURE_BYTES)
    spec.save(run_dir / SPEC)
    env = dict(os.environ)
    if resolve_device_kind(spec) == "cpu":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={processes}",
        "-m",
        "feature_party.training.distributed",
        str(run_dir),
    ]
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies. The launcher calls it for
    itself (its parent: the worker) and each rank for itself (its parent: the
    launcher), so a killed worker leaves no rank training behind the job's next
    owner: the launcher cannot forward a SIGKILL it receives."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def resolve_device_kind(spec: RunSpec) -> str:
    device = spec.training.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu" if device == "cpu" else "cuda"


def report_failure(run_dir: Path, exc: BaseException) -> None:
    """Rank 0's failure, with a storage errno (retried, not failed), written over the
    report allocated at launch: no new block is needed."""
    failure: dict[str, Any] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
    if isinstance(exc, OSError) and exc.errno is not None:
        failure["errno"] = exc.errno
    data = json.dumps(failure).encode().ljust(FAILURE_BYTES)[:FAILURE_BYTES]
    fd = os.open(run_dir / FAILURE, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run's result or rank 0's failure report; None if it wrote neither."""
    for name in (RESULT, FAILURE):
        try:
            data: dict[str, Any] = json.loads((run_dir / name).read_text())
            return data
        except (OSError, ValueError):
            continue
    return None


def read_progress(run_dir: Path) -> Progress | None:
    try:
        return Progress(**json.loads((run_dir / PROGRESS).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    _die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    run_dir = Path(args[0])
    spec = RunSpec.load(run_dir / SPEC)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(spec.training, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def wrap(model: nn.Module) -> nn.Module:
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def report(progress: Progress) -> None:
        if rank == 0:
            _write_json(run_dir / PROGRESS, progress.to_dict())
        if (run_dir / STOP).exists():
            raise Interrupted("stop requested")

    try:
        metrics = execute(
            spec, report=report, rank=rank, world_size=world_size, device=device, wrap=wrap
        )
        if rank == 0:
            _write_json(run_dir / RESULT, {"ok": True, "metrics": metrics})
    except Interrupted:
        return 3
    except Exception as exc:
        if rank == 0:
            report_failure(run_dir, exc)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
