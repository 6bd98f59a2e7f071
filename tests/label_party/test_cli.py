"""``labeldp label-party`` client commands against the real server."""

from __future__ import annotations

import functools
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from labeldp.cli import main
from shared import watching
from shared.cli_errors import refusal
from tests.label_party.conftest import ADMIN_TOKEN, Server
from tests.label_party.helpers import parquet_bytes

pytestmark = pytest.mark.slow


def test_operator_commands(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--url", server.url, "--token", ADMIN_TOKEN]

    errors: list[str] = []

    def run(*argv: str) -> dict:
        assert main(["label-party", *argv, *common]) == 0
        out, err = capsys.readouterr()
        errors.append(err)
        return json.loads(out) if out.lstrip().startswith(("{", "[")) else {"out": out}

    ds = run(
        "create-dataset",
        "--name",
        "cli",
        "--domain",
        '{"min": 0, "max": 4}',
        "--epsilon-budget",
        "1",
    )["id"]
    labels = tmp_path / "labels.parquet"
    labels.write_bytes(parquet_bytes({"example_id": ["a", "b"], "label": [1.0, 3.0]}))
    assert run("upload", ds, str(labels)) == {"num_labels": 2}
    manifest = run(
        "release", ds, "--mechanism", "laplace", "--epsilon", "0.4", "--param", "clip=true"
    )
    key = errors[-1].split("--idempotency-key ")[1].split()[0]
    assert manifest["epsilon"] == 0.4 and manifest["mechanism"]["params"]["clip"] is True
    out = tmp_path / "noisy.parquet"
    run("download", manifest["id"], "--output", str(out))
    assert out.stat().st_size > 0 and f"bytes to {out}" in errors[-1]
    # "-" is standard output, which then carries the labels alone.
    piped = run("download", manifest["id"], "--output", "-", "--format", "json")
    assert piped["example_id"] == ["a", "b"] and "to standard output" in errors[-1]
    assert not (Path.cwd() / "-").exists()
    nowhere = str(tmp_path / "missing" / "noisy.parquet")
    assert main(["label-party", "download", manifest["id"], "--output", nowhere, *common]) == 2
    assert "cannot write --output" in capsys.readouterr().err
    # A command cut short may have spent: it named its key first, and a rerun with
    # that key returns the release it made, paid once.
    again = run("release", ds, "--mechanism", "laplace", "--epsilon", "0.4", "--param",
                "clip=true", "--idempotency-key", key)  # fmt: skip
    assert again["id"] == manifest["id"]
    assert [r["id"] for r in run("list-releases", ds)] == [manifest["id"]]
    assert ds in [d["id"] for d in run("list-datasets")]
    assert run("budget", ds)["epsilon_remaining"] == 0.6
    # Clients and grants without curl; the audit log keeps who a client is for.
    client = run("create-client", "--name", "publisher-cli")
    assert client["token"] and run("grant", ds, client["id"])["client_id"] == client["id"]
    client_common = ["--url", server.url, "--token", client["token"]]
    assert main(["label-party", "budget", ds, *client_common]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon_remaining"] == 0.6
    run("revoke-client", client["id"])
    assert main(["label-party", "budget", ds, *client_common]) == 2
    assert "unauthorized" in capsys.readouterr().err
    entries = server.client().get("/v1/audit", params={"limit": 1000}).json()["entries"]
    created = [e["payload"] for e in entries if e["action"] == "client.created"]
    assert {"client_id": client["id"], "role": "client", "name": "publisher-cli"} in created
    assert run("verify-audit")["ok"] is True
    assert (
        main(["label-party", "release", ds, "--mechanism", "laplace", "--epsilon", "0.7", *common])
        == 2
    )
    assert "budget_exceeded" in capsys.readouterr().err
    release = ["label-party", "release", ds, "--epsilon", "0.1", *common]
    assert main([*release, "--mechanism", "laplace", "--parts", " , "]) == 2
    assert "--parts names no part" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse names the choices
        main([*release, "--mechanism", "lapalce"])
    assert "invalid choice: 'lapalce'" in capsys.readouterr().err


def test_a_token_a_header_cannot_carry_is_refused_without_quoting_it(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token read from a file with Windows line endings (or with a non-ASCII
    letter) failed in httpx, whose message quoted the whole header, token and all
    (helper-73); surrounding whitespace is dropped as the services drop it."""
    assert main(["label-party", "list-datasets", "--url", server.url,
                 "--token", f"  {ADMIN_TOKEN}\r\n"]) == 0  # fmt: skip
    capsys.readouterr()
    for token in (f"{ADMIN_TOKEN}\r\nX-Evil: 1", f"{ADMIN_TOKEN}é"):
        assert main(["label-party", "list-datasets", "--url", server.url, "--token", token]) == 2
        err = capsys.readouterr().err
        assert "cannot carry" in err and ADMIN_TOKEN not in err, err


def test_training_commands(
    server: Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """create, list, watch and cancel; no worker runs, so trainings stay queued."""
    common = ["--url", server.url, "--token", ADMIN_TOKEN]

    def run(*argv: str) -> Any:
        assert main(["label-party", *argv, *common]) == 0
        return json.loads(capsys.readouterr().out)

    ds = run("create-dataset", "--name", "pro", "--task", "classification",
             "--domain", '{"num_classes": 2}', "--epsilon-budget", "5",
             "--delta-budget", "0.1")  # fmt: skip
    assert ds["delta_budget"] == 0.1
    ids = [f"e{i}" for i in range(20)]
    labels, features = tmp_path / "labels.parquet", tmp_path / "features.parquet"
    labels.write_bytes(parquet_bytes({"example_id": ids, "label": [i % 2 for i in range(20)]}))
    features.write_bytes(parquet_bytes({"example_id": ids, "x": [float(i) for i in range(20)]}))
    run("upload", ds["id"], str(labels))
    create = ("trainings", "create", "--dataset", ds["id"], "--features", str(features),
              "--epsilon", "1", "--architecture", "mlp", "--denoiser", "noop")  # fmt: skip
    first, second = run(*create), run(*create)
    listed = run("trainings", "list", "--dataset", ds["id"])
    assert {t["id"] for t in listed} == {first["id"], second["id"]}
    cancelled = run("trainings", "cancel", second["id"])
    assert cancelled["status"] == "cancelled"
    # A value given twice, or a key a JSON object names twice, is refused before
    # anything is sent: one would have overridden the other without a word.
    for spec, said in (('{"epsilon": 0.1}', "epsilon (--epsilon)"),
                       ('{"epochs": 1, "epochs": 9}', "'epochs' appears twice")):  # fmt: skip
        assert main(["label-party", *create, "--spec", spec, *common]) == 2
        assert said in capsys.readouterr().err
    twice = '{"num_classes": 2, "num_classes": 3}'
    assert main(["label-party", "create-dataset", "--name", "t", "--domain", twice,
                 "--epsilon-budget", "1", *common]) == 2  # fmt: skip
    assert "'num_classes' appears twice" in capsys.readouterr().err
    assert len(run("trainings", "list", "--dataset", ds["id"])) == 2

    # watch says once that nobody picks the training up, and ends when it does.
    monkeypatch.setattr(watching, "QUEUED_HINT_SECONDS", 0.0)
    timer = threading.Timer(1.0, lambda: server.client().delete(f"/v1/trainings/{first['id']}"))
    timer.start()
    try:
        code = main(["label-party", "trainings", "watch", first["id"], "--interval", "0.05",
                     *common])  # fmt: skip
    finally:
        timer.join()
    err = capsys.readouterr().err
    assert code == 1 and err.count("labeldp label-party worker") == 1
    assert err.rstrip().endswith("cancelled: cancelled by request")  # not "cancelled: None"
    assert run("budget", ds["id"])["epsilon_spent"] == 2


def test_serve_refuses_to_start_without_a_real_admin_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LABELDP_MODE", raising=False)
    monkeypatch.setenv("LABELDP_ADMIN_TOKEN", "changeme")
    assert main(["label-party", "serve", "--port", "1"]) == 2
    assert "LABELDP_ADMIN_TOKEN" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_worker_without_cuda_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It would claim paid-for trainings only to fail each of them.
    monkeypatch.setenv("LABELDP_MODE", "test")
    monkeypatch.setenv("LABELDP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LABELDP_TRAINING_DEVICE", "cuda")
    assert main(["label-party", "worker", "--once"]) == 2
    assert (
        "LABELDP_TRAINING_DEVICE=cuda but this worker has no CUDA device" in capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())  # no database was even created


def test_a_token_beginning_with_a_dash_is_its_value(
    make_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # secrets.token_urlsafe, which the docs suggest, starts one token in 64 so.
    token = "-Wq" + "k" * 29
    server = make_server().start(LABELDP_ADMIN_TOKEN=token)
    assert main(["label-party", "verify-audit", "--url", server.url, "--token", token]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    with pytest.raises(SystemExit) as missing:  # a forgotten token is still reported
        main(["label-party", "verify-audit", "--token", "--url", server.url])
    assert missing.value.code == 2
    assert "--token: expected one argument" in capsys.readouterr().err


def test_a_url_that_is_not_the_labels_party_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 404 page from some other server names the URL it came from."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{other.server_address[1]}"
        try:
            assert main(["label-party", "list-datasets", "--url", url, "--token", "t"]) == 2
        finally:
            other.shutdown()
    err = capsys.readouterr().err
    assert f"{url}/v1/datasets answered 404" in err and "is --url the labels party?" in err


def test_the_exit_status_says_whose_the_failure_is(
    make_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """2: the command must change (a 4xx refusal); 1: the service's (nothing answered,
    busy, 5xx), the same command may work later. Both were 2."""
    server = make_server().start()
    token = ["--url", server.url, "--token", ADMIN_TOKEN]
    assert main(["label-party", "budget", "no-such-dataset", *token]) == 2
    assert "not_found" in capsys.readouterr().err
    dead = ["--url", "http://127.0.0.1:9", "--token", ADMIN_TOKEN]
    assert main(["label-party", "budget", "no-such-dataset", *dead]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
    # A URL no request can go to is the command's to change (it was 1, "try later").
    for url in ("notaurl", "ftp://127.0.0.1:9"):
        assert main(["label-party", "budget", "d", "--url", url, "--token", ADMIN_TOKEN]) == 2
        assert "give http://… or https://…" in capsys.readouterr().err
    # A refusal's detail reads as written, not as JSON's \u escapes.
    create = ["label-party", "create-dataset", "--name", "k", "--epsilon-budget", "1", *token]
    assert main([*create, "--domain", '{"min": 0, "max": 1, "step": 0.3}']) == 2
    assert "(max − min) must be a whole number of steps" in capsys.readouterr().err
    # ε is spent or budgeted only if positive: 0 is a usage error, not the server's 422.
    with pytest.raises(SystemExit) as zero:
        main(["label-party", "create-dataset", "--name", "z", "--epsilon-budget", "0", *token,
              "--domain", '{"num_classes": 2}'])  # fmt: skip
    assert zero.value.code == 2 and "expected a finite number > 0" in capsys.readouterr().err
    assert [refusal(status, "").exit_status for status in (429, 500, 503, 409, 422)] == [
        1,
        1,
        1,
        2,
        2,
    ]
