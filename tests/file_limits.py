"""A real storage refusal for a child process: ``RLIMIT_FSIZE`` (``ulimit -f``)
makes every write past ``limit`` bytes of a file fail with EFBIG, as a full disk
fails with ENOSPC. It works as root (where a read-only directory does not) and
needs no mount; SIGXFSZ is ignored so the write fails instead of killing."""

from __future__ import annotations

import resource
import signal
from collections.abc import Callable


def file_size_limit(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child's files stop at ``limit``
    bytes (an ignored signal stays ignored across exec)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply
