"""Start-up and logs. A service or worker that cannot start says why in one line
naming the ``LABELDP_*`` variable to fix, and exits 2: no traceback from inside
uvicorn's start-up, and never a setting's secret value. Both services log JSON
lines with request ids."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from labeldp.processes import ServiceProcess, free_port
from tests.file_limits import fill, full_disk

PASSWORD = "pg-secret-4f9a"
CASES = {
    "garbage URL": ({"LABELDP_DATABASE_URL": "garbage"}, "LABELDP_DATABASE_URL"),
    "unreachable Postgres": (
        {"LABELDP_DATABASE_URL": f"postgresql+psycopg://u:{PASSWORD}@127.0.0.1:1/x"},
        "cannot open the database",
    ),
    "data dir under a file": ({"LABELDP_DATA_DIR": "{tmp}/file/data"}, "LABELDP_DATA_DIR"),
    "bad number": ({"LABELDP_MAX_UPLOAD_BYTES": "abc"}, "LABELDP_MAX_UPLOAD_BYTES"),
    "bad log level": ({"LABELDP_LOG_LEVEL": "verbose"}, "LABELDP_LOG_LEVEL"),
    "misspelled setting": (
        {"LABELDP_MAX_CONCURENT_REQUESTS": "5"},
        "LABELDP_MAX_CONCURENT_REQUESTS is not a labeldp setting: did you mean "
        "LABELDP_MAX_CONCURRENT_REQUESTS?",
    ),
}


def _start(tmp_path: Path, command: list[str], overrides: dict[str, str]
           ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    (tmp_path / "file").write_text("not a directory")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}
    env |= {"LABELDP_ADMIN_TOKEN": secrets.token_urlsafe(32),
            "LABELDP_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    env |= {k: v.format(tmp=tmp_path) for k, v in overrides.items()}
    return subprocess.run(
        [sys.executable, "-m", "labeldp", *command],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


#: Each server with every case; each worker (the same checks, ``shared.startup``)
#: with the two that reach past the settings.
STARTS = [
    *[(party, "serve", case) for party in ("label-party", "feature-party") for case in CASES],
    *[(party, "worker", case) for party in ("label-party", "feature-party")
      for case in ("unreachable Postgres", "data dir under a file")],
]  # fmt: skip


@pytest.mark.parametrize(("party", "command", "case"), STARTS)
def test_a_start_that_cannot_work_is_one_line(tmp_path: Path, party: str, command: str, case: str
                                              ) -> None:  # fmt: skip
    overrides, expected = CASES[case]
    done = _start(tmp_path, [party, command], overrides)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("labeldp: error: "), done.stderr[-2000:]
    assert expected in lines[0] and PASSWORD not in lines[0]


@pytest.mark.parametrize("party", ["label-party", "feature-party"])
def test_workers_start_without_the_admin_token_the_apis_need(tmp_path: Path, party: str) -> None:
    """In production mode, with no ``LABELDP_ADMIN_TOKEN``: serve refuses to start,
    the worker (which answers no request) runs."""
    no_token = {"LABELDP_ADMIN_TOKEN": ""}
    worker = _start(tmp_path, [party, "worker", "--once"], no_token)
    assert worker.returncode == 0, worker.stderr[-2000:]
    serve = _start(tmp_path, [party, "serve", "--port", str(free_port())], no_token)
    assert serve.returncode == 2 and "LABELDP_ADMIN_TOKEN" in serve.stderr, serve.stderr[-2000:]


def test_the_features_party_logs_json_lines_with_request_ids(tmp_path: Path) -> None:
    """As the labels party does: one JSON line per request with its id and route
    template (never the raw path), probes below INFO, the id echoed to the caller."""
    token = secrets.token_urlsafe(32)
    service = ServiceProcess(
        "features party",
        ["feature-party", "serve", "--port", str(port := free_port())],
        {"LABELDP_ADMIN_TOKEN": f"{token}\n", "LABELDP_DATA_DIR": str(tmp_path / "data")},
        tmp_path / "fp.log",
        port,
    )
    service.start()
    try:
        service.wait_healthy()
        headers = {"Authorization": f"Bearer {token}", "X-Request-ID": "rq-77"}
        answer = httpx.get(f"{service.url}/v1/jobs/job-1234", headers=headers, timeout=10)
        assert answer.status_code == 404  # the token, read with its newline, still works
        assert answer.headers["x-request-id"] == "rq-77"
    finally:
        service.stop()
    lines = [json.loads(line) for line in service.log_path.read_text().splitlines()
             if line.startswith("{")]  # fmt: skip
    requests = [line for line in lines if line["message"] == "request"]
    assert [(r["request_id"], r["route"], r["status"]) for r in requests] == [
        ("rq-77", "/v1/jobs/{job_id}", 404)
    ]
    assert "job-1234" not in service.log_path.read_text()


def _labels_server(env: dict[str, str], log: Path) -> ServiceProcess:
    port = free_port()
    return ServiceProcess("labels party", ["label-party", "serve", "--port", str(port)],
                          env, log, port)  # fmt: skip


def test_a_second_labels_party_server_on_one_data_dir_refuses_to_start(tmp_path: Path) -> None:
    """Its start-up sweep would set aside the first one's releases in flight: the
    second says so in one line, exits 2, and the first serves on."""
    data = tmp_path / "data"
    env = {"LABELDP_ADMIN_TOKEN": secrets.token_urlsafe(32), "LABELDP_DATA_DIR": str(data)}
    first = _labels_server(env, tmp_path / "lp.log")
    first.start()
    try:
        first.wait_healthy()
        # It says where it listens (uvicorn does not, given a socket bound before it).
        assert f"listening on http://127.0.0.1:{first.port}" in first.log_path.read_text()
        fresh = tmp_path / "second.sqlite3"  # it must not migrate before it checks
        second = _start(tmp_path, ["label-party", "serve", "--port", str(free_port())],
                        {"LABELDP_DATA_DIR": str(data),
                         "LABELDP_DATABASE_URL": f"sqlite:///{fresh}"})  # fmt: skip
        assert second.returncode == 2, second.stderr[-2000:]
        [line] = second.stderr.strip().splitlines()
        assert "another labels-party server already uses LABELDP_DATA_DIR" in line
        assert not fresh.exists()
        assert httpx.get(f"{first.url}/healthz", timeout=10).status_code == 200
    finally:
        first.stop()
    again = _labels_server(env, tmp_path / "lp2.log")
    again.start()  # the lock died with its holder
    try:
        again.wait_healthy()
    finally:
        again.stop()


def test_a_full_disk_is_a_507_in_the_access_log_too(tmp_path: Path) -> None:
    """The access log and the metrics record the status the client got: a 507 for a
    write the full disk refused (it was a 500 there, and uvicorn logged an
    exception), and the connection stays usable."""
    token = secrets.token_urlsafe(32)
    with full_disk(tmp_path / "small", size=16 << 20) as data:
        service = ServiceProcess(
            "features party",
            ["feature-party", "serve", "--port", str(port := free_port())],
            {"LABELDP_ADMIN_TOKEN": token, "LABELDP_DATA_DIR": str(data)},
            tmp_path / "fp.log",
            port,
        )
        service.start()
        try:
            service.wait_healthy()
            fill(data)
            headers = {"Authorization": f"Bearer {token}"}
            rows = "example_id,x\n" + "".join(f"e{i},{i}\n" for i in range(20_000))
            with httpx.Client(base_url=service.url, headers=headers, timeout=30) as client:
                r = client.post("/v1/feature-sets", files={"file": ("f.csv", rows.encode())})
                assert r.status_code == 507 and r.json()["error"] == "storage_unavailable", r.text
                assert client.get("/healthz").status_code == 200  # the same connection
        finally:
            service.stop()
    lines = [json.loads(line) for line in service.log_path.read_text().splitlines()
             if line.startswith("{")]  # fmt: skip
    statuses = [r["status"] for r in lines if r["message"] == "request"]
    assert 507 in statuses and 500 not in statuses, statuses


@pytest.mark.parametrize("party", ["label-party", "feature-party"])
def test_a_port_in_use_is_one_line_and_status_2(tmp_path: Path, party: str) -> None:
    """uvicorn logged the bind error as JSON lines and exited 3, a status ``labeldp
    --help`` does not list."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _start(tmp_path, [party, "serve", "--port", str(port)], {})
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line
