"""Scale benchmark: 3 million flights labels and 10 million replicated labels
through the real services, with each service process's peak memory.

Labels party (``labeldp label-party serve`` as its own process, SQLite by default,
a fresh server per size): upload the labels (Parquet over HTTP), one release
(``rr-on-bins`` by default, or ``unbiased``, on the public regression domain),
download it. Features party (``feature-party serve`` and ``worker``, on the
flights set only): upload the 3-million-row feature set, receive a release
(the features party asks the labels party for it, as a client), train one epoch
of the MLP (regression).

Peak RSS is the kernel's high-water mark (``VmHWM`` in ``/proc/<pid>/status``)
of each server process. It is reset before every phase (``echo 5 >
/proc/<pid>/clear_refs``) so each phase reports its own peak, not the largest
so far; ``lifetime`` is the largest of them and of the start-up. The machine is
shared, so each phase also records the load average before and after.

``--experiment`` instead wraps ``labeldp experiment --dataset flights-delay
--epochs 1`` end to end and samples the high-water mark of every process it
starts (the command stops its services before it exits, so the last sample,
taken every 0.2 s, stands for the peak).

Run: ``.venv/bin/python -m bench.bench_scale [--quick] [--database-url URL]
[--experiment]``; writes ``bench/results/scale.json`` (``scale_experiment.json``
with ``--experiment``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from labeldp import datasets
from labeldp.harness import parquet_bytes
from labeldp.processes import ServiceProcess, free_port, running

RESULTS = Path(__file__).parent / "results" / "scale.json"

#: The bench's own clip for the flights delay (minutes), used only when
#: ``labeldp.datasets`` has no ``flights-delay`` loader: one hour, the loader's
#: rule (public configuration).
FALLBACK_CLIP = 60.0

T = TypeVar("T")


# -- the machine and the processes (shared with bench_api_latency) ----------------


def machine() -> dict[str, Any]:
    """What the numbers were measured on: they mean little without it."""
    meminfo = Path("/proc/meminfo").read_text().split()
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def load_average() -> list[float]:
    """The 1/5/15-minute load average: the box is shared, so every number carries it."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def status_kib(pid: int, field: str) -> int | None:
    """One ``VmXXX`` field of ``/proc/<pid>/status`` in KiB (None: the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def reset_peak(pid: int) -> bool:
    """Reset the process's ``VmHWM`` to its current RSS, so the next read is this
    phase's own peak (Linux ≥ 4.0; needs the same user)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_mib(pid: int) -> float | None:
    kib = status_kib(pid, "VmHWM")
    return None if kib is None else round(kib / 1024, 1)


def pid_of(service: ServiceProcess) -> int:
    if service.process is None:
        raise RuntimeError(f"{service.name} is not running")
    return service.process.pid


def service_env(data_dir: Path, token: str, database_url: str | None) -> dict[str, str]:
    env = {
        "LABELDP_DATA_DIR": str(data_dir),
        "LABELDP_ADMIN_TOKEN": token,
        "LABELDP_LOG_LEVEL": "WARNING",
    }
    if database_url:
        env["LABELDP_DATABASE_URL"] = database_url
    return env


def label_party(root: Path, token: str, database_url: str | None) -> ServiceProcess:
    """A labels-party server as its own process (what ``labeldp`` runs), on a free port."""
    port = free_port()
    return ServiceProcess(
        "labels party",
        ["label-party", "serve", "--port", str(port)],
        service_env(root / "labels-party", token, database_url),
        root / "logs" / "labels-party.log",
        port=port,
    )


def phase(pids: dict[str, int], work: Callable[[], T]) -> tuple[dict[str, Any], T]:
    """Run ``work`` timing it, with each process's peak RSS during it (MiB)."""
    exact = all(reset_peak(pid) for pid in pids.values())
    # What each process already held: part of its peak (freed memory is not
    # always given back to the OS).
    held = {name: round((status_kib(pid, "VmRSS") or 0) / 1024, 1) for name, pid in pids.items()}
    before = load_average()
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    record = {
        "seconds": round(seconds, 2),
        "peak_rss_mib": {name: peak_mib(pid) for name, pid in pids.items()},
        "rss_at_start_mib": held,
        "peak_is_per_phase": exact,
        "loadavg_before": before,
        "loadavg_after": load_average(),
    }
    return record, result


# -- the data --------------------------------------------------------------------


@dataclass
class Flights:
    ids: pa.Array
    labels: np.ndarray
    features: pa.Table  # example_id + feature columns
    numeric: list[str]
    categorical: list[str]
    domain: dict[str, Any]
    source: str

    def labels_table(self) -> pa.Table:
        return pa.table({"example_id": self.ids, "label": self.labels})


def _from_loader(data: datasets.Dataset) -> Flights:
    return Flights(
        ids=pa.array(data.example_id, pa.string()),
        labels=data.labels,
        features=data.features_table(),
        numeric=list(data.numeric),
        categorical=list(data.categorical),
        domain=dict(data.label_domain),
        source='labeldp.datasets.load("flights-delay")',
    )


def _from_parquet(path: Path) -> Flights:
    """The bench's own reading of the raw file, for when the loader is not there yet:
    label = ``delay`` clipped to [0, FALLBACK_CLIP]; features: distance, the hour and
    the day of the year (numeric), weekday, origin, destination (categorical)."""
    raw = pq.read_table(path)
    n = raw.num_rows
    ids = pc.binary_join_element_wise("fl-", pc.cast(pa.array(np.arange(n)), pa.string()), "")
    delay = raw.column("delay").to_numpy().astype(np.float64)
    date = raw.column("date")
    features = pa.table(
        {
            "example_id": ids,
            "distance": pc.cast(raw.column("distance"), pa.float64()),
            "hour": pc.cast(pc.hour(date), pa.float64()),
            "day_of_year": pc.cast(pc.day_of_year(date), pa.float64()),
            "weekday": pc.cast(pc.day_of_week(date), pa.string()),
            "origin": pc.cast(raw.column("origin"), pa.string()),
            "destination": pc.cast(raw.column("destination"), pa.string()),
        }
    )
    return Flights(
        ids=ids,
        labels=np.clip(delay, 0.0, FALLBACK_CLIP),
        features=features,
        numeric=["distance", "hour", "day_of_year"],
        categorical=["weekday", "origin", "destination"],
        domain={"min": 0.0, "max": FALLBACK_CLIP, "step": 1.0, "clip": True},
        source=f"bench fallback: {path.name}, delay clipped to [0, {FALLBACK_CLIP:g}]",
    )


def _load_full() -> Flights:
    if "flights-delay" in datasets.LOADERS:
        return _from_loader(datasets.load("flights-delay"))
    return _from_parquet(datasets.datasets_dir() / "vega" / "flights-3m.parquet")


@contextlib.contextmanager
def _first_rows(limit: int) -> Iterator[None]:
    """A datasets directory whose flights file holds only its first ``limit`` rows, so
    ``--quick`` runs the real loader without reading all 3M rows."""
    source = pq.ParquetFile(datasets.datasets_dir() / "vega" / "flights-3m.parquet")
    head = pa.Table.from_batches([next(source.iter_batches(batch_size=limit))])
    saved = os.environ.get("LABELDP_DATASETS_DIR")
    with tempfile.TemporaryDirectory(prefix="bench-scale-data-") as tmp:
        (Path(tmp) / "vega").mkdir()
        pq.write_table(head, Path(tmp) / "vega" / "flights-3m.parquet")
        os.environ["LABELDP_DATASETS_DIR"] = tmp
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("LABELDP_DATASETS_DIR", None)
            else:
                os.environ["LABELDP_DATASETS_DIR"] = saved


def load_flights(limit: int | None) -> Flights:
    """Flights through the shared loader when it exists, else the bench's fallback;
    with ``limit``, the file's first ``limit`` rows."""
    if limit is None:
        return _load_full()
    with _first_rows(limit):
        data = _load_full()
    data.source += f"; first {limit} rows of the file (--quick)"
    return data


def replicated_labels(flights: Flights, n: int) -> pa.Table:
    """``n`` labels: the flights labels repeated, with new example ids."""
    ids = pc.binary_join_element_wise("rep-", pc.cast(pa.array(np.arange(n)), pa.string()), "")
    return pa.table({"example_id": ids, "label": np.resize(flights.labels, n)})


# -- the labels party ------------------------------------------------------------


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.url}: HTTP {response.status_code}: {response.text}")
    body: dict[str, Any] = response.json()
    return body


def labels_run(
    table: pa.Table, flights: Flights, args: argparse.Namespace, root: Path
) -> dict[str, Any]:
    """Upload, release and download ``table`` on a fresh labels-party process."""
    token = secrets.token_urlsafe(24)
    source = root / "labels.parquet"
    pq.write_table(table, source)
    server = label_party(root, token, args.database_url)
    out: dict[str, Any] = {"labels": table.num_rows, "upload_bytes": source.stat().st_size}
    with (
        running(server),
        httpx.Client(
            base_url=server.url, timeout=3600, headers={"Authorization": f"Bearer {token}"}
        ) as http,
    ):
        pids = {"labels_party": pid_of(server)}
        out["startup_peak_rss_mib"] = peak_mib(pids["labels_party"])
        dataset = _ok(
            http.post(
                "/v1/datasets",
                json={
                    "name": f"scale {table.num_rows}",
                    "task": "regression",
                    "label_domain": flights.domain,
                    "epsilon_budget": 10,
                },
            )
        )["id"]
        with source.open("rb") as fh:
            out["upload"], body = phase(
                pids,
                lambda: _ok(
                    http.post(
                        f"/v1/datasets/{dataset}/labels", files={"file": ("labels.parquet", fh)}
                    )
                ),
            )
        assert body["num_labels"] == table.num_rows, body
        mechanism = {"name": args.mechanism}
        out["release"], manifest = phase(
            pids,
            lambda: _ok(
                http.post(
                    f"/v1/datasets/{dataset}/releases", json={"mechanism": mechanism, "epsilon": 1}
                )
            ),
        )
        out["release"]["mechanism"] = args.mechanism
        out["download"], size = phase(
            pids,
            lambda: len(
                http.get(f"/v1/releases/{manifest['id']}/labels").raise_for_status().content
            ),
        )
        out["release_bytes"] = size
        out["lifetime_peak_rss_mib"] = max(
            [out["startup_peak_rss_mib"] or 0.0]
            + [
                out[p]["peak_rss_mib"]["labels_party"] or 0.0
                for p in ("upload", "release", "download")
            ]
        )
    return out


# -- the features party ----------------------------------------------------------


def feature_services(root: Path, token: str) -> tuple[ServiceProcess, ServiceProcess]:
    port = free_port()
    env = service_env(root / "features-party", token, None)
    env["LABELDP_CLIENT_TIMEOUT_SECONDS"] = "3600"
    logs = root / "logs"
    return (
        ServiceProcess(
            "features party",
            ["feature-party", "serve", "--port", str(port)],
            env,
            logs / "features-party.log",
            port=port,
        ),
        ServiceProcess("worker", ["feature-party", "worker"], env, logs / "worker.log"),
    )


def _grant_client(http: httpx.Client, dataset: str) -> str:
    client = _ok(http.post("/v1/clients", json={"name": "scale publisher", "role": "client"}))
    _ok(http.post(f"/v1/datasets/{dataset}/grants", json={"client_id": client["id"]}))
    return str(client["token"])


def _wait_job(http: httpx.Client, job_id: str) -> dict[str, Any]:
    while True:
        state = _ok(http.get(f"/v1/jobs/{job_id}"))
        if state["status"] == "succeeded":
            return state
        if state["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"training job {job_id} {state['status']}: {state.get('error')}")
        time.sleep(0.5)


def features_run(flights: Flights, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Features upload, receive a release (made by the labels party for it), one epoch."""
    lp_token, fp_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    lp = label_party(root, lp_token, args.database_url)
    fp, worker = feature_services(root, fp_token)
    features = parquet_bytes(flights.features)
    labels = parquet_bytes(flights.labels_table())
    out: dict[str, Any] = {"rows": flights.features.num_rows, "features_bytes": len(features)}
    lp_auth, fp_auth = (
        {"Authorization": f"Bearer {lp_token}"},
        {"Authorization": f"Bearer {fp_token}"},
    )
    with (
        running(lp, fp, worker),
        httpx.Client(base_url=lp.url, headers=lp_auth, timeout=3600) as lph,
        httpx.Client(base_url=fp.url, headers=fp_auth, timeout=3600) as fph,
    ):
        if not args.quick:
            time.sleep(5.0)  # the worker imports torch before it polls: not part of any phase
        dataset = _ok(
            lph.post(
                "/v1/datasets",
                json={
                    "name": "flights",
                    "task": "regression",
                    "label_domain": flights.domain,
                    "epsilon_budget": 10,
                },
            )
        )["id"]
        _ok(lph.post(f"/v1/datasets/{dataset}/labels", files={"file": ("l.parquet", labels)}))
        client_token = _grant_client(lph, dataset)
        pids = {"labels_party": pid_of(lp), "features_party": pid_of(fp), "worker": pid_of(worker)}
        roles = {"numeric": flights.numeric, "categorical": flights.categorical}
        out["upload_features"], fs = phase(
            pids,
            lambda: _ok(
                fph.post(
                    "/v1/feature-sets",
                    files={"file": ("features.parquet", features)},
                    data={"schema": json.dumps(roles), "name": "flights"},
                )
            ),
        )
        body = {
            "feature_set_id": fs["id"],
            "labels_party_url": lp.url,
            "token": client_token,
            "dataset_id": dataset,
            "release": {"mechanism": {"name": args.mechanism}, "epsilon": 1},
        }
        out["receive_release"], received = phase(
            pids, lambda: _ok(fph.post("/v1/received-labels", json=body))
        )
        out["receive_release"]["matched"] = received["matched"]
        job = {
            "feature_set_id": fs["id"],
            "labels_id": received["id"],
            "task": "regression",
            "loss": "squared",
            "epochs": 1,
            "device": "cpu",
            "batch_size": args.batch_size,
        }
        out["train_one_epoch"], state = phase(
            pids, lambda: _wait_job(fph, _ok(fph.post("/v1/jobs", json=job))["id"])
        )
        out["train_one_epoch"].update(
            batch_size=args.batch_size,
            progress=state.get("progress"),
            metrics=_short_metrics(state.get("metrics")),
        )
    return out


def _short_metrics(metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's metrics without the per-epoch history (kept small in the JSON)."""
    if metrics is None:
        return None
    return {k: v for k, v in metrics.items() if k != "history"}


# -- labeldp experiment, wrapped -------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(root: int) -> list[int]:
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, []))
    return found


def _role(pid: int) -> str:
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in argv)
        for key, name in (
            ("label-party serve", "labels_party"),
            ("feature-party serve", "features_party"),
            ("feature-party worker", "worker"),
            ("experiment", "experiment"),
        ):
            if key in text:
                return name
    return f"pid {pid}"


def _sample_peaks(root: int, done: threading.Event, peaks: dict[str, float]) -> None:
    """Every 0.2 s, the high-water mark of every process under ``root`` by role."""
    while not done.is_set():
        for pid in _descendants(root):
            kib = status_kib(pid, "VmHWM")
            if kib is not None:
                role = _role(pid)
                peaks[role] = max(peaks.get(role, 0.0), round(kib / 1024, 1))
        done.wait(0.2)


def _steps(stderr: str) -> list[str]:
    """The command's progress lines (timestamped steps), epoch updates but the last left out."""
    lines = stderr.strip().splitlines()
    epochs = [line for line in lines if "    epoch " in line]
    last = epochs[-1] if epochs else None
    return [line for line in lines if "    epoch " not in line or line == last]


def experiment_run(args: argparse.Namespace) -> dict[str, Any]:
    """``labeldp experiment --dataset flights-delay --epochs 1`` end to end, sampled."""
    command = [
        sys.executable,
        "-m",
        "labeldp",
        "experiment",
        "--dataset",
        "flights-delay",
        "--method",
        args.mechanism,
        "--epsilon",
        "1",
        "--epochs",
        "1",
        "--json",
    ]
    if args.quick:
        command += ["--max-examples", "20000"]
    peaks: dict[str, float] = {}
    done = threading.Event()
    before, start = load_average(), time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=_sample_peaks, args=(proc.pid, done, peaks), daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"labeldp experiment failed ({proc.returncode}):\n{stderr[-4000:]}")
    return {
        "command": " ".join(["labeldp", *command[3:]]),
        "seconds": round(seconds, 1),
        "peak_rss_mib": peaks,
        "loadavg_before": before,
        "loadavg_after": load_average(),
        "result": json.loads(stdout.strip().splitlines()[-1]),
        "progress_log": _steps(stderr),
    }


# -- command ---------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20k flights labels, 50k replicated (keeps the script working)",
    )
    parser.add_argument("--replicated", type=int, default=10_000_000, help="default 10M")
    parser.add_argument("--mechanism", default="rr-on-bins", choices=["rr-on-bins", "unbiased"])
    parser.add_argument("--batch-size", type=int, default=8192, help="training batch")
    parser.add_argument("--database-url", help="an empty labels-party database (default SQLite)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["flights", "replicated", "features"],
        help="leave a part out",
    )
    parser.add_argument(
        "--experiment",
        action="store_true",
        help="wrap `labeldp experiment --dataset flights-delay --epochs 1` instead",
    )
    parser.add_argument("--out", type=Path, help="where the JSON goes (default bench/results/)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.replicated = min(args.replicated, 50_000)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["python -m bench.bench_scale", *args.argv]),
        "database": "postgres" if args.database_url else "sqlite",
    }
    if args.experiment:
        results["experiment"] = experiment_run(args)
        return results
    flights = load_flights(20_000 if args.quick else None)
    results["flights_source"] = flights.source
    results["label_domain"] = flights.domain
    for part, make in (
        ("flights", flights.labels_table),
        ("replicated", lambda: replicated_labels(flights, args.replicated)),
    ):
        if part not in args.skip:
            with tempfile.TemporaryDirectory(prefix=f"bench-scale-{part}-") as tmp:
                results[part] = labels_run(make(), flights, args, Path(tmp))
            print(json.dumps({part: results[part]}), file=sys.stderr, flush=True)
    if "features" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="bench-scale-features-") as tmp:
            results["features"] = features_run(flights, args, Path(tmp))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    default = RESULTS.with_name("scale_experiment.json") if args.experiment else RESULTS
    out: Path = args.out or default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
