"""``create_*`` helpers for the integration tests (objects made over the real API)."""

from __future__ import annotations

import io
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq


def create_dataset(
    admin: httpx.Client,
    *,
    task: str = "regression",
    domain: dict[str, Any] | None = None,
    epsilon_budget: float | str = 1.0,
    name: str = "ds",
) -> str:
    domain = domain or {"min": 0, "max": 10, "grid_size": 11}
    r = admin.post(
        "/v1/datasets",
        json={"name": name, "task": task, "label_domain": domain, "epsilon_budget": epsilon_budget},
    )
    assert r.status_code == 201, r.text
    dataset_id: str = r.json()["id"]
    return dataset_id


def parquet_bytes(columns: dict[str, list[Any]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def upload_labels(
    admin: httpx.Client, dataset_id: str, ids: list[str], labels: list[Any]
) -> httpx.Response:
    body = parquet_bytes({"example_id": ids, "label": labels})
    return admin.post(f"/v1/datasets/{dataset_id}/labels", files={"file": ("labels.parquet", body)})


def create_client(admin: httpx.Client, role: str = "client", name: str = "c") -> tuple[str, str]:
    r = admin.post("/v1/clients", json={"name": name, "role": role})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["token"]


def release(
    client: httpx.Client, dataset_id: str, epsilon: float | str = 0.1, **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {"mechanism": {"name": "laplace"}, "epsilon": epsilon, **extra}
    return client.post(f"/v1/datasets/{dataset_id}/releases", json=body)
