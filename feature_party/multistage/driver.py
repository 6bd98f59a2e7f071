"""The LP-MST driver: one thread per run, in the features-party service.

``rr-with-prior-lp-mst.txt`` Algorithm 3 across the two parties. The examples of
the feature set are split at random — from the seed, never from labels — into T
parts, registered at the labels party as the dataset's partition plan. Stage 1
releases ``rr`` on part 1 and trains; stage t computes the priors of part t with
the model of stage t−1 (softmax at a temperature), uploads them as a prior set,
releases ``rr-with-prior`` (``prior_source: example``) on part t, and trains on
every label received so far, starting from the weights of stage t−1, with the
earlier stages' labels outside the model's top-k* dropped (supplement, Appendix
B). Each part is charged once by the labels party's per-part ledger, so the
whole run spends ε per example, not T·ε.

Every step records its result in the run's ``state`` before the next begins, so
a run resumes where it stopped. Releases carry the idempotency key
``lpmst-<run>-<stage>`` — a resumed run replays its release instead of paying
twice — and a stage's prior set is uploaded before its release and reused after
(a new one would change the request and conflict with the key). Training goes
through the job queue, so the workers (and their GPUs) do it; the driver only
waits. The labels-party token lives in this thread's memory only.
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import SecretStr
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from feature_party.client import LabelsPartyClient, LabelsPartyError, LabelsPartyHTTPError
from feature_party.config import Settings
from feature_party.db import Database, get_for_update
from feature_party.errors import FeaturePartyError
from feature_party.jobs import service as jobs
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.schemas import JobCreate
from feature_party.jobs.status import Status
from feature_party.models.repository import ModelRepository
from feature_party.multistage.schemas import RunStatus
from feature_party.multistage.topk import in_top_k
from feature_party.orm import FeatureSet, MultistageRun, ReceivedLabels
from feature_party.received_labels import service as received
from feature_party.received_labels.schemas import ReceivedLabelsCreate
from feature_party.training.artifact import Predictor, load_artifact
from feature_party.training.config import TrainingConfig
from shared.parquet import publish
from shared.protocol import MechanismChoice, ReleaseCreate
from shared.timestamps import utcnow

log = logging.getLogger("labeldp.feature_party.multistage")


class RunFailedError(Exception):
    """A step failed for a reason the user must see (the run's ``error``)."""


class _Stopped(Exception):  # noqa: N818 - control flow: the service is stopping
    pass


class _Superseded(Exception):  # noqa: N818 - control flow: the run is not ours any more
    """Another driver took the run (resumed elsewhere), or it was cancelled."""


@dataclass
class Driver:
    database: Database
    settings: Settings
    run_id: str
    token: str
    stop: threading.Event
    #: This launch's mark in the run's ``state["driver"]``: a driver whose run was
    #: resumed by another (after a stop marked it interrupted) writes nothing more.
    launch: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Set when the run starts: its row (detached), public configuration, the
    # labels-party client and the dataset's number of classes.
    run: MultistageRun = field(init=False)
    config: dict[str, Any] = field(init=False)
    client: LabelsPartyClient = field(init=False)
    num_classes: int = field(init=False)

    # -- the run ----------------------------------------------------------------------

    def __call__(self) -> None:
        try:
            self._run()
        except _Superseded:
            log.warning("multistage run %s: cancelled or resumed elsewhere; stopping", self.run_id)
        except _Stopped:
            self._finish(RunStatus.INTERRUPTED, "the service stopped; resume with the token")
        except Exception as exc:
            why = _describe(exc)
            if self.stop.is_set():
                # A step that fails while the service stops may fail because of the
                # stop (its connections closing): a resume tries it again.
                self._finish(
                    RunStatus.INTERRUPTED,
                    f"the service stopped during a step ({why}); resume with the token",
                )
            else:
                if not isinstance(exc, RunFailedError):
                    log.exception("multistage run %s failed", self.run_id)
                self._finish(RunStatus.FAILED, why)

    def _run(self) -> None:
        self.run = self._load()
        self.config, state = dict(self.run.config), dict(self.run.state)
        self._save(state, take_over=True)
        self.client = received.make_client(self.settings, self.run.labels_party_url, self.token)
        with self.client:
            self.num_classes = _num_classes(self.client, self.run.dataset_id)
            if state.get("partition_plan_id") is None:
                state = self._partition(state)
            for t in range(1, int(self.config["stages"]) + 1):
                self._stage(state, t)
        last = state["stages"][-1]
        self._save(state, status=RunStatus.SUCCEEDED, finished=True, model_id=last["model_id"])
        log.info("multistage run %s succeeded: model %s", self.run_id, last["model_id"])

    def _stage(self, state: dict[str, Any], t: int) -> None:
        """Stage t's steps that have not run yet, each saved before the next."""
        steps: list[tuple[str, Callable[[dict[str, Any], int], dict[str, Any]]]] = [
            ("prior_set_id", self._priors),
            ("received_labels_id", self._release),
            ("training_labels_id", self._training_labels),
            ("model_id", self._train),
        ]
        stage = state["stages"][t - 1]
        for key, step in steps:
            if stage.get(key) is None and not (key == "prior_set_id" and t == 1):
                self._check_stop()
                stage.update(step(state, t))
                self._save(state)

    # -- steps ------------------------------------------------------------------------

    def _partition(self, state: dict[str, Any]) -> dict[str, Any]:
        config = self.config
        ids, parts = assign_parts(
            self._feature_ids(),
            config["fractions"],
            seed=int(config["seed"]),
            prefix=config["part_prefix"],
        )
        table = pa.table({"example_id": pa.array(ids, pa.string()), "part": parts})
        path = self._run_dir() / "parts.parquet"
        pq.write_table(table, path)
        sizes = dict(zip(*np.unique(parts, return_counts=True), strict=True))
        plan = _register_plan(self.client, self.run.dataset_id, path)
        stages = [
            {
                "stage": t,
                "part": f"{config['part_prefix']}-{t}",
                "num_examples": int(sizes.get(f"{config['part_prefix']}-{t}", 0)),
            }
            for t in range(1, int(config["stages"]) + 1)
        ]
        state = {"partition_plan_id": plan["id"], "stages": stages}
        self._save(state)
        return state

    def _priors(self, state: dict[str, Any], t: int) -> dict[str, Any]:
        previous = self._predictor(state["stages"][t - 2]["model_id"])
        ids = self._part_ids(state["stages"][t - 1]["part"])
        probs = previous.probabilities(self._features(ids), temperature=self.config["temperature"])
        body = _parquet(
            {
                "example_id": pa.array(ids, pa.string()),
                "prior": pa.array(list(probs), pa.list_(pa.float64())),
            }
        )
        try:
            prior = self.client.upload_priors(self.run.dataset_id, body, kind="probabilities")
        except LabelsPartyError as exc:
            raise RunFailedError(f"stage {t}: uploading the priors failed: {exc}") from None
        return {"prior_set_id": prior.id}

    def _release(self, state: dict[str, Any], t: int) -> dict[str, Any]:
        run, stage = self.run, state["stages"][t - 1]
        mechanism: dict[str, Any] = {"name": "rr"}
        if t > 1:
            mechanism = {
                "name": "rr-with-prior",
                "prior_source": "example",
                "prior_id": stage["prior_set_id"],
            }
        request = ReceivedLabelsCreate(
            feature_set_id=run.feature_set_id,
            labels_party_url=run.labels_party_url,
            token=SecretStr(self.token),
            dataset_id=run.dataset_id,
            release=ReleaseCreate(
                mechanism=MechanismChoice(**mechanism),
                epsilon=self.config["epsilon"],
                parts=[stage["part"]],
                idempotency_key=f"lpmst-{run.id}-{t}",
            ),
        )
        # A cancel committed since this step began (on another replica, whose wake
        # never reaches this driver) must not be followed by a spend.
        self._heartbeat()
        try:
            with self.database.session() as session:
                got, _created = received.receive(session, self.settings, request)
        except FeaturePartyError as exc:
            raise RunFailedError(f"stage {t}: the release failed: {exc}") from None
        counts = got.manifest.get("mechanism", {}).get("params", {}).get("k_star_counts")
        mean_k = None
        if counts:
            total = sum(counts.values())
            mean_k = sum(int(k) * c for k, c in counts.items()) / total if total else None
        return {"release_id": got.release_id, "received_labels_id": got.id, "mean_k_star": mean_k}

    def _training_labels(self, state: dict[str, Any], t: int) -> dict[str, Any]:
        stages = state["stages"][:t]
        if t == 1:
            row = self._received(stages[0]["received_labels_id"])
            return {
                "training_labels_id": row.id,
                "num_training_labels": row.num_labels,
                "num_filtered": 0,
            }
        tables = [self._received_table(s["received_labels_id"]) for s in stages]
        earlier = pa.concat_tables(tables[:-1])
        filtered = 0
        if self.config["filter_top_k"]:
            earlier, filtered = self._filter(state, t, earlier)
        labels = pa.concat_tables([earlier, tables[-1]])
        return self._store_labels(state, t, labels, filtered)

    def _filter(self, state: dict[str, Any], t: int, earlier: pa.Table) -> tuple[pa.Table, int]:
        """Drop the earlier stages' labels outside the top-k* of the model of stage
        t−1 (supplement, Appendix B)."""
        previous = self._predictor(state["stages"][t - 2]["model_id"])
        ids = pc.cast(earlier.column("example_id"), pa.string())
        features = self._features(ids.to_pylist())
        probs = previous.probabilities(features, temperature=self.config["temperature"])
        labels = np.asarray(earlier.column("label").to_numpy(), dtype=np.int64)
        keep = in_top_k(probs, labels, float(self.config["epsilon"]))
        return earlier.filter(pa.array(keep)), int((~keep).sum())

    def _store_labels(
        self, state: dict[str, Any], t: int, labels: pa.Table, filtered: int
    ) -> dict[str, Any]:
        """The stage's training labels as a received-labels row of its own (a
        derived set: the union of the stages' releases, filtered), recorded in the
        run's state in the same transaction; the stage's fields."""
        body = _parquet(
            {
                "example_id": pc.cast(labels.column("example_id"), pa.string()),
                "label": pc.cast(labels.column("label"), pa.float64()),
            }
        )
        sha = _sha256(body)
        relative = Path("received") / f"{sha}.parquet"
        final = self.settings.data_dir / relative
        final.parent.mkdir(parents=True, exist_ok=True)
        # A resumed run may write the same bytes again: never truncate, in place, the
        # file a committed row already names (a crash mid-write would corrupt it).
        tmp = final.with_name(f".{sha}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_bytes(body)
            publish(tmp, final)  # durable before its row commits
        finally:
            tmp.unlink(missing_ok=True)
        run, epsilon = self.run, self.config["epsilon"]
        releases = [s["release_id"] for s in state["stages"][:t]]
        first = self._received(state["stages"][0]["received_labels_id"])
        outputs = first.manifest.get("mechanism", {}).get("outputs")
        manifest = {
            "derived": "lp-mst",
            "task": "classification",
            "run_id": run.id,
            "stage": t,
            "releases": releases,
            "epsilon": epsilon,
            "mechanism": {"name": "lp-mst", "epsilon": epsilon, "outputs": outputs},
        }
        row = ReceivedLabels(
            id=uuid.uuid4().hex,
            feature_set_id=run.feature_set_id,
            labels_party_url=run.labels_party_url,
            dataset_id=run.dataset_id,
            # The stage's own release; ``manifest.releases`` lists all it joins (their
            # ids side by side outgrow the column from stage 6 on).
            release_id=releases[-1],
            manifest=manifest,
            sha256=sha,
            path=str(relative),
            num_labels=labels.num_rows,
            matched=labels.num_rows,
            unmatched=0,
        )
        update = {
            "training_labels_id": row.id,
            "num_training_labels": row.num_labels,
            "num_filtered": filtered,
        }
        # The row and the run's record of it commit together, the run locked first,
        # as a stage's job does: apart, a crash between them left a derived set that
        # no run named, and the resume made another.
        with self.database.session() as session:
            self._own(session)
            session.add(row)
            state["stages"][t - 1].update(update)
            self._record(session, state)
        return update

    def _train(self, state: dict[str, Any], t: int) -> dict[str, Any]:
        run, stage = self.run, state["stages"][t - 1]
        if stage.get("job_id") is None:
            training = TrainingConfig.model_validate(self.config["training"])
            init = state["stages"][t - 2]["model_id"] if t > 1 else None
            body = JobCreate(
                feature_set_id=run.feature_set_id,
                labels_id=stage["training_labels_id"],
                **{**training.model_dump(), "num_classes": self.num_classes, "init_model_id": init},
            )
            # The job and the run's record of it commit together, the run locked
            # first. Apart, a cancel between them found no job to cancel (it trained
            # unowned), and a crash left a resume to submit a second.
            with self.database.session() as session:
                self._own(session)
                stage["job_id"] = jobs.submit(session, self.settings, body).id
                self._record(session, state)
        try:
            return self._wait(stage["job_id"], t)
        except RunFailedError:
            # A resume trains this stage again (its labels are paid for and kept).
            stage["failed_jobs"] = [*stage.get("failed_jobs", []), stage.pop("job_id")]
            self._save(state)
            raise

    def _wait(self, job_id: str, t: int) -> dict[str, Any]:
        while True:
            with self.database.session() as session:
                job = JobRepository(session).get(job_id)
                status, model_id, metrics, error = job.status, job.model_id, job.metrics, job.error
            if status == Status.SUCCEEDED:
                slim = {k: v for k, v in (metrics or {}).items() if k != "history"}
                return {"model_id": model_id, "metrics": slim}
            if Status(status).is_final:
                why = f": {error}" if error else ""
                raise RunFailedError(
                    f"stage {t}: training job {job_id} {status}{why}; resume to train it again"
                )
            self._heartbeat()
            if self.stop.wait(self.settings.poll_seconds):
                raise _Stopped

    # -- storage ----------------------------------------------------------------------

    def _load(self) -> MultistageRun:
        with self.database.session() as session:
            run = session.get(MultistageRun, self.run_id)
            assert run is not None
            session.expunge(run)
            return run

    def _save(
        self,
        state: dict[str, Any],
        *,
        status: RunStatus | None = None,
        finished: bool = False,
        model_id: str | None = None,
        take_over: bool = False,
    ) -> None:
        with self.database.session() as session:
            self._record(
                session, state, status=status, finished=finished, model_id=model_id,
                take_over=take_over,
            )  # fmt: skip

    def _record(
        self,
        session: Session,
        state: dict[str, Any],
        *,
        status: RunStatus | None = None,
        finished: bool = False,
        model_id: str | None = None,
        take_over: bool = False,
    ) -> None:
        """Write ``state`` (and the rest) to the run's row in ``session``'s transaction."""
        run = self._own(session, take_over=take_over)
        run.state = {**state, "driver": self.launch}
        if model_id:
            run.state["model_id"] = model_id
        run.updated_at = utcnow()
        if status is not None:
            run.status = status
        if finished:
            run.finished_at = run.updated_at

    def _own(self, session: Session, *, take_over: bool = False) -> MultistageRun:
        """The run's row, locked; :class:`_Superseded` if another driver owns it or
        it was cancelled."""
        run = get_for_update(session, MultistageRun, self.run_id)
        assert run is not None
        if run.status == RunStatus.CANCELLED:
            raise _Superseded
        if not take_over and run.state.get("driver") not in (None, self.launch):
            raise _Superseded
        return run

    def _heartbeat(self) -> None:
        with self.database.session() as session:
            self._own(session).updated_at = utcnow()

    def _finish(self, status: RunStatus, error: str) -> None:
        log.warning("multistage run %s %s: %s", self.run_id, status, error)
        try:
            with self.database.session() as session:
                run = self._own(session)
                run.status, run.error, run.updated_at = status, error, utcnow()
                if status == RunStatus.FAILED:
                    run.finished_at = run.updated_at
        except _Superseded:
            log.warning("multistage run %s: cancelled or resumed elsewhere", self.run_id)

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise _Stopped

    def _run_dir(self) -> Path:
        path = self.settings.data_dir / "multistage" / self.run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _feature_path(self) -> Path:
        with self.database.session() as session:
            feature_set = session.get(FeatureSet, self.run.feature_set_id)
            if feature_set is None:
                raise RunFailedError(f"feature set {self.run.feature_set_id} is gone")
            return self.settings.data_dir / feature_set.path

    def _feature_ids(self) -> list[str]:
        column = pq.read_table(self._feature_path(), columns=["example_id"]).column(0)
        return list(pc.cast(column, pa.string()).to_pylist())

    def _features(self, ids: list[str]) -> pa.Table:
        table = pq.read_table(self._feature_path())
        wanted = pa.array(ids, pa.string())
        pos = pc.index_in(wanted, value_set=pc.cast(table.column("example_id"), pa.string()))
        return table.take(pos)

    def _part_ids(self, part: str) -> list[str]:
        table = pq.read_table(self._run_dir() / "parts.parquet")
        mask = pc.equal(table.column("part"), part)
        return list(table.filter(mask).column("example_id").to_pylist())

    def _received(self, id_: str) -> ReceivedLabels:
        with self.database.session() as session:
            row = session.get(ReceivedLabels, id_)
            assert row is not None
            session.expunge(row)
            return row

    def _received_table(self, id_: str) -> pa.Table:
        path = self.settings.data_dir / self._received(id_).path
        return pq.read_table(path, columns=["example_id", "label"])

    def _predictor(self, model_id: str) -> Predictor:
        with self.database.session() as session:
            path = self.settings.data_dir / ModelRepository(session).get(model_id).path
        return load_artifact(path)


# -- helpers --------------------------------------------------------------------------


def _describe(exc: Exception) -> str:
    """A failed run's ``error``: the database's own message, not SQLAlchemy's, which
    quotes the statement and its parameters."""
    if isinstance(exc, RunFailedError):
        return str(exc)
    if isinstance(exc, DBAPIError):
        return f"database error: {type(exc.orig).__name__}: {exc.orig}"
    return f"{type(exc).__name__}: {exc}"


def part_sizes(n: int, fractions: list[float]) -> list[int]:
    """How many of ``n`` examples each stage gets: the fractions' cumulative shares,
    rounded, so the sizes add up to ``n``."""
    cuts = np.round(np.cumsum(fractions) * n).astype(np.int64)
    return [int(size) for size in np.diff(cuts, prepend=0)]


def assign_parts(
    ids: list[str], fractions: list[float], *, seed: int, prefix: str
) -> tuple[list[str], list[str]]:
    """``(sorted ids, their parts)``: a seeded permutation of the sorted ids, cut by
    the fractions into ``PREFIX-1`` … ``PREFIX-T``. Depends on the ids and the
    seed only — never on a label."""
    ordered = sorted(ids)
    cuts = np.cumsum(part_sizes(len(ordered), fractions))
    stage_of_rank = np.searchsorted(cuts, np.arange(len(ordered)), side="right") + 1
    stage = np.empty(len(ordered), dtype=np.int64)
    stage[np.random.default_rng(seed).permutation(len(ordered))] = stage_of_rank
    return ordered, [f"{prefix}-{t}" for t in stage.tolist()]


def _register_plan(client: LabelsPartyClient, dataset_id: str, path: Path) -> dict[str, Any]:
    """Register the plan. A run that registered it before a crash lost the answer
    registers the same assignment again (the partition is seeded) and gets its plan
    back; the labels party compares the examples in each part, so another run's
    plan with equal part sizes is a 409, never adopted."""
    try:
        return client.register_partition_plan(dataset_id, path)
    except LabelsPartyHTTPError as exc:
        if exc.status_code == 409:
            raise RunFailedError(
                "the dataset already has another partition plan; LP-MST registers its own "
                "(one plan per dataset), so run it on a dataset without one"
            ) from None
        raise RunFailedError(f"registering the partition plan failed: {exc}") from None


def _num_classes(client: LabelsPartyClient, dataset_id: str) -> int:
    try:
        dataset = client.get_dataset(dataset_id)
    except LabelsPartyError as exc:
        raise RunFailedError(f"cannot read dataset {dataset_id}: {exc}") from None
    if dataset.get("task") != "classification":
        raise RunFailedError("LP-MST needs a classification dataset")
    return int(dataset["label_domain"]["num_classes"])


def _parquet(columns: dict[str, Any]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
