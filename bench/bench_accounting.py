"""ε of LabelDP-Pro's noise under four analyses of the same steps (``labeldp-pro.txt`` §3.4).

For the σ the service calibrates (``label_party.labeldp_pro.accounting``: RDP,
Poisson-subsampled Gaussian at σ/2, i.e. sensitivity 2C for a label change) at
each target ε, this prints the ε that other analyses in ``dp-accounting`` give
for the very same run (T steps at rate q, noise σC):

* ``service``: the service's own number (RDP, add-or-remove at σ/2) — the target;
* ``pld_add_remove_half``: the same reduction, by PLD instead of RDP;
* ``pld_replace_one``: the library's PLD for *replace-one* neighbours
  (``NeighboringRelation.REPLACE_ONE``): the pair ``(1−q)N(0) + qN(C)`` vs
  ``(1−q)N(0) + qN(−C)``, which is label substitution with the sampling coin kept;
* ``paper_add_remove``: add-or-remove at σ with sensitivity C, the item-level
  relation the paper reports (§3.4) — not a label-substitution guarantee.

It informs the open question of whether the service's reduction is too
conservative; it changes nothing in the service.

    python -m bench.bench_accounting [--epsilons 0.1 0.5 1] [--steps 177] [--rate 0.01707]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import dp_accounting
from dp_accounting import NeighboringRelation
from dp_accounting.pld import PLDAccountant

from label_party.labeldp_pro.accounting import accountant_version, calibrate_noise, epsilon_for

RESULTS = Path(__file__).resolve().parent / "results"


def _pld_epsilon(sigma: float, q: float, steps: int, delta: float, relation: Any) -> float:
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant = PLDAccountant(neighboring_relation=relation)
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, steps))
    return float(accountant.get_epsilon(delta))


def compare(target: float, q: float, steps: int, delta: float) -> dict[str, float]:
    """The four ε's of the σ calibrated for ``target``."""
    sigma = calibrate_noise(target, delta, q, steps)
    add_remove = NeighboringRelation.ADD_OR_REMOVE_ONE
    return {
        "noise_multiplier": sigma,
        "service": epsilon_for(sigma, q, steps, delta),
        "pld_add_remove_half": _pld_epsilon(sigma / 2, q, steps, delta, add_remove),
        "pld_replace_one": _pld_epsilon(sigma, q, steps, delta, NeighboringRelation.REPLACE_ONE),
        "paper_add_remove": _pld_epsilon(sigma, q, steps, delta, add_remove),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    p.add_argument("--steps", type=int, default=177, help="training steps T (bench: 3 epochs)")
    p.add_argument("--rate", type=float, default=1024 / 60000, help="Poisson sampling rate q")
    p.add_argument("--delta", type=float, default=1 / 60000)
    p.add_argument("--out", type=Path, default=RESULTS / "accounting_relations.json")
    args = p.parse_args()
    rows = {str(eps): compare(eps, args.rate, args.steps, args.delta) for eps in args.epsilons}
    print("| target ε | σ | service (RDP, σ/2) | PLD σ/2 | PLD replace-one | paper (σ, C) |")
    print("|---|---|---|---|---|---|")
    for eps, r in rows.items():
        print(
            f"| {eps} | {r['noise_multiplier']:.3f} | {r['service']:.3f} "
            f"| {r['pld_add_remove_half']:.3f} | {r['pld_replace_one']:.3f} "
            f"| {r['paper_add_remove']:.3f} |"
        )
    payload = {
        "benchmark": "accounting_relations",
        "command": "python -m bench.bench_accounting " + " ".join(sys.argv[1:]),
        "dp_accounting": accountant_version(),
        "steps": args.steps,
        "sampling_rate": args.rate,
        "delta": args.delta,
        "rows": rows,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
