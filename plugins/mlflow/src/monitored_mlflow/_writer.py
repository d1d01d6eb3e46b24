"""The background thread that talks to MLflow: batches, retries, drops, never blocks a step.

The step loop only appends to in-memory lists under a lock (:meth:`Sender.add_metrics`);
one daemon thread imports MLflow (a slow import, kept off the event loop), creates
or resumes the run, and sends what has accumulated with ``MlflowClient.log_batch``
in chunks within MLflow's batch limits. A call that fails is retried with
exponential backoff; after the last try its items are dropped, counted and
warned about once per streak of failures, and the thread goes on with what
comes next (a server that comes back gets the later points). Closing waits for
what is pending at most the session's grace period, then drops the rest.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["RUN_KEY_TAG", "STEP_TAG", "Sender", "SenderConfig"]

log = logging.getLogger("monitored.mlflow")

#: MLflow's per-request limits for ``log_batch`` (metrics, params, tags).
MAX_METRICS_PER_BATCH: Final = 1000
MAX_PARAMS_PER_BATCH: Final = 100
MAX_TAGS_PER_BATCH: Final = 100
#: MLflow refuses longer parameter values.
MAX_PARAM_VALUE_LENGTH: Final = 6000

#: A tag holding a key the plugin makes up before the run exists, so that a
#: checkpoint written before the run was created still finds it on resume.
RUN_KEY_TAG: Final = "monitored.run_key"
#: The last global step sent: a resumed run logs nothing at or before it again.
STEP_TAG: Final = "monitored.last_step"
#: MLflow's own tag for the source's git commit.
GIT_COMMIT_TAG: Final = "mlflow.source.git.commit"

#: A metric point: (key, value, timestamp in ms, step).
Point = tuple[str, float, int, int]


@dataclass(slots=True)
class SenderConfig:
    """Where and how to send (the hook's arguments, resolved)."""

    tracking_uri: str | None
    experiment: str
    run_name: str | None
    run_key: str
    run_id: str | None = None
    artifact_location: str | None = None
    retries: int = 3
    backoff_secs: float = 0.5
    max_pending: int = 100_000
    flush_secs: float = 1.0
    tags: Mapping[str, str] = field(default_factory=dict)


class Sender:
    """Sends metrics, parameters, tags and artifacts to one MLflow run from a thread."""

    def __init__(self, config: SenderConfig) -> None:
        self.config = config
        self._cond = threading.Condition()
        self._points: list[Point] = []
        self._params: dict[str, str] = {}
        self._tags: dict[str, str] = {}
        self._artifacts: list[tuple[str, str]] = []
        self._status: str | None = None
        self._deadline = float("inf")
        self._done = threading.Event()
        #: Set by :meth:`close`: the backoff between retries is cut short once.
        self._wake = threading.Event()
        self._failing = False
        self._last_send = -float("inf")
        #: Metric points, parameters, tags and artifacts dropped (sent to nobody).
        self.dropped = 0
        #: Metric points sent.
        self.sent = 0
        #: The MLflow run, once created or found (read by the hook's ``plugin_state``).
        self.run_id: str | None = config.run_id
        #: Steps at or below this were logged before a resume: not logged again.
        self.skip_through = -1
        self.ended_as: str | None = None
        self._thread = threading.Thread(target=self._main, name="monitored-mlflow", daemon=True)

    # -- the step loop's side ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def add_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Queue ``values`` at ``step`` (cheap: a lock and a list extend)."""
        now = int(time.time() * 1000)
        points = [(key, value, now, step) for key, value in values.items()]
        with self._cond:
            was_empty = not self._points
            self._points.extend(points)
            overflow = len(self._points) - self.config.max_pending
            if overflow > 0:
                del self._points[:overflow]
                self.dropped += overflow
            if was_empty:  # the thread waits for the first point only, then lingers
                self._cond.notify()

    def add_params(self, params: Mapping[str, str]) -> None:
        with self._cond:
            self._params.update(params)
            self._cond.notify()

    def add_tags(self, tags: Mapping[str, str]) -> None:
        with self._cond:
            self._tags.update(tags)
            self._cond.notify()

    def add_artifact(self, local_path: str, artifact_path: str) -> None:
        with self._cond:
            self._artifacts.append((local_path, artifact_path))
            self._cond.notify()

    def close(self, status: str, timeout: float) -> bool:
        """End the run with ``status`` once what is pending is sent, waiting at most ``timeout``.

        Returns whether everything was sent in time; what was not is dropped and
        warned about (the thread, a daemon, is left to finish its last call).
        """
        with self._cond:
            self._status = status
            self._deadline = time.monotonic() + max(0.0, timeout)
            self._cond.notify()
        self._wake.set()
        if not self._thread.is_alive() and not self._done.is_set():
            return False
        if self._done.wait(max(0.0, timeout)):
            return True
        with self._cond:
            left = len(self._points) + len(self._params) + len(self._tags) + len(self._artifacts)
            self._points, self._params, self._tags, self._artifacts = [], {}, {}, []
            self.dropped += left
        log.warning(
            "monitored-mlflow: the tracking server %s did not take what was pending within "
            "the session's grace period (%gs): %d items dropped, %d in all; the run is left "
            "%s",
            self._where(),
            timeout,
            left,
            self.dropped,
            "RUNNING" if self.run_id is not None else "uncreated",
        )
        return False

    # -- the thread -------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            client = self._connect()
            if client is None:
                return
            while True:
                with self._cond:
                    while not self._has_work() and self._status is None:
                        self._cond.wait()
                    # Gather for flush_secs after the last send: one request carries
                    # many steps' points instead of one request (and its GIL time) each.
                    while self._status is None:
                        linger = self._last_send + self.config.flush_secs - time.monotonic()
                        if linger <= 0:
                            break
                        self._cond.wait(linger)
                    params, self._params = self._params, {}
                    tags, self._tags = self._tags, {}
                    points, self._points = self._points, []
                    artifacts, self._artifacts = self._artifacts, []
                    status = self._status
                if params or tags or points:
                    self._send_batch(client, params, tags, points)
                self._last_send = time.monotonic()
                for local_path, artifact_path in artifacts:
                    self._send_artifact(client, local_path, artifact_path)
                if status is not None and not self._has_work():
                    self._terminate(client, status)
                    return
        except Exception as exc:  # never into the training: the run is left as it is
            log.warning("monitored-mlflow: the sender stopped: %r", exc)
        finally:
            self._done.set()

    def _has_work(self) -> bool:
        return bool(self._points or self._params or self._tags or self._artifacts)

    def _connect(self) -> MlflowClient | None:
        """Import MLflow, then find or create the experiment and the run (with retries)."""
        from mlflow import MlflowClient

        client = MlflowClient(self.config.tracking_uri)
        pause = self.config.backoff_secs
        while True:
            run_id = self._retrying("create the MLflow run", 0, lambda: self._open_run(client))
            if run_id is not None or self._wake.is_set():
                break
            # The server is down from the start: items wait (up to max_pending) for it.
            self._wake.wait(pause)
            pause = min(pause * 2, 30.0)
        if run_id is None:
            with self._cond:
                dropped = len(self._points) + len(self._params) + len(self._tags)
                self._points, self._params, self._tags, self._artifacts = [], {}, {}, []
                self.dropped += dropped
            return None
        self.run_id = run_id
        return client

    def _open_run(self, client: MlflowClient) -> str:
        config = self.config
        experiment = client.get_experiment_by_name(config.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = client.create_experiment(
                config.experiment, artifact_location=config.artifact_location
            )
        run = None
        if config.run_id is not None:
            run = client.get_run(config.run_id)
        else:
            found = client.search_runs(
                [experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{config.run_key}'"
            )
            run = found[0] if found else None
        if run is None:
            tags = {**config.tags, RUN_KEY_TAG: config.run_key, **_git_tags()}
            run = client.create_run(experiment_id, tags=tags, run_name=config.run_name)
            return str(run.info.run_id)
        run_id = str(run.info.run_id)
        # Resumed: points up to the last step sent are there already, and parameters
        # cannot change once logged.
        self.skip_through = int(run.data.tags.get(STEP_TAG, -1))
        logged = dict(run.data.params)
        with self._cond:
            for key in [k for k in self._params if k in logged]:
                if self._params[key] != logged[key]:
                    log.warning(
                        "monitored-mlflow: parameter %r of resumed run %s was %r, now %r; "
                        "MLflow keeps the first value",
                        key,
                        run_id,
                        logged[key],
                        self._params[key],
                    )
                del self._params[key]
        client.update_run(run_id, status="RUNNING")
        return run_id

    def _send_batch(
        self,
        client: MlflowClient,
        params: Mapping[str, str],
        tags: Mapping[str, str],
        points: list[Point],
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.run_id
        assert run_id is not None
        points = [p for p in points if p[3] > self.skip_through]
        metrics = [Metric(key, value, stamp, step) for key, value, stamp, step in points]
        param_list = [Param(key, value) for key, value in params.items()]
        tag_list = [RunTag(key, value) for key, value in tags.items()]
        if points:
            last = max(p[3] for p in points)
            tag_list.append(RunTag(STEP_TAG, str(last)))
        while metrics or param_list or tag_list:
            chunk_metrics, metrics = (
                metrics[:MAX_METRICS_PER_BATCH],
                metrics[MAX_METRICS_PER_BATCH:],
            )
            chunk_params, param_list = (
                param_list[:MAX_PARAMS_PER_BATCH],
                param_list[MAX_PARAMS_PER_BATCH:],
            )
            # The step tag goes with the last chunk, once every point is in.
            if metrics:
                chunk_tags = [t for t in tag_list[:MAX_TAGS_PER_BATCH] if t.key != STEP_TAG]
            else:
                chunk_tags = tag_list[:MAX_TAGS_PER_BATCH]
            tag_list = [t for t in tag_list if t not in chunk_tags]

            def send(
                m: list[Any] = chunk_metrics, p: list[Any] = chunk_params, t: list[Any] = chunk_tags
            ) -> None:
                client.log_batch(run_id, metrics=m, params=p, tags=t, synchronous=True)

            count = len(chunk_metrics) + len(chunk_params) + len(chunk_tags)
            if self._retrying("log a batch", count, send) is not None:
                self.sent += len(chunk_metrics)

    def _send_artifact(self, client: MlflowClient, local_path: str, artifact_path: str) -> None:
        run_id = self.run_id
        assert run_id is not None
        files = checkpoint_files(local_path)
        if not files:
            with self._cond:
                self.dropped += 1
            log.warning(
                "monitored-mlflow: checkpoint %s is gone before it could be uploaded (removed "
                "by max_to_keep?); not logged",
                local_path,
            )
            return
        for path in files:
            self._retrying(
                f"upload checkpoint {path}", 1, _uploader(client, run_id, path, artifact_path)
            )

    def _terminate(self, client: MlflowClient, status: str) -> None:
        run_id = self.run_id
        assert run_id is not None
        if self._retrying(
            f"end the run as {status}", 0, lambda: client.set_terminated(run_id, status)
        ):
            self.ended_as = status
        if self.dropped:
            log.warning(
                "monitored-mlflow: run %s ended %s; %d items could not be sent and were dropped",
                run_id,
                status,
                self.dropped,
            )

    def _retrying(self, what: str, count: int, call: Callable[[], Any]) -> Any:
        """``call()`` with retries and backoff; ``None`` (and ``count`` dropped) if all fail."""
        delay = self.config.backoff_secs
        error: Exception | None = None
        for attempt in range(self.config.retries + 1):
            if attempt:
                wait = min(delay, self._deadline - time.monotonic())
                if wait <= 0:
                    break
                if self._wake.is_set():
                    time.sleep(wait)
                else:
                    self._wake.wait(wait)  # closing cuts a backoff short, once
                delay *= 2
            try:
                result = call()
            except Exception as exc:
                if _is_refusal(exc):  # a bad name or value: another try changes nothing
                    error = exc
                    break
                error = exc
                continue
            if self._failing:
                self._failing = False
                log.warning("monitored-mlflow: the tracking server %s answers again", self._where())
            return True if result is None else result
        with self._cond:
            self.dropped += count
        if not self._failing or _is_refusal(error):
            log.warning(
                "monitored-mlflow: could not %s on %s (%s); %d items dropped, %d in all. "
                "Training goes on; later items are tried again",
                what,
                self._where(),
                _describe(error),
                count,
                self.dropped,
            )
        self._failing = not _is_refusal(error)
        return None

    def _where(self) -> str:
        return self.config.tracking_uri or "(MLflow's default store)"


def _uploader(
    client: MlflowClient, run_id: str, path: str, artifact_path: str
) -> Callable[[], None]:
    """Upload ``path`` (a file, or a directory as ``<artifact_path>/<its name>``)."""
    if os.path.isdir(path):
        return lambda: client.log_artifacts(
            run_id, path, f"{artifact_path}/{os.path.basename(path)}"
        )
    return lambda: client.log_artifact(run_id, path, artifact_path)


def checkpoint_files(path: str) -> list[str]:
    """The files of the checkpoint at ``path``: itself, or its ``<path>.*`` files."""
    if os.path.exists(path):
        return [path]
    directory, prefix = os.path.split(path)
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return []
    return [
        os.path.join(directory, name)
        for name in names
        if name.startswith(prefix + ".") and os.path.isfile(os.path.join(directory, name))
    ]


def _is_refusal(exc: BaseException | None) -> bool:
    """Whether MLflow refused the request itself (a bad value), as opposed to not answering."""
    return getattr(exc, "error_code", None) == "INVALID_PARAMETER_VALUE"


def _describe(exc: BaseException | None) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def _git_tags() -> dict[str, str]:
    """The working directory's git commit, as MLflow's own tag; none outside a repository."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    commit = done.stdout.strip()
    if done.returncode != 0 or len(commit) not in (40, 64):
        return {}
    return {GIT_COMMIT_TAG: commit}
