"""Python client (SDK) of the labels-party API (DESIGN.md §6).

>>> request = ReleaseCreate(mechanism={"name": "rr-on-bins"}, epsilon=1)  # doctest: +SKIP
>>> with LabelsPartyClient("http://advertiser:8001", token) as lp:  # doctest: +SKIP
...     release = lp.create_release("ds1", request)
...     sha = lp.download_labels(release.id, Path("labels.parquet"), expected_sha256=release.sha256)

Every request has a timeout, and every attempt a watchdog (:class:`_Watchdog`):
the read timeout bounds a silence, not a trickle, and a labels party (or a proxy)
sending a byte a second held a request, and its worker thread, for ever. A
JSON call gets twice the timeout in all; a download must keep making progress
(64 KiB per timeout); an upload, whose sending it cannot see, has none.

Requests that are safe to repeat — reads, deletes, and release creation, which
**always** carries an idempotency key (one key per logical call, reused by each
retry, so a retried request never spends budget twice) — are retried on
connection errors, timeouts, 5xx and 429 answers, waiting as a ``Retry-After``
says (up to 60 s) or else a jittered exponential backoff. Other writes are retried only when the
connection failed before the request was sent, or on a 429 (turned away unread).

Exceptions::

    LabelsPartyError
    ├── LabelsPartyUnavailableError   down, timing out, 429, 502, 503 or 504 after all retries
    ├── LabelsPartyHTTPError          a 4xx answer, or a 500 (it failed) after all retries
    │                                 (status_code, error, message, detail)
    │   └── BudgetExceededError       409 budget_exceeded
    └── ReleaseIntegrityError         downloaded bytes do not hash to the manifest's sha256
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from shared.protocol import PARQUET_MEDIA_TYPE, PriorSetRead, ReleaseCreate, ReleaseRead

#: One WARNING per retry (what failed, why, the wait): an operator watching a
#: slow ``labels receive`` sees an outage being ridden out, not a hang.
logger = logging.getLogger("feature_party.client")

__all__ = [
    "BudgetExceededError",
    "LabelsPartyClient",
    "LabelsPartyError",
    "LabelsPartyHTTPError",
    "LabelsPartyUnavailableError",
    "ReleaseIntegrityError",
]


T = TypeVar("T")


def path_segment(value: str) -> str:
    """An id as one URL path segment: ``/`` and the like are escaped, so an id can
    never reach another endpoint."""
    return quote(str(value), safe="")


class LabelsPartyError(Exception):
    """Anything that went wrong talking to the labels party."""


class LabelsPartyUnavailableError(LabelsPartyError):
    """The labels party could not be reached or kept failing (after retries)."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class LabelsPartyHTTPError(LabelsPartyError):
    """The labels party answered with an error: a 4xx, or a 5xx other than
    :data:`UNAVAILABLE_STATUSES` (it failed, again on every retry), whose body
    carries its request id for its operator."""

    def __init__(self, status_code: int, error: str, message: str, detail: Any = None) -> None:
        super().__init__(f"{status_code} {error}: {message}")
        self.status_code = status_code
        self.error = error
        self.message = message
        self.detail = detail


class BudgetExceededError(LabelsPartyHTTPError):
    """The release would exceed the dataset's ε budget; nothing was spent."""


class ReleaseIntegrityError(LabelsPartyError):
    """The downloaded labels do not match the manifest's SHA-256, or exceed the
    size its label count allows."""


#: Downloads of one file before a hash mismatch is an error: a transfer corrupted
#: once (a flaky proxy) is fetched again; the same mismatch twice is the file's.
_INTEGRITY_TRIES = 2

#: Bytes a download must receive in each timeout window.
_PROGRESS_BYTES = 64 * 1024


class _Watchdog:
    """Calls ``abort`` (closing the connections) once an attempt overstays: at the
    end of a ``window`` of seconds in which fewer than ``min_bytes`` arrived (a
    download, re-armed by :meth:`progress`), or of the first window (``min_bytes``
    ``None``: the whole answer must come in it)."""

    def __init__(
        self, abort: Callable[[], None], *, window: float | None, min_bytes: int | None
    ) -> None:
        self._abort = abort
        self._window = window
        self._min_bytes = min_bytes
        self._lock = threading.Lock()
        self._received = 0
        self._stopped = False
        self.fired = False
        self.reason = ""
        self._timer: threading.Timer | None = None
        if window is not None:  # None: an upload, whose sending the watchdog cannot see
            self._arm()

    def _arm(self) -> None:
        assert self._window is not None
        self._timer = threading.Timer(self._window, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            if self._min_bytes is not None and self._received >= self._min_bytes:
                self._received = 0
                self._arm()
                return
            self.fired = True
            self.reason = (
                f"fewer than {self._min_bytes} bytes in {self._window:g} s"
                if self._min_bytes is not None
                else f"no complete answer in {self._window:g} s"
            )
        self._abort()

    def progress(self, num_bytes: int) -> None:
        with self._lock:
            self._received += num_bytes if num_bytes else self._min_bytes or 0

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()


class LabelsPartyClient:
    """Typed client of one labels-party service.

    ``retries`` is the number of *re*-tries (so ``retries + 1`` attempts);
    the wait before retry ``i`` is uniform in ``[0, min(max_backoff, backoff·2^i)]``.
    ``transport`` lets tests plug in ``httpx.ASGITransport`` or a mock.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 60.0,
        retries: int = 6,
        backoff: float = 1.0,
        max_backoff: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self._sleep = sleep

        def new_http() -> httpx.Client:
            return httpx.Client(
                base_url=base_url.rstrip("/"),
                headers={
                    "Authorization": f"Bearer {token}",
                    "User-Agent": "labeldp-feature-party",
                },
                timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                transport=transport,
            )

        self._new_http = new_http
        self._http = new_http()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- datasets -----------------------------------------------------------------

    def create_dataset(
        self,
        *,
        name: str,
        task: str,
        label_domain: dict[str, Any],
        epsilon_budget: float,
        delta_budget: float | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/datasets`` → the dataset (``{"id", ...}``)."""
        body: dict[str, Any] = {
            "name": name,
            "task": task,
            "label_domain": label_domain,
            "epsilon_budget": epsilon_budget,
        }
        if delta_budget is not None:
            body["delta_budget"] = delta_budget
        return self._object("POST", "/v1/datasets", json=body, idempotent=False)

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return self._object("GET", f"/v1/datasets/{path_segment(dataset_id)}")

    def upload_labels(
        self, dataset_id: str, file: Path | bytes, *, filename: str = "labels.parquet"
    ) -> dict[str, Any]:
        """``POST /v1/datasets/{id}/labels`` (.csv, .parquet or .jsonl) → ``{"num_labels"}``."""

        return self._object(
            "POST",
            f"/v1/datasets/{path_segment(dataset_id)}/labels",
            files_factory=_upload(file, filename),
            idempotent=False,
        )

    def get_budget(self, dataset_id: str) -> dict[str, Any]:
        """``GET /v1/datasets/{id}/budget``: spent and remaining ε (and δ), per part."""
        return self._object("GET", f"/v1/datasets/{path_segment(dataset_id)}/budget")

    # -- partition plans and prior sets (label-independent inputs) ----------------

    def register_partition_plan(
        self, dataset_id: str, file: Path | bytes, *, filename: str = "parts.parquet"
    ) -> dict[str, Any]:
        """``POST /v1/datasets/{id}/partitions`` (``example_id, part``) → ``{"id",
        "parts": {part: size}}``. One plan per dataset: 409 for another; the same
        assignment again returns the plan, so a lost answer is retried."""
        return self._object(
            "POST",
            f"/v1/datasets/{path_segment(dataset_id)}/partitions",
            files_factory=_upload(file, filename),
            idempotent=True,
        )

    def get_partition_plan(self, dataset_id: str) -> dict[str, Any]:
        return self._object("GET", f"/v1/datasets/{path_segment(dataset_id)}/partitions")

    def upload_priors(
        self,
        dataset_id: str,
        file: Path | bytes,
        *,
        kind: str,
        filename: str = "priors.parquet",
    ) -> PriorSetRead:
        """``POST /v1/datasets/{id}/priors``: ``kind`` ``groups`` (``example_id,
        group``) or ``probabilities`` (``example_id`` and a ``prior`` list of K, or
        ``p_0`` … ``p_{K−1}``) → the prior set; its ``id`` is a release's ``prior_id``."""
        data = self._json(
            "POST",
            f"/v1/datasets/{path_segment(dataset_id)}/priors",
            files_factory=_upload(file, filename),
            params={"kind": kind},
            idempotent=False,
        )
        return _parsed(PriorSetRead, data)

    # -- releases -----------------------------------------------------------------

    def create_release(
        self, dataset_id: str, request: ReleaseCreate | dict[str, Any]
    ) -> ReleaseRead:
        """``POST /v1/datasets/{id}/releases``. Spends budget once: an idempotency
        key is generated when ``request`` has none and reused on every retry.
        Raises :class:`BudgetExceededError` on 409 ``budget_exceeded``."""
        req = (
            request if isinstance(request, ReleaseCreate) else ReleaseCreate.model_validate(request)
        )
        if req.idempotency_key is None:
            req = req.model_copy(update={"idempotency_key": uuid.uuid4().hex})
        body = req.model_dump(mode="json", exclude_none=True)
        data = self._json(
            "POST",
            f"/v1/datasets/{path_segment(dataset_id)}/releases",
            json=body,
            headers={"Idempotency-Key": str(req.idempotency_key)},
            idempotent=True,
        )
        return _parsed(ReleaseRead, data)

    def get_release(self, release_id: str) -> ReleaseRead:
        return _parsed(ReleaseRead, self._json("GET", f"/v1/releases/{path_segment(release_id)}"))

    def download_labels(
        self,
        release_id: str,
        dest: Path,
        *,
        expected_sha256: str | None = None,
        max_bytes: int | None = None,
    ) -> str:
        """Stream the release's Parquet to ``dest`` and return its SHA-256. With
        ``expected_sha256``, a mismatch raises :class:`ReleaseIntegrityError` and
        leaves nothing at ``dest``; so does a file past ``max_bytes``."""
        return self._download(
            f"/v1/releases/{path_segment(release_id)}/labels",
            dest,
            expected_sha256=expected_sha256,
            what=f"release {release_id} labels",
            accept=PARQUET_MEDIA_TYPE,
            params={"format": "parquet"},
            max_bytes=max_bytes,
        )

    def _download(
        self,
        path: str,
        dest: Path,
        *,
        expected_sha256: str | None,
        what: str,
        accept: str,
        params: dict[str, Any] | None = None,
        max_bytes: int | None = None,
    ) -> str:
        """Stream ``path`` to ``dest`` (retried: a download is safe to repeat) and
        check its SHA-256 against ``expected_sha256`` and ``X-Content-SHA256``; past
        ``max_bytes`` it stops (a misbehaving server must not fill the disk)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")

        def attempt(watchdog: _Watchdog) -> tuple[str, str | None]:
            digest = hashlib.sha256()
            with (
                self._http.stream(
                    "GET", path, params=params, headers={"Accept": accept}
                ) as response,
                tmp.open("wb") as out,
            ):
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                watchdog.progress(0)  # the headers came
                received = 0
                for chunk in response.iter_bytes():
                    received += len(chunk)
                    if max_bytes is not None and received > max_bytes:
                        raise ReleaseIntegrityError(f"{what}: more than {max_bytes} bytes")
                    watchdog.progress(len(chunk))
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest(), response.headers.get("X-Content-SHA256")

        try:
            for _try in range(_INTEGRITY_TRIES):
                sha, announced = self._retrying(attempt, idempotent=True, what=what, streaming=True)
                # An expected hash that is present but empty is wrong, not unchecked.
                wrong = [
                    e for e in (expected_sha256, announced) if e is not None and sha != e.lower()
                ]
                if not wrong:
                    os.replace(tmp, dest)
                    return sha
            # Wrong every time: the file's fault, not one transfer's.
            raise ReleaseIntegrityError(f"{what}: the bytes hash to {sha}, expected {wrong[0]}")
        finally:
            tmp.unlink(missing_ok=True)

    # -- LabelDP-Pro trainings (a model as the release) ------------------------------

    def create_training(
        self,
        dataset_id: str,
        features: Path | bytes,
        spec: dict[str, Any],
        *,
        filename: str = "features.parquet",
    ) -> dict[str, Any]:
        """``POST /v1/datasets/{id}/trainings`` (multipart ``file`` + JSON ``spec``).
        Spends (ε, δ) once: like :meth:`create_release`, an idempotency key is
        generated when ``spec`` has none and reused on every retry."""
        body = dict(spec)
        body.setdefault("idempotency_key", uuid.uuid4().hex)
        return self._object(
            "POST",
            f"/v1/datasets/{path_segment(dataset_id)}/trainings",
            files_factory=_upload(features, filename),
            data={"spec": json.dumps(body)},
            idempotent=True,
        )

    def get_training(self, training_id: str) -> dict[str, Any]:
        """``GET /v1/trainings/{id}``: status, progress, accounting, ``sha256``."""
        return self._object("GET", f"/v1/trainings/{path_segment(training_id)}")

    def download_model(
        self,
        training_id: str,
        dest: Path,
        *,
        expected_sha256: str | None = None,
        max_bytes: int | None = None,
    ) -> str:
        """Stream a trained model's artifact to ``dest`` and return its SHA-256. A
        hash that differs from ``expected_sha256`` (or from the response's
        ``X-Content-SHA256``) raises :class:`ReleaseIntegrityError` and leaves
        nothing at ``dest``; so does a file past ``max_bytes``."""
        return self._download(
            f"/v1/trainings/{path_segment(training_id)}/model",
            dest,
            expected_sha256=expected_sha256,
            what=f"training {training_id} model",
            accept="application/octet-stream",
            max_bytes=max_bytes,
        )

    # -- clients, grants, audit -----------------------------------------------------

    def create_client(self, *, name: str, role: str = "client") -> dict[str, Any]:
        """``POST /v1/clients`` → ``{"id", "token"}`` (the token is shown once)."""
        return self._object(
            "POST", "/v1/clients", json={"name": name, "role": role}, idempotent=False
        )

    def delete_client(self, client_id: str) -> None:
        self._request("DELETE", f"/v1/clients/{path_segment(client_id)}")

    def create_grant(self, dataset_id: str, *, client_id: str) -> dict[str, Any]:
        return self._object(
            "POST",
            f"/v1/datasets/{path_segment(dataset_id)}/grants",
            json={"client_id": client_id},
            idempotent=False,
        )

    def get_audit(self, dataset_id: str) -> Any:
        """``GET /v1/datasets/{id}/audit``: the dataset's audit entries."""
        return self._json("GET", f"/v1/datasets/{path_segment(dataset_id)}/audit")

    def verify_audit(self) -> dict[str, Any]:
        """``GET /v1/audit/verify`` → ``{"ok", "entries"}``."""
        return self._object("GET", "/v1/audit/verify")

    def preview_mechanism(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/mechanisms/preview`` (no data, no budget)."""
        return self._object("POST", "/v1/mechanisms/preview", json=body, idempotent=True)

    def health(self) -> dict[str, Any]:
        return self._object("GET", "/healthz")

    # -- plumbing -------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        try:
            return response.json() if response.content else None
        # A proxy's HTML page, say, or JSON nested past Python's recursion limit
        # (a 500 before; helper-86): the labels party's fault, not ours.
        except (ValueError, RecursionError):
            raise LabelsPartyError(
                f"{method} {path}: the answer ({response.status_code}) is not JSON"
            ) from None

    def _object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data = self._json(method, path, **kwargs)
        if not isinstance(data, dict):
            raise LabelsPartyError(f"{method} {path}: expected a JSON object")
        return data

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        data: dict[str, Any] | None = None,
        files_factory: Callable[[], dict[str, Any]] | None = None,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        safe = method in {"GET", "HEAD", "DELETE", "PUT"} if idempotent is None else idempotent

        def attempt(_watchdog: _Watchdog) -> httpx.Response:
            response = self._http.request(
                method,
                path,
                json=json,
                params=params,
                headers=headers,
                data=data,
                files=files_factory() if files_factory else None,
            )
            if response.status_code >= 400:
                self._raise_for(response)
            return response

        uploading = files_factory is not None or data is not None
        return self._retrying(
            attempt, idempotent=safe, what=f"{method} {path}", uploading=uploading
        )

    def _wait(self, seconds: float, attempt: int, what: str, why: str) -> None:
        logger.warning(
            "%s failed (%s); retry %d of %d in %.1f s",
            what, why, attempt + 1, self.retries, seconds,
            extra={"fields": {"attempt": attempt + 1, "wait_seconds": round(seconds, 3)}},
        )  # fmt: skip
        self._sleep(seconds)

    def _retrying(
        self,
        attempt: Callable[[_Watchdog], T],
        *,
        idempotent: bool,
        what: str,
        streaming: bool = False,
        uploading: bool = False,
    ) -> T:
        last = ""
        failed: LabelsPartyHTTPError | None = None  # the last answer, when it was a failure
        for i in range(self.retries + 1):
            try:
                return self._watched(attempt, streaming=streaming, uploading=uploading)
            except _ServerError as exc:
                last, failed = str(exc), exc.failure
                if exc.processed and not idempotent:
                    raise failed or LabelsPartyUnavailableError(
                        f"{what}: {last}", attempts=i + 1
                    ) from None
                if exc.retry_after is not None and i < self.retries:
                    self._wait(exc.retry_after, i, what, last)  # the server said when: no jitter
                    continue
            except httpx.TransportError as exc:
                # A local protocol error's text quotes the request's headers: its token.
                quiet = isinstance(exc, httpx.LocalProtocolError) or not str(exc)
                last = type(exc).__name__ if quiet else f"{type(exc).__name__}: {exc}"
                failed = None
                if not (idempotent or isinstance(exc, httpx.ConnectError)):
                    raise LabelsPartyUnavailableError(f"{what}: {last}", attempts=i + 1) from None
            if i < self.retries:
                wait = random.uniform(0, min(self.max_backoff, self.backoff * 2**i))
                self._wait(wait, i, what, last)
        if failed is not None:
            raise failed
        raise LabelsPartyUnavailableError(
            f"{what}: the labels party is unavailable after {self.retries + 1} attempts ({last})",
            attempts=self.retries + 1,
        )

    def _watched(self, attempt: Callable[[_Watchdog], T], *, streaming: bool, uploading: bool) -> T:
        """One attempt under a :class:`_Watchdog` that closes the connections under
        it when it stalls; a fresh connection pool for the next attempt then. An
        upload has none: its body may take long to send, at any healthy speed,
        and only the read timeout bounds its answer."""
        http = self._http
        window = None if uploading else self.timeout if streaming else 2 * self.timeout
        watchdog = _Watchdog(
            http.close, window=window, min_bytes=_PROGRESS_BYTES if streaming else None
        )
        try:
            return attempt(watchdog)
        except (httpx.HTTPError, OSError, RuntimeError) as exc:
            if not watchdog.fired:
                raise
            raise httpx.ReadTimeout(f"the answer did not come in time ({watchdog.reason})") from exc
        finally:
            watchdog.stop()
            if watchdog.fired:
                self._http = self._new_http()

    @staticmethod
    def _raise_for(response: httpx.Response) -> None:
        try:
            body = _without_surrogates(response.json())
        except (ValueError, RecursionError):
            body = {}
        if not isinstance(body, dict):
            body = {}
        error = str(body.get("error") or "http_error")
        message = str(body.get("message") or response.reason_phrase)
        status = response.status_code
        cls = (
            BudgetExceededError
            if status == 409 and error == "budget_exceeded"
            else LabelsPartyHTTPError
        )
        answer = cls(status, error, message, body.get("detail"))
        # 507: the labels party's storage is full, which retrying will not mend
        # (and which spent nothing): answered, not retried.
        if (status >= 500 and status != 507) or status == 429:
            raise _ServerError(
                f"HTTP {status} {error}: {message}"[:300],
                retry_after=_retry_after(response),
                # Turned away unread: a 429, or a 503 overloaded (shared.overload).
                processed=not (status == 429 or (status == 503 and error == "overloaded")),
                failure=None if status in UNAVAILABLE_STATUSES else answer,
            )
        raise answer


def _without_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate (JSON's ``"\ud800"``) in its texts made
    ``?``: relayed in the features party's own answer, one failed to encode, and
    the request was answered as if its own text were not Unicode (helper-86)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


#: Answers that say the labels party (or a proxy before it) cannot serve now;
#: after the retries they are :class:`LabelsPartyUnavailableError`. Any other 5xx
#: is its own failure, a :class:`LabelsPartyHTTPError` with the body it sent.
UNAVAILABLE_STATUSES = frozenset({429, 502, 503, 504})


class _ServerError(Exception):
    """A 5xx or 429 answer (internal: retried, then reported as ``failure`` or, when
    that is None, as unavailable). ``processed`` is False for a 429 and a 503
    ``overloaded``: the request was turned away unread, so even a write that is not
    idempotent may be sent again (a multistage run failed on one; helper-75)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None,
        processed: bool,
        failure: LabelsPartyHTTPError | None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.processed = processed
        self.failure = failure


#: The longest wait a ``Retry-After`` gets: a longer one is waited this long.
MAX_RETRY_AFTER = 60.0


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds, at most :data:`MAX_RETRY_AFTER` (its delay
    form; a date is ignored), or ``None``."""
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return min(seconds, MAX_RETRY_AFTER) if seconds >= 0 else None


def _upload(file: Path | bytes, filename: str) -> Callable[[], dict[str, Any]]:
    """A multipart ``file`` field, rebuilt for each attempt (a file is read then)."""

    def files() -> dict[str, Any]:
        if isinstance(file, Path):
            return {"file": (file.name, file.read_bytes())}
        return {"file": (filename, file)}

    return files


ModelT = TypeVar("ModelT", bound=BaseModel)


def _parsed(model: type[ModelT], data: Any) -> ModelT:
    """The labels party's answer as ``model``; an answer of another shape is its
    failure (502 at the features party), not an internal error here."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = sorted({".".join(map(str, e["loc"])) or "(the answer)" for e in exc.errors()})
        shown = ", ".join(fields[:10]) + (
            f" and {len(fields) - 10} more" if len(fields) > 10 else ""
        )
        raise LabelsPartyError(
            f"the labels party's answer is not a {model.__name__}: check {shown}"
        ) from None
