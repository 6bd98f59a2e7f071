"""Datasets: creation with a declared domain and budget, lookup, listing."""

from __future__ import annotations

import uuid

from pydantic import ValidationError
from sqlalchemy.orm import Session

from label_party.audit import service as audit
from label_party.auth import Principal
from label_party.datasets import repository
from label_party.datasets.domain import RegressionDomain, parse_domain
from label_party.datasets.schemas import DatasetCreate, DatasetRead
from label_party.exceptions import InvalidRequestError
from label_party.ledger.units import delta_decimal, delta_units, epsilon_decimal, epsilon_units
from label_party.mechanisms.lattice import LATTICE_STEPS, MIN_LATTICE_STEP
from label_party.models import Dataset
from label_party.partitions.service import get_plan


def create(
    session: Session, principal: Principal, body: DatasetCreate, *, max_grid: int
) -> Dataset:
    try:
        domain = parse_domain(body.task, body.label_domain)
    except ValidationError as exc:
        detail = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        raise InvalidRequestError("the label domain is not valid", detail) from None
    if isinstance(domain, RegressionDomain) and not (
        (domain.max - domain.min) / LATTICE_STEPS >= MIN_LATTICE_STEP
    ):
        # Refused for new datasets only: a stored one still reads, and its
        # additive releases are refused by the mechanisms (free).
        raise InvalidRequestError(
            f"the label domain is narrower than the mechanisms randomize on: max − min "
            f"must be at least {MIN_LATTICE_STEP * LATTICE_STEPS:.3g}"
        )
    if domain.size > max_grid:
        what = "classes" if body.task == "classification" else "grid points"
        raise InvalidRequestError(
            f"the label domain has {domain.size} {what}; this service takes at most "
            f"{max_grid} (LABELDP_MAX_GRID_SIZE)"
        )
    dataset = Dataset(
        id=str(uuid.uuid4()),
        name=body.name,
        task=body.task,
        label_domain=domain.model_dump(exclude_none=True),
        epsilon_budget=epsilon_units(body.epsilon_budget),
        delta_budget=delta_units(body.delta_budget),
        created_by=principal.id,
    )
    session.add(dataset)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="dataset.created",
        dataset_id=dataset.id,
        payload={
            "name": dataset.name,
            "task": dataset.task,
            "label_domain": dataset.label_domain,
            "epsilon_budget_units": dataset.epsilon_budget,
            "delta_budget_units": dataset.delta_budget,
        },
    )
    return dataset


def list_visible(session: Session, principal: Principal) -> list[Dataset]:
    granted_to = principal.id if principal.role == "client" else None
    return repository.list_all(session, granted_to=granted_to)


def to_read(session: Session, dataset: Dataset) -> DatasetRead:
    plan = get_plan(session, dataset.id)
    return DatasetRead(
        id=dataset.id,
        name=dataset.name,
        task=dataset.task,  # type: ignore[arg-type]
        label_domain=dataset.label_domain,
        epsilon_budget=epsilon_decimal(dataset.epsilon_budget),
        delta_budget=delta_decimal(dataset.delta_budget),
        num_labels=dataset.num_labels,
        parts=None if plan is None else sorted(plan.parts),
        created_at=dataset.created_at,
    )
