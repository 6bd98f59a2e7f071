"""Peak memory of a features-party prediction, against the size of the file predicted.

A real features-party server (``uvicorn`` on 127.0.0.1, SQLite in a temporary data
directory) holds one tabular regression model, hidden layers (128, 64), on the
``--shape``'s columns: ``wide``, 8 numeric and 2 categorical feature columns (about
78 bytes a CSV row); ``narrow``, one numeric column (about 17 bytes a row, where
the answer weighs most against the file). The client uploads a CSV of ``--rows``
rows (an ``example_id`` and the features) to
``POST /v1/models/{id}/predict`` and reads the answer as it comes. The server's
``VmHWM`` (peak resident memory, read from ``/proc``) after the request, minus its
resident memory just before it, is the prediction's peak; divided by the CSV's size
it is the figure an operator multiplies ``LABELDP_MAX_UPLOAD_BYTES`` by.

Run: ``.venv/bin/python -m bench.bench_predict_memory [--rows 1000000 3000000]
[--shapes wide narrow] [--quick] [--out PATH]``;
writes ``bench/results/predict_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

RESULTS = Path(__file__).parent / "results" / "predict_memory.json"
#: Each shape's numeric and categorical feature columns.
SHAPES = {
    "wide": ([f"x{i}" for i in range(8)], ["city", "device"]),
    "narrow": (["x0"], []),
}
VOCABULARIES = {"city": [f"c{i}" for i in range(50)], "device": ["phone", "tablet", "desktop"]}
MODEL_ID = "bench-model"


def serve(data_dir: Path, port: int, shape: str) -> None:
    """The server process: one registered model, then uvicorn until killed."""
    import torch
    import uvicorn

    from feature_party.app import create_app
    from feature_party.config import Settings
    from feature_party.db import Database, migrate
    from feature_party.orm import Model
    from feature_party.training.data import Preprocessing
    from shared.artifact import model_artifact, save_artifact_file
    from shared.torch_models import TabularMLP, TabularMLPConfig

    settings = Settings(data_dir=data_dir, admin_token=os.environ["LABELDP_ADMIN_TOKEN"])
    numeric, categorical = SHAPES[shape]
    vocabularies = [VOCABULARIES[name] for name in categorical]
    config = TabularMLPConfig(
        num_numeric=len(numeric), vocab_sizes=tuple(len(v) + 1 for v in vocabularies)
    )
    torch.manual_seed(0)
    model = TabularMLP(config)
    preprocessing = Preprocessing(
        numeric=numeric,
        means=[0.0] * len(numeric),
        stds=[1.0] * len(numeric),
        categorical=categorical,
        vocabularies=vocabularies,
    )
    relative = Path("models") / f"{MODEL_ID}.pt"
    artifact = model_artifact(
        model=model,
        model_config=config.to_dict(),
        preprocessing=preprocessing.to_dict(),
        task="regression",
        loss="squared",
        num_classes=None,
        training={},
        metrics={},
    )
    save_artifact_file(data_dir / relative, artifact)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    with database.session() as session:
        session.add(
            Model(
                id=MODEL_ID,
                job_id=None,
                source="labels-party-training",
                training_id="bench",
                path=str(relative),
                task="regression",
                loss="squared",
                metrics={},
            )
        )
    database.dispose()
    app = create_app(settings, run_migrations=False)
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False, ws="none")


def write_csv(path: Path, rows: int, shape: str) -> None:
    numeric, categorical = SHAPES[shape]
    rng = np.random.default_rng(0)
    chunk = 100_000
    with path.open("w") as f:
        f.write(",".join(["example_id", *numeric, *categorical]) + "\n")
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            x = np.round(rng.normal(size=(n, len(numeric))), 4)
            # Some values outside each vocabulary, as in real traffic.
            words = [rng.choice([*VOCABULARIES[c], "unseen"], n) for c in categorical]
            for i in range(n):
                cells = [f"u{start + i}", *map(str, x[i]), *(w[i] for w in words)]
                f.write(",".join(cells) + "\n")


def memory(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(rows: int, shape: str, workdir: Path) -> dict[str, float | str]:
    token = secrets.token_urlsafe(24)
    data_dir, port = workdir / f"data-{shape}-{rows}", free_port()
    env = {**os.environ, "LABELDP_ADMIN_TOKEN": token, "PYTHONPATH": os.getcwd()}
    command = [sys.executable, "-m", "bench.bench_predict_memory", "--serve", str(data_dir)]
    server = subprocess.Popen([*command, "--port", str(port), "--shape", shape], env=env)
    csv = workdir / f"rows-{shape}-{rows}.csv"
    write_csv(csv, rows, shape)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=600) as client:
            for _ in range(600):
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            before = memory(server.pid)["VmRSS"]
            started = time.perf_counter()
            with csv.open("rb") as f:
                files = {"file": (csv.name, f, "text/csv")}
                with client.stream("POST", f"/v1/models/{MODEL_ID}/predict", files=files) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"{r.status_code}: {r.read()[:500]!r}")
                    answered = sum(len(chunk) for chunk in r.iter_bytes())
            seconds = time.perf_counter() - started
            peak = memory(server.pid)["VmHWM"]
    finally:
        server.terminate()
        server.wait(30)
    size = csv.stat().st_size
    return {
        "shape": shape,
        "rows": rows,
        "csv_mib": size / 2**20,
        "answer_mib": answered / 2**20,
        "baseline_mib": before / 2**20,
        "peak_extra_mib": (peak - before) / 2**20,
        "peak_over_csv": (peak - before) / size,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 3_000_000])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["wide", "narrow"])
    parser.add_argument("--shape", default="wide", help=argparse.SUPPRESS)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="20,000 rows (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.shape)
        return
    results = []
    rows_list = [20_000] if args.quick else args.rows
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            for rows in rows_list:
                result = measure(rows, shape, Path(tmp))
                print(json.dumps(result), flush=True)
                results.append(result)
    if not args.no_write:
        args.out.write_text(json.dumps({"runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
