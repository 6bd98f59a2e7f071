"""The labels-party worker: claims queued trainings and runs LabelDP-Pro.

``labeldp label-party worker`` runs this loop against the service's database
(the shared lease queue, :mod:`shared.lease_queue`: ``FOR UPDATE SKIP LOCKED`` on
Postgres, one worker on SQLite). For each training it

1. joins the stored public features with the private labels by ``example_id``
   (one Arrow hash join, no per-row Python);
2. standardizes each feature column with its mean and standard deviation over
   the *features file* — public statistics, no label involved — which become the
   artifact's preprocessing, so prediction transforms rows exactly the same way;
3. builds ``shared.torch_models.ImageCNN`` (``labeldp-pro.txt`` Table 10a) or
   ``TabularMLP`` and calls :func:`label_party.labeldp_pro.train_labeldp_pro`
   on CUDA when the worker has it (``LABELDP_TRAINING_DEVICE``);
4. checks that the trainer ran the noise plan (q, T, σ) computed when the
   training was accepted (``spec["plan"]``, :mod:`label_party.trainings.plan`)
   and that its accounted (ε, δ) is within the charge — otherwise the training
   fails and no model is released;
5. writes the ``labeldp-model/1`` artifact (:mod:`shared.artifact`) named by its
   SHA-256 and marks the training succeeded, with an audit entry, in one
   transaction guarded on the lease (a worker that lost its lease writes nothing).

A heartbeat thread renews the lease and publishes progress; a training that is
cancelled, or taken over after this worker stalled, stops where it is, within a
step's projection or between its physical batches, not only between steps.
Nothing is refunded when a training fails (see :mod:`label_party.trainings.service`),
so storage refusing a write (a full disk, ``shared.errors.STORAGE_ERRNOS``) does not
fail it: the worker gives back the claim's attempt and leaves the training to its
lease's expiry, and a worker claims it again, for as long as the disk stays full.
A running training saves a checkpoint (model, optimizer, epoch history) about 20
times under ``trainings/checkpoints/<id>.pt``; one given back to the queue
(SIGTERM, a dead worker) goes on from its last checkpoint with fresh noise for
the remaining steps, or from scratch if there is none. Either way only the one
model that succeeds is released, from one run of the plan's T steps: each
checkpoint is a post-processing of the noisy gradients before it, so the charge
covers it. The checkpoint is deleted when the training succeeds or fails.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from label_party.audit import service as audit
from label_party.config import Settings
from label_party.datasets.domain import parse_domain
from label_party.db import Database, transaction
from label_party.models import Dataset, Training
from label_party.storage import (
    labels_path,
    set_aside,
    training_checkpoint_path,
    training_features_path,
    training_model_path,
    training_models_dir,
    training_tmp_dir,
)
from label_party.trainings import repository
from label_party.trainings.plan import check_ran_as_planned
from shared.errors import disk_full
from shared.lease_queue import Status
from shared.logging import exception_fields
from shared.parquet import publish_by_hash, temp_path
from shared.worker_loop import PollingWorker, left_to_retry

log = logging.getLogger("label_party.trainings.worker")

#: A training whose worker died this many times fails instead of looping.
MAX_ATTEMPTS = 3


class TrainingInterruptedError(Exception):
    """Training stopped: cancelled, taken over, or the worker is shutting down."""


@dataclass
class _Shared:
    """What the training thread and the heartbeat thread share."""

    progress: dict[str, Any] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    lost: bool = False


@dataclass
class Prepared:
    """A training's inputs: standardized features, labels, and the public statistics."""

    features: np.ndarray
    labels: np.ndarray
    columns: list[str]
    means: list[float]
    stds: list[float]
    num_classes: int


def prepare(features: pa.Table, labels: pa.Table, num_classes: int) -> Prepared:
    """Join by ``example_id`` and standardize with statistics of ``features`` alone."""
    columns = [c for c in features.column_names if c != "example_id"]
    means, stds = [], []
    for name in columns:
        values = np.asarray(pc.fill_null(features.column(name), np.nan).to_numpy(), np.float64)
        finite = values[np.isfinite(values)]
        std = float(finite.std()) if finite.size else 1.0
        means.append(float(finite.mean()) if finite.size else 0.0)
        stds.append(std if std > 1e-12 else 1.0)
    labels = labels.select(["example_id", "label"]).cast(
        pa.schema([("example_id", pa.string()), ("label", pa.float64())])
    )
    joined = features.join(labels, keys="example_id", join_type="inner")
    matrix = np.column_stack(
        [np.asarray(pc.fill_null(joined.column(c), np.nan).to_numpy(), np.float64) for c in columns]
    )
    scaled = (matrix - np.asarray(means)) / np.asarray(stds)
    x = np.nan_to_num(scaled, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
    y = np.asarray(joined.column("label").to_numpy(), np.float64).astype(np.int64)
    return Prepared(x, y, columns, means, stds, num_classes)


def public_error(exc: Exception) -> str:
    """The error a training's readers see. Our own checks of public inputs raise
    ``ValueError`` with messages written to name the problem only (DESIGN.md
    §3.1); a ``ValueError`` raised inside numpy or torch may quote the data it
    choked on, a label included, so only errors raised in this project's code show
    their text. Anything else shows its type (the worker's log adds where)."""
    if isinstance(exc, ValueError) and _raised_here(exc):
        return f"{exc}"
    return f"{type(exc).__name__} in the worker (see the worker's log)"


#: The project's packages, whose messages are written to be label-free.
_OWN_CODE = tuple(
    f"{Path(__file__).resolve().parents[2] / package}/" for package in ("label_party", "shared")
)


def _raised_here(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(
        _OWN_CODE
    )


def seed_in_test_mode(test_seed: int | None, training_id: str) -> int | None:
    """Test mode's seed for one training: ``LABELDP_TEST_SEED`` and the training's
    id, so that two trainings do not draw the same noise (each used the setting
    alone; helper-76). None outside test mode: fresh OS bits (DESIGN.md §3.5)."""
    if test_seed is None:
        return None
    digest = hashlib.sha256(f"{test_seed}:{training_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # torch takes seeds below 2⁶³


def resolve_device(setting: str) -> str:
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("LABELDP_TRAINING_DEVICE=cuda but this worker has no CUDA device")
    return setting


class Worker(PollingWorker):
    def __init__(
        self, database: Database, settings: Settings, *, worker_id: str | None = None
    ) -> None:
        super().__init__(worker_id=worker_id, poll_seconds=settings.worker_poll_seconds)
        self.db = database
        self.settings = settings

    def run_item(self, item_id: str) -> None:
        self.run_training(item_id)

    def claim(self) -> str | None:
        try:
            with transaction(self.db.writer) as session:
                queue = repository.queue(session)
                exhausted = queue.fail_exhausted(max_attempts=MAX_ATTEMPTS)
                for training_id in exhausted:  # auditors see every end of a training
                    self._audit(session, training_id, "training.failed", {"exhausted": True})
                row = queue.claim(
                    worker_id=self.worker_id,
                    lease_seconds=self.settings.worker_lease_seconds,
                    max_attempts=MAX_ATTEMPTS,
                )
            for training_id in exhausted:  # committed: it never resumes
                training_checkpoint_path(self.settings, training_id).unlink(missing_ok=True)
            return row.id if row is not None else None
        except Exception:  # a busy SQLite, a Postgres failover: try again next poll
            log.exception("claiming a training failed")
            return None

    # -- one training -------------------------------------------------------------------

    def _load(self, training_id: str) -> tuple[dict[str, Any], Prepared]:
        with transaction(self.db.reader) as session:
            training = session.get(Training, training_id)
            assert training is not None
            dataset = session.get(Dataset, training.dataset_id)
            assert dataset is not None
            spec = dict(training.spec)
            accepted_n = training.num_examples
            features_file = training_features_path(self.settings, training.features_sha256)
            labels_file = labels_path(self.settings, dataset)
            num_classes = parse_domain(dataset.task, dataset.label_domain).size
        prepared = prepare(pq.read_table(features_file), pq.read_table(labels_file), num_classes)
        if prepared.labels.shape[0] != accepted_n:
            # The plan (q = B/n, T) was calibrated for the examples covered at
            # acceptance; labels re-uploaded since would train another plan.
            raise ValueError(
                "the labelled examples these features cover changed after the training "
                "was accepted (the labels were replaced); nothing was trained"
            )
        return spec, prepared

    def run_training(self, training_id: str) -> None:
        shared = _Shared()
        beat = threading.Thread(target=self._heartbeat, args=(training_id, shared), daemon=True)
        beat.start()
        log.info("training %s: started", training_id)
        try:
            spec, prepared = self._load(training_id)
            artifact, accounting, metrics = self._train(training_id, spec, prepared, shared)
        except TrainingInterruptedError:
            shared.stop.set()
            beat.join()
            self._after_interrupt(training_id, lost=shared.lost)
            return
        except Exception as exc:
            shared.stop.set()
            beat.join()
            if left_to_retry(exc, {"training_id": training_id}):
                self._forgive(training_id, exc)  # paid for: a full disk must not fail it
                return
            # The type and place only: the text may quote a label (DESIGN.md §3.1).
            log.error(
                "training failed",
                extra={"fields": {"training_id": training_id, **exception_fields(exc)}},
            )
            self._finish_failed(training_id, public_error(exc))
            self._drop_checkpoint_if_final(training_id)
            return
        shared.stop.set()
        beat.join()
        try:
            self._record_success(training_id, artifact, accounting, metrics, shared.progress)
        except (OSError, DBAPIError) as exc:  # the model's file, or its row
            if left_to_retry(exc, {"training_id": training_id}):
                self._forgive(training_id, exc)
                return
            raise
        self._drop_checkpoint_if_final(training_id)

    def _drop_checkpoint_if_final(self, training_id: str) -> None:
        """A finished training (ours, or cancelled meanwhile) never resumes, so its
        checkpoint goes; one that another worker took over after our lease ran out
        keeps it: that worker goes on from it."""
        with transaction(self.db.writer) as session:
            training = session.get(Training, training_id)
            finished = training is None or Status(training.status).is_final
        if finished:
            training_checkpoint_path(self.settings, training_id).unlink(missing_ok=True)

    def _train(
        self, training_id: str, spec: dict[str, Any], data: Prepared, shared: _Shared
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        from label_party.trainings import training  # torch: only in the worker

        device = resolve_device(self.settings.training_device)

        def poll() -> None:  # many times a step: within a long projection too
            if shared.stop.is_set() or self.shutdown.is_set():
                raise TrainingInterruptedError("stop requested")

        def report(progress: dict[str, Any]) -> None:
            shared.progress = progress
            poll()

        started = time.perf_counter()
        result = training.train(
            spec,
            data,
            device=device,
            report=report,
            seed=seed_in_test_mode(self.settings.test_seed, training_id),
            checkpoint_file=training_checkpoint_path(self.settings, training_id),
            poll=poll,
        )
        metrics = {
            "seconds": time.perf_counter() - started,
            "device": device,
            "num_examples": int(data.features.shape[0]),
            "history": [asdict(h) for h in result.history],
        }
        accounting = result.accounting.to_dict()
        if accounting["epsilon"] > spec["epsilon"] or accounting["delta"] > spec["delta"]:
            # Never release a model whose accounted (ε, δ) exceeds what was charged.
            raise RuntimeError("the accountant's (ε, δ) exceeds the reserved budget")
        if "plan" in spec:  # trainings accepted before plans were stored have none
            check_ran_as_planned(spec["plan"], accounting)
        artifact = training.artifact(spec, data, result, metrics)
        return artifact, accounting, metrics

    def _heartbeat(self, training_id: str, shared: _Shared) -> None:
        while not shared.stop.wait(self.settings.worker_heartbeat_seconds):
            try:
                with transaction(self.db.writer) as session:
                    ours = repository.queue(session).heartbeat(
                        training_id,
                        self.worker_id,
                        lease_seconds=self.settings.worker_lease_seconds,
                        progress=shared.progress,
                    )
            except Exception:
                log.exception("heartbeat failed for training %s", training_id)
                continue
            if not ours:
                log.warning("training %s is no longer ours (cancelled or re-claimed)", training_id)
                shared.lost = True
                shared.stop.set()

    def _after_interrupt(self, training_id: str, *, lost: bool) -> None:
        if lost:  # cancelled, or re-claimed by another worker
            self._drop_checkpoint_if_final(training_id)
            return
        with transaction(self.db.writer) as session:
            repository.queue(session).release(training_id, self.worker_id)
        log.info("training %s: given back to the queue", training_id)

    def _forgive(self, training_id: str, exc: BaseException) -> None:
        """Give the attempt back when the disk is full (``shared.errors.disk_full``);
        a database too full to take even that leaves the attempt counted."""
        if not disk_full(exc):
            return
        try:
            with transaction(self.db.writer) as session:
                repository.queue(session).forgive(training_id, self.worker_id)
        except DBAPIError:
            log.exception("could not give training %s its attempt back", training_id)

    def _finish_failed(self, training_id: str, error: str) -> bool:
        """Mark the training failed; False if it is no longer this worker's."""
        with transaction(self.db.writer) as session:
            ok = repository.queue(session).fail(training_id, self.worker_id, error=error)
            if ok:
                self._audit(session, training_id, "training.failed", {})
        return ok

    def _record_success(
        self,
        training_id: str,
        artifact: dict[str, Any],
        accounting: dict[str, Any],
        metrics: dict[str, Any],
        progress: dict[str, Any] | None,
    ) -> bool:
        """Publish the model and mark the training succeeded; False if it is no longer
        this worker's (the result is dropped)."""
        from shared.artifact import save_artifact_file

        tmp = temp_path(training_tmp_dir(self.settings), ".pt")
        try:
            save_artifact_file(tmp, artifact)
            _final, sha = publish_by_hash(tmp, training_models_dir(self.settings), ".pt")
        finally:
            tmp.unlink(missing_ok=True)
        with transaction(self.db.writer) as session:
            ok = repository.queue(session).succeed(
                training_id,
                self.worker_id,
                model_sha256=sha,
                accounting=accounting,
                metrics=metrics,
                progress=progress,
            )
            if ok:
                self._audit(
                    session, training_id, "training.succeeded", {"sha256": sha, **accounting}
                )
        if ok:
            log.info("training %s: succeeded, model %s", training_id, sha)
        else:
            log.warning("training %s finished but is no longer ours; result dropped", training_id)
            self._set_aside_unless_named(sha)
        return ok

    def _set_aside_unless_named(self, sha: str) -> None:
        """The model of a dropped result goes to ``orphans/`` now, not at the next
        server start's sweep, unless a training names the same bytes."""
        with transaction(self.db.reader) as session:
            named = session.scalar(select(Training.id).where(Training.model_sha256 == sha))
        if named is None:
            set_aside(self.settings, training_model_path(self.settings, sha))

    def _audit(self, session: Any, training_id: str, action: str, payload: dict[str, Any]) -> None:
        training = session.get(Training, training_id)
        audit.append(
            session,
            actor="worker",
            action=action,
            dataset_id=training.dataset_id if training else None,
            payload={"training_id": training_id, "worker_id": self.worker_id, **payload},
        )
