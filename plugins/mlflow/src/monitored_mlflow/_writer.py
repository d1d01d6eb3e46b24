"""The sender process: one MLflow run, fed by the training process over a pipe.

MLflow's client does its work in Python (a local SQLite store goes through
SQLAlchemy's ORM), and a thread of the training process doing it would hold the
training's GIL. So :class:`~monitored_mlflow._sender.Sender` starts this module
as a script in a process of its own (a fresh interpreter: nothing forked from a
training process that may hold threads or device contexts), and the training
process only pickles what its hook queued and writes it to a pipe.

Here, :func:`main` reads the frames from that pipe and hands their items to a
:class:`RunWriter`, whose thread imports MLflow, creates or resumes the run, and
sends what has accumulated with ``MlflowClient.log_batch`` in chunks within
MLflow's batch limits. A call that fails is retried with exponential backoff;
after the last try its items are dropped, counted and warned about once per
streak of failures, and the thread goes on with what comes next (a server that
comes back gets the later points). Closing waits for what is pending at most the
session's grace period, then drops the rest. Warnings and counts go back to the
training process over a second pipe, where they are logged by the
``monitored.mlflow`` logger as before.

Once the run exists, its sending runs at a lower priority (:data:`NICENESS`):
where the cores are busy, training comes first, and the sending waits (the
run's creation, which the session's start waits for, does not). It never outlives its training
process: SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; a batch
system signals every process of a job) are ignored, since the training process
closes the run when it stops; and when the pipe's writing end closes, or the
process's parent changes (the training process was killed), what is pending is
sent within :data:`ORPHAN_SECS`, the run is ended ``KILLED``, and the process
exits.

Only the standard library is imported here at module level (MLflow when the
thread starts), so that the script starts without the ``monitored`` core.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = [
    "HTTP_DEFAULTS",
    "IGNORED_SIGNALS",
    "MAX_FRAME_BYTES",
    "NICENESS",
    "ORPHAN_SECS",
    "RUN_KEY_TAG",
    "STEP_TAG",
    "ProtocolError",
    "RunWriter",
    "SenderConfig",
    "main",
    "read_frame",
    "write_frame",
]

log = logging.getLogger("monitored.mlflow")

#: MLflow's per-request limits for ``log_batch`` (metrics, params, tags).
MAX_METRICS_PER_BATCH: Final = 1000
MAX_PARAMS_PER_BATCH: Final = 100
MAX_TAGS_PER_BATCH: Final = 100
#: MLflow refuses longer parameter values.
MAX_PARAM_VALUE_LENGTH: Final = 6000
#: At the close, the seconds of the grace period (at most, and at most a fifth of
#: it) kept for ending the run: sending what is pending stops then, so that the run
#: is ended, not left ``RUNNING``, however much was pending.
END_RESERVE_SECS: Final = 5.0

#: A tag holding a key the plugin makes up before the run exists, so that a
#: checkpoint written before the run was created still finds it on resume.
RUN_KEY_TAG: Final = "monitored.run_key"
#: The last global step sent: a resumed run logs nothing at or before it again.
STEP_TAG: Final = "monitored.last_step"
#: MLflow's own tag for the source's git commit.
GIT_COMMIT_TAG: Final = "mlflow.source.git.commit"

#: Signals the process ignores: the training process handles them and closes the run.
IGNORED_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGTERM})
#: Seconds the process goes on sending once its training process is gone.
ORPHAN_SECS: Final = 10.0
#: The process's niceness, added to the training process's: where the cores are
#: busy (data loaders, other jobs), training gets them first.
NICENESS: Final = 10
#: MLflow's HTTP client settings this process uses unless the user set them:
#: MLflow's own defaults retry a refused connection for minutes inside one
#: request, during which nothing is said; the writer retries with backoff itself.
HTTP_DEFAULTS: Final = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
#: How often the process checks that its training process is still there.
PARENT_CHECK_SECS: Final = 1.0
#: The largest frame either side reads (the training process ships at most
#: ``FRAME_RECORDS`` steps' records a frame, far below it).
MAX_FRAME_BYTES: Final = 256 << 20
_HEADER: Final = struct.Struct(">I")

#: A metric point: (key, value, timestamp in ms, step).
Point = tuple[str, float, int, int]
#: The scalars of one step: (step, timestamp in ms, {key: value}).
Record = tuple[int, int, dict[str, float]]


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
    #: When the session started (ms since the epoch): a new run's ``start_time``,
    #: not the moment this process got to create it.
    start_time_ms: int | None = None


class ProtocolError(Exception):
    """A frame on the pipe between the two processes that is not one (cut, or too large)."""


def write_frame(fd: int, message: object) -> None:
    """Write ``message`` to ``fd`` as one length-prefixed pickle (all of it, or ``OSError``)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int) -> Any:
    """The next message on ``fd``; ``None`` at the end of the stream."""
    header = _read_exactly(fd, _HEADER.size, at_start=True)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"a frame of {size} bytes, over the limit of {MAX_FRAME_BYTES}")
    data = _read_exactly(fd, size, at_start=False)
    assert data is not None
    return pickle.loads(data)


def _read_exactly(fd: int, size: int, *, at_start: bool) -> bytes | None:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            if at_start and left == size:
                return None
            raise ProtocolError(f"the stream ended inside a frame ({size - left} of {size} bytes)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class RunWriter:
    """Sends metrics, parameters, tags and artifacts to one MLflow run from a thread.

    ``report`` gets what the training process is told: ``("run", run_id)`` once
    the run exists (``("norun",)`` once a first try to create it failed), and
    ``("counts", sent, dropped, settled)`` after each request.
    """

    def __init__(self, config: SenderConfig, report: Callable[[tuple[Any, ...]], None]) -> None:
        self.config = config
        self._report = report
        self._cond = threading.Condition()
        #: Points waiting for the store, each with its number among its metric's points.
        self._points: list[tuple[int, Point]] = []
        #: Each metric's newest point when it is off the grid of the stride: sent at the
        #: close, so that the last step is always logged.
        self._tail: dict[str, Point] = {}
        #: How many points of each metric came; one in ``_stride`` is sent.
        self._seq: dict[str, int] = {}
        self._stride = 1
        self._params: dict[str, str] = {}
        self._tags: dict[str, str] = {}
        self._artifacts: list[tuple[str, str]] = []
        self._status: str | None = None
        self._deadline = float("inf")
        self._done = threading.Event()
        #: Set by :meth:`close`: the backoff between retries is cut short once.
        self._wake = threading.Event()
        #: A streak of failures ended in a drop: at the close, one try each, no retries.
        self._failing = False
        #: The first failure of a streak was warned about (as soon as it came).
        self._warned = False
        #: Set when the thread stopped on an error: later items are dropped at once.
        self._stopped = False
        #: Metric points, parameters, tags and artifacts dropped (sent to nobody).
        self.dropped = 0
        #: Metric points sent.
        self.sent = 0
        #: Items (points, parameters, tags, artifacts) handed to the writer, and those
        #: it is done with: sent, dropped, superseded, or skipped as logged before a
        #: resume. The training process counts what it shipped and not settled as
        #: dropped when this process ends.
        self.received = 0
        self.settled = 0
        #: The MLflow run, once created or found.
        self.run_id: str | None = config.run_id
        #: Steps at or below this were logged before a resume: not logged again.
        self.skip_through = -1
        #: The count of dropped points the last thinning warning gave.
        self._thinning_said = 0
        #: The last step sent as :data:`STEP_TAG` (it only grows).
        self._tagged_step = -1
        #: When sending what is pending stops, closing, so that the run is ended in time.
        self._end_by = float("inf")
        self.ended_as: str | None = None
        self._thread = threading.Thread(target=self._main, name="monitored-mlflow", daemon=True)

    # -- the reading side -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def add(self, records: Iterable[Record], items: Iterable[tuple[Any, ...]]) -> None:
        """Queue what one frame carried: steps' scalars, and parameters, tags, artifacts."""
        points = [
            (key, value, stamp, step)
            for step, stamp, values in records
            for key, value in values.items()
        ]
        if points:
            self.add_points(points)
        for item in items:
            if item[0] == "params":
                self.add_params(item[1])
            elif item[0] == "tags":
                self.add_tags(item[1])
            elif item[0] == "artifact":
                self.add_artifact(item[1], item[2])
            else:
                raise ProtocolError(f"an item of unknown kind {item[0]!r}")

    def add_points(self, points: list[Point]) -> None:
        """Queue ``points``, on the grid of the current stride (see :meth:`_thin`)."""
        with self._cond:
            self.received += len(points)
            if self._stopped:
                self._drop_now(len(points))
                return
            seq, stride, tail, pending = self._seq, self._stride, self._tail, self._points
            for point in points:
                key = point[0]
                n = seq.get(key, 0)
                seq[key] = n + 1
                if n % stride == 0:
                    pending.append((n, point))
                    if tail.pop(key, None) is not None:
                        self._drop_now(1)
                else:
                    # Off the grid: kept only as the metric's newest, sent at the close.
                    if key in tail:
                        self._drop_now(1)
                    tail[key] = point
            if len(pending) > self.config.max_pending:
                self._thin()
            self._cond.notify()

    def _thin(self) -> None:
        """Double the stride until the pending points fit ``max_pending`` (lock held).

        The store takes fewer points than the training makes. Rather than a
        gap (the oldest or the newest dropped), each metric keeps every
        ``stride``-th of its points (counted from its first), and the stride
        doubles on each overflow: the run holds the whole curve, evenly, at a
        coarser step; each metric's newest point is kept too, and sent at the
        close. The stride halves again whenever the store has caught up.
        Warned about the first time, and again each time the count of points
        dropped has doubled since.
        """
        limit = self.config.max_pending
        before = len(self._points)
        held = len(self._tail)
        while len(self._points) > limit:
            self._stride *= 2
            stride = self._stride
            kept: list[tuple[int, Point]] = []
            seen = set(self._tail)  # metrics whose newest point is held already
            for entry in reversed(self._points):  # from the newest back
                key = entry[1][0]
                if entry[0] % stride == 0:
                    kept.append(entry)
                elif key not in seen:
                    self._tail[key] = entry[1]  # off the grid now, but its newest
                seen.add(key)
            kept.reverse()
            self._points = kept
            if self._stride > 1 << 40:  # one point per metric and still too many
                self._points = self._points[len(self._points) - limit :]
        self._drop_now(before + held - len(self._points) - len(self._tail))
        if self.dropped < 2 * self._thinning_said:
            return
        self._thinning_said = self.dropped
        log.warning(
            "monitored-mlflow: the store %s takes fewer points than the training makes: "
            "%d points pending, over max_pending=%d, so each metric now keeps one point in "
            "%d (and its newest): the run gets the whole curve, at a coarser step; %d points "
            "dropped so far (said again when that has doubled)",
            self._where(),
            before,
            limit,
            self._stride,
            self.dropped,
        )

    def add_params(self, params: Mapping[str, str]) -> None:
        self._update(self._params, params)

    def add_tags(self, tags: Mapping[str, str]) -> None:
        self._update(self._tags, tags)

    def _update(self, pending: dict[str, str], new: Mapping[str, str]) -> None:
        with self._cond:
            self.received += len(new)
            if self._stopped:
                self._drop_now(len(new))
                return
            self.settled += len(new.keys() & pending.keys())  # superseded before sent
            pending.update(new)
            self._cond.notify()

    def add_artifact(self, local_path: str, artifact_path: str) -> None:
        with self._cond:
            self.received += 1
            if self._stopped:
                self._drop_now(1)
                return
            self._artifacts.append((local_path, artifact_path))
            self._cond.notify()

    def _drop_now(self, count: int) -> None:
        """Count ``count`` received items as dropped (the caller holds the lock)."""
        self.dropped += count
        self.settled += count

    def _drop_pending(self) -> int:
        """Drop whatever is not settled yet, counted; how many that was."""
        with self._cond:
            left = max(0, self.received - self.settled)
            self._points, self._params, self._tags, self._artifacts = [], {}, {}, []
            self._tail = {}
            self._drop_now(left)
            return left

    def close(self, status: str, timeout: float) -> bool:
        """End the run with ``status`` once what is pending is sent, waiting at most ``timeout``.

        Returns whether the run ended so in time; what was not sent is dropped
        and warned about (the thread, a daemon, is left to its last call: the
        process exits after this).
        """
        with self._cond:
            self._status = status
            self._deadline = time.monotonic() + max(0.0, timeout)
            self._end_by = self._deadline - min(END_RESERVE_SECS, max(0.0, timeout) / 5)
            self._cond.notify()
        self._wake.set()
        if self._done.wait(max(0.0, timeout)):
            left = self._drop_pending()
            if self._stopped:
                log.warning(
                    "monitored-mlflow: the run was not ended (the sender had stopped); "
                    "%d items dropped at the close, %d in all",
                    left,
                    self.dropped,
                )
            return self.ended_as == status
        left = self._drop_pending()
        log.warning(
            "monitored-mlflow: the tracking server %s did not take what was pending within "
            "the session's grace period (%.3gs): %d items dropped, %d in all; the run is left "
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
            self._report(("run", self.run_id))
            # Only once the run exists (the session's start waits for it): then the
            # sending gives way to training where the cores are busy. On Linux this
            # thread only; the one reading the pipe keeps up at the normal priority.
            if hasattr(os, "nice"):
                os.nice(NICENESS)  # lowering one's own priority is always allowed
            while True:
                with self._cond:
                    while not self._has_work() and self._status is None:
                        self._cond.wait()
                    status = self._status
                    if status is not None and time.monotonic() >= self._end_by:
                        self._out_of_time()
                    params, self._params = self._params, {}
                    tags, self._tags = self._tags, {}
                    # One request's worth at a time: points coming meanwhile are
                    # thinned if they pile up, and the close is never far off.
                    if status is not None and not self._points and self._tail:
                        # Closing: each metric's newest point goes last.
                        self._points = [(0, point) for point in self._tail.values()]
                        self._tail = {}
                    points = [point for _, point in self._points[:MAX_METRICS_PER_BATCH]]
                    del self._points[:MAX_METRICS_PER_BATCH]
                    if not self._points and self._stride > 1:
                        self._stride //= 2  # the store caught up: a finer step again
                    # The steps all of whose points are in once this batch is: those
                    # before the first pending step (points come in step order).
                    complete_through = self._points[0][1][3] - 1 if self._points else None
                    artifacts, self._artifacts = self._artifacts, []
                count = len(params) + len(tags) + len(points)
                if count:
                    self._send_batch(client, params, tags, points, complete_through)
                for local_path, artifact_path in artifacts:
                    self._send_artifact(client, local_path, artifact_path)
                with self._cond:
                    self.settled += count + len(artifacts)
                    finished = status is not None and not self._has_work()
                self._report(("counts", self.sent, self.dropped, self.settled))
                if finished:
                    assert status is not None
                    self._terminate(client, status)
                    return
        except Exception as exc:  # never into the training: the run is left as it is
            with self._cond:
                self._stopped = True
            if self.run_id is None:
                self._report(("norun",))
            log.warning(
                "monitored-mlflow: the sender stopped: %s; nothing more is logged for this run "
                "(what comes is dropped and counted)",
                _describe(exc),
            )
        finally:
            self._done.set()

    def _has_work(self) -> bool:
        return bool(
            self._points
            or self._params
            or self._tags
            or self._artifacts
            or (self._status is not None and self._tail)
        )

    def _out_of_time(self) -> None:
        """Closing, and the grace period is all but gone: drop what is pending (lock held)."""
        left = len(self._points) + len(self._tail)
        if not left:
            return
        self._points, self._tail = [], {}
        self._drop_now(left)
        log.warning(
            "monitored-mlflow: the store %s did not take what was pending within the "
            "session's grace period: %d points dropped, %d in all; the run is ended with what "
            "it has",
            self._where(),
            left,
            self.dropped,
        )

    def _connect(self) -> MlflowClient | None:
        """Import MLflow, then find or create the experiment and the run (with retries)."""
        try:
            from mlflow import MlflowClient
        except Exception as exc:  # missing, or broken: an error inside MLflow's own import
            raise ImportError(
                f"could not import MLflow with {sys.executable} ({_describe(exc)})"
            ) from exc

        client = MlflowClient(self.config.tracking_uri)
        pause = self.config.backoff_secs
        told = False
        while True:
            run_id = self._retrying("create the MLflow run", 0, lambda: self._open_run(client))
            if run_id is not None or self._wake.is_set():
                break
            if not told:  # the training waits for the run no longer
                told = True
                self._report(("norun",))
            # The server is down from the start: items wait (up to max_pending) for it.
            self._wake.wait(pause)
            pause = min(pause * 2, 30.0)
        if run_id is None:
            self._drop_pending()
            log.warning(
                "monitored-mlflow: closing, and the run was never created on %s: %d items "
                "dropped in all; the run is left uncreated",
                self._where(),
                self.dropped,
            )
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
            run = client.create_run(
                experiment_id,
                start_time=config.start_time_ms,
                tags=tags,
                run_name=config.run_name,
            )
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
                self.settled += 1
        client.update_run(run_id, status="RUNNING")
        return run_id

    def _send_batch(
        self,
        client: MlflowClient,
        params: Mapping[str, str],
        tags: Mapping[str, str],
        points: list[Point],
        complete_through: int | None = None,
    ) -> None:
        """Send in batches within MLflow's limits; ``complete_through``: the steps all in."""
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.run_id
        assert run_id is not None
        points = [p for p in points if p[3] > self.skip_through]
        metrics = [Metric(key, value, stamp, step) for key, value, stamp, step in points]
        param_list = [Param(key, value) for key, value in params.items()]
        tag_list = [RunTag(key, value) for key, value in tags.items()]
        if points:
            last = max(p[3] for p in points)
            if complete_through is not None:
                last = min(last, complete_through)
            if last > max(self.skip_through, self._tagged_step):
                self._tagged_step = last
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

            # The step tag is the writer's own, no item of the training's.
            count = len(chunk_metrics) + len(chunk_params)
            count += sum(1 for t in chunk_tags if t.key != STEP_TAG)
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
        # Closing, a server that has been failing gets one more try, not the grace period.
        tries = 1 if self._failing and self._wake.is_set() else self.config.retries + 1
        for attempt in range(tries):
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
                if not self._warned and not self._failing:
                    self._warned = True
                    log.warning(
                        "monitored-mlflow: the tracking server %s does not answer (%s); "
                        "training goes on: the plugin retries in the background, and drops "
                        "and counts what it cannot send",
                        self._where(),
                        _describe(exc),
                    )
                continue
            if self._failing or self._warned:
                self._failing = self._warned = False
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
        self._warned = self._failing
        return None

    def _where(self) -> str:
        return self.config.tracking_uri or "(MLflow's default store)"


# -- the process ----------------------------------------------------------------------------
class _Channel:
    """The pipe back to the training process; writes from any thread, never raises."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._broken = False

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                write_frame(self._fd, message)
            except OSError:  # the training process is gone
                self._broken = True


class _Forward(logging.Handler):
    """Hands this process's ``monitored.mlflow`` records to the training process's logger."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        self._channel.send(("log", record.levelno, record.getMessage()))


def _serve(writer: RunWriter, parent: int) -> tuple[str, float]:
    """Hand the frames to ``writer`` until the close: its status and seconds left."""
    while True:
        readable, _, _ = select.select([0], [], [], PARENT_CHECK_SECS)
        if not readable:
            if os.getppid() != parent:  # killed, while another process holds the pipe open
                return "KILLED", ORPHAN_SECS
            continue
        message = read_frame(0)
        if message is None:  # the training process is gone without closing the run
            return "KILLED", ORPHAN_SECS
        if message[0] == "items":
            writer.add(message[1], message[2])
        elif message[0] == "close":
            return str(message[1]), float(message[2])
        else:
            raise ProtocolError(f"a message of unknown kind {message[0]!r}")


def main() -> None:
    """The sender process: serve the training process on stdin and stdout, then exit.

    The first frame is ``("start", config, records, items)``; then ``("items",
    records, items)`` frames, and ``("close", status, seconds)``. Back go
    ``("run", ...)`` (or ``("norun",)``), ``("counts", ...)`` and ``("log", level, text)`` frames,
    and ``("done", ended_as, sent, dropped, settled)`` last.
    """
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # Blocked since the start (the training's thread that started this process
    # blocked them): any that came meanwhile are discarded now, ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)  # before MLflow reads them
    # MLflow's INFO lines ("Creating initial MLflow database tables...") would reach
    # the training's stderr; its warnings still do. The user's own setting wins.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    channel = _Channel(os.dup(1))
    os.dup2(2, 1)  # what a library prints goes to stderr, not into the frames
    parent = os.getppid()
    start = read_frame(0)
    if not isinstance(start, tuple) or not start or start[0] != "start":
        raise ProtocolError("the first frame is not the start")
    writer = RunWriter(SenderConfig(**start[1]), channel.send)
    log.addHandler(_Forward(channel))
    log.propagate = False
    writer.add(start[2], start[3])  # parameters before the run is found (a resume compares)
    writer.start()
    status, seconds = _serve(writer, parent)
    writer.close(status, seconds)
    channel.send(("done", writer.ended_as, writer.sent, writer.dropped, writer.settled))
    sys.stderr.flush()
    # Not the interpreter's exit: a thread may still be in a request after the grace
    # period, and MLflow's exit handlers may wait on it.
    os._exit(0)


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


if __name__ == "__main__":
    main()
