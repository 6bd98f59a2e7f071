"""Training jobs: submit, read, cancel."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.config import Settings
from feature_party.errors import ConflictError, InvalidInputError, no_join
from feature_party.feature_sets import service as feature_sets
from feature_party.feature_sets.repository import FeatureSetRepository
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.schemas import JobAccepted, JobCreate, JobRead
from feature_party.jobs.status import Status
from feature_party.models.repository import ModelRepository
from feature_party.orm import FeatureSet, Job, Model, ReceivedLabels
from feature_party.received_labels.repository import ReceivedLabelsRepository
from feature_party.training.artifact import init_model_problem
from feature_party.training.config import TrainingConfig
from feature_party.training.dataset import count_join, release_classes
from feature_party.training.losses import debiasing_problem
from shared.pagination import Pager


def submit(session: Session, settings: Settings, body: JobCreate) -> JobAccepted:
    feature_set = FeatureSetRepository(session).get(body.feature_set_id)
    labels = ReceivedLabelsRepository(session).get(body.labels_id)
    if labels.feature_set_id != feature_set.id:
        matched, unmatched = count_join(
            settings.data_dir / feature_set.path, pq.read_table(settings.data_dir / labels.path)
        )
    else:
        matched, unmatched = labels.matched, labels.unmatched
    if matched == 0:
        raise no_join(
            "the received labels do not join the feature set on example_id",
            num_labels=labels.num_labels,
            num_features=feature_set.num_rows,
            matched=matched,
            unmatched=unmatched,
        )
    config = body.training()
    check_training(config, feature_set, matched)
    outputs = labels.manifest.get("mechanism", {}).get("outputs") or []
    if config.loss == "poisson" and config.task == "regression" and min(outputs, default=0) < 0:
        # The worker refused the labels only after the job was queued.
        raise InvalidInputError(
            "the poisson loss needs non-negative labels; this release's labels go down to "
            f"{min(outputs):g} (an unbiased release's may): use squared or absolute"
        )
    released_task = labels.manifest.get("task")
    if released_task is not None and released_task != config.task:
        raise InvalidInputError(
            f"the release holds {released_task} labels; this job's task is {config.task}",
            code="task_mismatch",
            detail={"release_task": released_task, "task": config.task},
        )
    if config.task == "classification":
        mechanism = labels.manifest.get("mechanism", {})
        if config.loss == "rr-debiased-cross-entropy" and (problem := debiasing_problem(mechanism)):
            raise InvalidInputError(problem)
        classes = release_classes(labels.manifest)
        if not (config.num_classes or classes):
            raise InvalidInputError("classification needs num_classes (the release does not say)")
        if config.num_classes and classes and len(classes) > config.num_classes:
            # The worker would refuse the labels only after the job was queued.
            raise InvalidInputError(
                f"num_classes {config.num_classes} is below the release's {len(classes)} classes",
                detail={"num_classes": config.num_classes, "release_classes": len(classes)},
            )
    if config.init_model_id is not None:
        _check_init_model(session, settings, config, feature_set, labels)
    job = JobRepository(session).add(
        Job(
            id=uuid.uuid4().hex,
            status=Status.QUEUED,
            feature_set_id=feature_set.id,
            labels_id=labels.id,
            config=config.model_dump(mode="json"),
            attempts=0,
            gpus=config.gpus,
        )
    )
    return JobAccepted(id=job.id, status=Status(job.status))


def _check_init_model(
    session: Session,
    settings: Settings,
    config: TrainingConfig,
    feature_set: FeatureSet,
    labels: ReceivedLabels,
) -> None:
    """The init model must have the job's task, columns, architecture and outputs
    (422; 404 for an unknown model)."""
    assert config.init_model_id is not None
    model = ModelRepository(session).get(config.init_model_id)
    if model.task != config.task:
        raise InvalidInputError(
            f"init_model_id {model.id} is a {model.task} model; this job's task is {config.task}",
            detail={"init_model_task": model.task, "task": config.task},
        )
    outputs = 1
    if config.task == "classification":
        outputs = config.num_classes or len(release_classes(labels.manifest))
    found = init_model_problem(
        settings.data_dir / model.path, config, feature_sets.roles_of(feature_set), outputs
    )
    if found is not None:
        problem, detail = found
        raise InvalidInputError(
            f"init_model_id {model.id} cannot start this job: {problem}",
            code="init_model_mismatch",
            detail=detail,
        )


def check_training(config: TrainingConfig, feature_set: FeatureSet, num_examples: int) -> None:
    """Refuse a training ``feature_set`` cannot feed, or whose validation split
    leaves none of ``num_examples`` to train on (422): what is known before any
    label arrives, so an LP-MST run checks it before its first release spends ε."""
    roles = feature_set.roles or {}
    problem = config.input_problem(len(roles.get("numeric", [])), len(roles.get("categorical", [])))
    if problem:
        raise InvalidInputError(problem)
    if num_examples - round(num_examples * config.validation_fraction) < 1:
        raise InvalidInputError(
            f"validation_fraction {config.validation_fraction:g} of the {num_examples} "
            "joined examples leaves none to train on"
        )


def get(session: Session, job_id: str) -> JobRead:
    return to_read(session, JobRepository(session).get(job_id))


def list_page(
    session: Session, pager: Pager, *, status: Status | None, feature_set_id: str | None
) -> list[JobRead]:
    query = select(Job)
    if feature_set_id is not None:
        query = query.where(Job.feature_set_id == feature_set_id)
    scope = query  # a job leaves a status list as it runs: its id stays a cursor
    if status is not None:
        query = query.where(Job.status == status)
    return [to_read(session, job) for job in pager.rows(session, query, Job, scope)]


def cancel(session: Session, job_id: str) -> JobRead:
    repo = JobRepository(session)
    job = repo.get(job_id)
    if not repo.cancel(job_id):
        raise ConflictError(
            f"job {job_id} is already {job.status}",
            code="job_finished",
            detail={"status": job.status},
        )
    session.refresh(job)
    return to_read(session, job)


def to_read(session: Session, job: Job) -> JobRead:
    return JobRead(
        id=job.id,
        status=Status(job.status),
        feature_set_id=job.feature_set_id,
        labels_id=job.labels_id,
        config=job.config,
        progress=job.progress,
        metrics=job.metrics,
        model_id=job.model_id,
        error=job.error,
        attempts=job.attempts,
        gpus=job.gpus,
        lease_expires_at=job.lease_expires_at,
        stalled=JobRepository(session).stalled(job),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def sweep_finished(session: Session, data_dir: Path) -> int:
    """Delete what jobs that never run again (final) left behind: checkpoints,
    partial writes and multi-GPU run files, which a worker that died, or left a job
    to its lease when the disk was full and saw it cancelled, could not; and model
    files no model row names (a worker killed between writing its model and
    recording it). Registered models stay. Run at start-up and by idle workers;
    returns the number of paths removed."""
    jobs_dir = data_dir / "jobs"
    if not jobs_dir.is_dir():
        return 0
    final = [s.value for s in Status if s.is_final]
    finished = set(session.scalars(select(Job.id).where(Job.status.in_(final))))
    registered = set(session.scalars(select(Model.path).where(Model.job_id.is_not(None))))
    removed = 0
    for job_dir in (d for d in jobs_dir.iterdir() if d.name in finished):
        orphans = [
            p for p in job_dir.glob("model-*.pt") if str(p.relative_to(data_dir)) not in registered
        ]
        for path in [job_dir / "checkpoint.pt", *job_dir.glob(".*.partial"), *orphans]:
            if path.is_file():
                path.unlink(missing_ok=True)
                removed += 1
        for run_dir in (d for d in job_dir.glob("run*") if d.is_dir()):  # a claim's own
            shutil.rmtree(run_dir, ignore_errors=True)
            removed += 1
    return removed
