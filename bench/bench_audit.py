"""How long ``GET /v1/audit/verify`` takes as the audit log grows.

Verification recomputes every entry's hash and re-derives every dataset's spend
from the log on each call (label_party/audit/service.py), so its cost grows with
the log. This fills a fresh labels-party database through ``audit.append`` (the
path the service writes with): one dataset, and per 10 entries one release with
its ledger entry, the rest label uploads; then times ``verify`` at each size
(the fastest of three).

Run: ``.venv/bin/python -m bench.bench_audit [--entries 10000 100000]
[--database-url postgresql+psycopg://…]``; writes ``bench/results/audit_verify.json``
(``audit_verify_postgres.json`` with a URL; use an empty database of your own).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from label_party.audit import service as audit
from label_party.db import Database, connect, migrate, transaction
from label_party.models import Dataset, LedgerEntry

RESULTS = Path(__file__).parent / "results" / "audit_verify.json"
BATCH = 2000
#: Verifications per size; the fastest is reported (the others met a busy machine).
REPEATS = 3


def _dataset(session: Session) -> str:
    dataset_id = str(uuid.uuid4())
    session.add(
        Dataset(id=dataset_id, name="bench", task="regression",
                label_domain={"min": 0, "max": 1}, epsilon_budget=10**15, delta_budget=0,
                created_by="bench")
    )  # fmt: skip
    session.flush()
    audit.append(session, actor="bench", action="dataset.created", dataset_id=dataset_id,
                 payload={"epsilon_budget_units": 10**15, "delta_budget_units": 0})  # fmt: skip
    return dataset_id


def _append(session: Session, dataset_id: str, seq: int) -> None:
    if seq % 10 == 0:
        entry = LedgerEntry(id=str(uuid.uuid4()), dataset_id=dataset_id, epsilon=10**6, delta=0)
        session.add(entry)
        session.flush()
        audit.append(session, actor="bench", action="release.created", dataset_id=dataset_id,
                     payload={"ledger_entry_id": entry.id, "epsilon_units": 10**6,
                              "delta_units": 0, "mechanism": "laplace"})  # fmt: skip
    else:
        audit.append(session, actor="bench", action="labels.uploaded", dataset_id=dataset_id,
                     payload={"num_labels": 1000, "sha256": "0" * 64})  # fmt: skip


def _verify(database: Database, size: int) -> float:
    start = time.perf_counter()
    with transaction(database.reader) as session:
        result = audit.verify(session)
    seconds = time.perf_counter() - start
    if not result.ok or result.entries != size:
        raise RuntimeError(f"verification failed at {size} entries: {result}")
    return seconds


def measure(url: str, sizes: list[int]) -> list[dict[str, Any]]:
    database = connect(url)
    migrate(database.writer_engine)
    rows: list[dict[str, Any]] = []
    written = 1
    try:
        with transaction(database.writer) as session:
            dataset_id = _dataset(session)
        for size in sorted(sizes):
            start = time.perf_counter()
            while written < size:
                with transaction(database.writer) as session:
                    for _ in range(min(BATCH, size - written)):
                        written += 1
                        _append(session, dataset_id, written)
            fill = time.perf_counter() - start
            seconds = min(_verify(database, size) for _ in range(REPEATS))
            rows.append({"entries": size, "verify_seconds": round(seconds, 3),
                         "entries_per_second": round(size / seconds),
                         "fill_seconds": round(fill, 1)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        database.dispose()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[10_000, 100_000, 300_000],
                        help="log sizes to verify at (each ≥ 2)")  # fmt: skip
    parser.add_argument("--database-url", help="an empty Postgres database (default: SQLite)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="200 entries (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.entries = [2, 200]
    if min(args.entries) < 2:
        parser.error("--entries must each be ≥ 2")
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/labels.db"
        rows = measure(url, args.entries)
    result = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d"),
              "database": "postgres" if args.database_url else "sqlite", "sizes": rows}  # fmt: skip
    out = args.out or (
        RESULTS.with_name("audit_verify_postgres.json") if args.database_url else RESULTS
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
