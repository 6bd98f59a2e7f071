"""Run every mechanism benchmark and write ``bench/results/*.json``.

``make bench`` runs this. Each ``bench.bench_*`` module also runs on its own
(``python -m bench.bench_unbiased``); this driver runs them one after another so
they do not compete for the machine's two cores.
"""

from __future__ import annotations

import importlib
import platform
import sys
import time

MODULES = [
    "bench_rr_on_bins",
    "bench_unbiased",
    "bench_sampling",
    "bench_additive",
    "bench_rr_classes",
]


def main() -> int:
    print(
        f"# {platform.node()} · {platform.processor() or platform.machine()} · "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    for name in MODULES:
        print(f"\n## {name}")
        module = importlib.import_module(f"bench.{name}")
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
