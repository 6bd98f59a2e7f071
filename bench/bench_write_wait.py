"""How long other writes wait while the labels party takes a large upload.

On SQLite a writer holds the whole database's write lock; the upload used to take
it before parsing the file, so every other write (a dataset, a grant, a release)
waited for the parse. A real ``labeldp label-party serve`` process (SQLite, a
temporary data directory) receives a CSV of N rows (labels, a partition plan or
example priors' groups) while this process creates a small dataset every 0.2 s and
times each request.

Run: ``.venv/bin/python -m bench.bench_write_wait [--labels N] [--upload KIND]``;
writes ``bench/results/write_wait.json`` (``write_wait_KIND.json`` for a plan or priors).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.bench_label_service import _free_port

RESULTS = Path(__file__).parent / "results" / "write_wait.json"
TOKEN = "bench-admin-token-0123456789"
DOMAIN = {"min": 0, "max": 10, "grid_size": 11}
#: Each upload: its endpoint (under the dataset) and its second column.
UPLOADS = {
    "labels": ("labels", "label"),
    "partitions": ("partitions", "part"),
    "priors": ("priors?kind=groups", "group"),
}


def _write_csv(path: Path, n: int, column: str) -> None:
    with path.open("w") as fh:
        fh.write(f"example_id,{column}\n")
        fh.writelines(f"e{i},{i % 11}\n" for i in range(n))


def _serve(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LABELDP_DATA_DIR": str(data_dir), "LABELDP_ADMIN_TOKEN": TOKEN,
           "LABELDP_MODE": "dev", "LABELDP_LOG_LEVEL": "WARNING"}  # fmt: skip
    command = [sys.executable, "-m", "labeldp", "label-party", "serve", "--port", str(port)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(client: httpx.Client) -> None:
    for _ in range(600):
        try:
            if client.get("/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the labels party did not start")


def measure(n: int, kind: str = "labels") -> dict[str, Any]:
    endpoint, column = UPLOADS[kind]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        csv = root / f"{kind}.csv"
        _write_csv(csv, n, column)
        csv_bytes = csv.stat().st_size
        port = _free_port()
        server = _serve(root / "data", port)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers,
                              timeout=600) as client:  # fmt: skip
                _wait_ready(client)
                # Classes 0…10: the same dataset takes all three uploads.
                dataset = {"name": "big", "task": "classification",
                           "label_domain": {"num_classes": 11}, "epsilon_budget": 1}  # fmt: skip
                ds = client.post("/v1/datasets", json=dataset).json()["id"]
                upload: dict[str, float] = {}

                def send() -> None:
                    start = time.perf_counter()
                    with csv.open("rb") as fh:
                        r = client.post(
                            f"/v1/datasets/{ds}/{endpoint}", files={"file": ("u.csv", fh)}
                        )
                    r.raise_for_status()
                    upload["seconds"] = time.perf_counter() - start

                thread = threading.Thread(target=send)
                thread.start()
                waits: list[float] = []
                while thread.is_alive():
                    start = time.perf_counter()
                    client.post(
                        "/v1/datasets", json={**dataset, "name": "small"}
                    ).raise_for_status()
                    waits.append(time.perf_counter() - start)
                    time.sleep(0.2)
                thread.join()
                if "seconds" not in upload:
                    raise RuntimeError("the upload failed (see the thread's error above)")
        finally:
            server.terminate()
            server.wait()
    return {
        "upload": kind,
        "rows": n,
        "csv_bytes": csv_bytes,
        "upload_seconds": round(upload["seconds"], 2),
        "small_writes": len(waits),
        "max_wait_seconds": round(max(waits), 3) if waits else None,
        "median_wait_seconds": round(statistics.median(waits), 3) if waits else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=int, default=5_000_000, help="rows in the upload")
    parser.add_argument("--upload", choices=list(UPLOADS), default="labels")
    parser.add_argument("--out", type=Path, help="default: bench/results/write_wait*.json")
    args = parser.parse_args(argv)
    if args.labels < 1:
        parser.error("--labels must be ≥ 1")
    out = args.out or (RESULTS if args.upload == "labels" else
                       RESULTS.with_stem(f"write_wait_{args.upload}"))  # fmt: skip
    result = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d"),
              **measure(args.labels, args.upload)}  # fmt: skip
    print(json.dumps(result, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
