"""The training process's side of the sender: queue on the step, ship in the background.

The step loop only appends a step's converted scalars to a deque
(:meth:`Sender.add_metrics`: no lock, no I/O). A thread of the training process
wakes every ``flush_secs``, pickles what has gathered and writes it to a pipe;
a process of its own (:mod:`monitored_mlflow._writer`, started as a script with
the same Python) does everything that talks to MLflow. MLflow's client work
(SQLAlchemy's ORM for a local store, JSON and HTTP for a server) then never
holds the training process's GIL: what the training pays for a due step is the
conversion, an append, and a share of one ``pickle.dumps`` a second.

A second thread reads what the sender process reports: the run's id, counts of
what was sent and dropped, and its warnings, which are logged here by the
``monitored.mlflow`` logger. When the sender process dies (killed, out of
memory) training goes on: one warning names the plugin and counts what was
lost with it, and what is queued later is dropped and counted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

from ._writer import (
    IGNORED_SIGNALS,
    RUN_KEY_TAG,
    STEP_TAG,
    Record,
    SenderConfig,
    read_frame,
    write_frame,
)

__all__ = ["RUN_KEY_TAG", "STEP_TAG", "Sender", "SenderConfig"]

log = logging.getLogger("monitored.mlflow")

#: The script the sender process runs.
WRITER_SCRIPT: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_writer.py")
#: The shipping thread wakes at most this often (``flush_secs=0`` ships every 50 ms).
MIN_FLUSH_SECS: Final = 0.05
#: Steps' records in one frame: frames stay far below the reader's size limit.
FRAME_RECORDS: Final = 10_000
#: The fewest steps' records the training process keeps between two shipments
#: (``max_pending`` if larger): the queue fills only when the sender process
#: stops reading, not because ``max_pending`` is small.
MIN_QUEUED_RECORDS: Final = 10_000
#: How long past the grace period the training process waits for the sender
#: process's last word before it stops it (the process keeps the grace period itself).
CLOSE_MARGIN_SECS: Final = 2.0


class Sender:
    """Queues metrics, parameters, tags and artifacts for one MLflow run, sent by a process.

    ``run_id`` (once the run exists), ``sent`` (metric points) and ``dropped``
    (points, parameters, tags and artifacts sent to nobody) follow what the
    sender process reports.
    """

    def __init__(self, config: SenderConfig) -> None:
        self.config = config
        self._records: deque[Record] = deque()
        self._items: deque[tuple[Any, ...]] = deque()
        self._max_pending = max(config.max_pending, MIN_QUEUED_RECORDS)
        self._closing: tuple[str, float] | None = None
        self._wake = threading.Event()
        #: Set once the sender process is gone (or never started): nothing more to wait for.
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        #: Under ``_lock``: whether the process is gone, items written to its pipe, and
        #: its count of items it is done with (sent, dropped, skipped).
        self._gone = False
        self._shipped = 0
        self._settled = 0
        self._finished = False
        self._abandoned = False
        self._their_dropped = 0
        self._our_dropped = 0
        #: Records the step loop found no room for (only its own thread adds to it).
        self._overflowed = 0
        #: The MLflow run, once the sender process created or found it.
        self.run_id: str | None = config.run_id
        #: Set once the run exists, or a first try to create it failed, or the sender
        #: process is gone: what :meth:`wait_for_run` waits for.
        self._opened = threading.Event()
        #: Metric points sent.
        self.sent = 0
        #: The status the run was ended with, once it was.
        self.ended_as: str | None = None
        self._thread = threading.Thread(target=self._ship, name="monitored-mlflow", daemon=True)

    @property
    def pid(self) -> int | None:
        """The sender process's id, once it started."""
        return None if self._process is None else self._process.pid

    @property
    def done(self) -> bool:
        """Whether the sender process is gone (or never started)."""
        return self._done.is_set()

    @property
    def dropped(self) -> int:
        """Metric points, parameters, tags and artifacts dropped (sent to nobody)."""
        return self._their_dropped + self._our_dropped + self._overflowed

    # -- the step loop's side ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def opened(self) -> bool:
        """Whether the run exists, or a first try to create it failed, or the process is gone.

        What the session's start waits for (bounded by ``start_timeout_secs``).
        """
        return self._opened.is_set()

    def wait_opened(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for :attr:`opened`; whether it is."""
        return self._opened.wait(max(0.0, timeout))

    def add_metrics(self, step: int, values: dict[str, float]) -> None:
        """Queue ``values`` (kept, not copied) at ``step``: an append, on any step."""
        records = self._records
        if len(records) < self._max_pending:
            records.append((step, int(time.time() * 1000), values))
        else:  # the sender process does not read: the newest go
            self._overflowed += len(values)

    def add_params(self, params: Mapping[str, str]) -> None:
        self._items.append(("params", dict(params)))

    def add_tags(self, tags: Mapping[str, str]) -> None:
        self._items.append(("tags", dict(tags)))

    def add_artifact(self, local_path: str, artifact_path: str) -> None:
        self._items.append(("artifact", local_path, artifact_path))

    def close(self, status: str, timeout: float) -> bool:
        """End the run with ``status`` once what is pending is sent, waiting at most ``timeout``.

        The sender process gets the grace period and keeps it (what it has not
        sent by then is dropped and warned about there); one that does not
        answer a little after it is stopped. Returns whether the run ended as
        ``status``.
        """
        timeout = max(0.0, timeout)
        self._closing = (status, time.monotonic() + timeout)
        self._wake.set()
        if not self._thread.is_alive() and not self._done.is_set():
            return False  # never started
        if not self._done.wait(timeout + CLOSE_MARGIN_SECS):
            self._abandoned = True
            process = self._process
            if process is not None:
                process.kill()
            self._done.wait(CLOSE_MARGIN_SECS)
            log.warning(
                "monitored-mlflow: the sender process did not finish within the session's "
                "grace period (%gs) and was stopped: %d items dropped in all; the run is left "
                "%s",
                timeout,
                self.dropped,
                "RUNNING" if self.run_id is not None else "uncreated",
            )
            return False
        if not self._finished and not self._abandoned:
            self._drain_dropped()
            log.warning(
                "monitored-mlflow: the run %s is not ended (the sender process could not start "
                "or exited): %d items dropped in all",
                self.run_id or "(uncreated)",
                self.dropped,
            )
        elif self._finished and self._overflowed + self._our_dropped:
            # The sender process counted only what reached it: say the whole of it.
            log.warning(
                "monitored-mlflow: run %s ended %s; %d items dropped in all, %d of them in the "
                "training process (the sender process did not read them in time: at most "
                "%d steps wait there)",
                self.run_id,
                self.ended_as,
                self.dropped,
                self._overflowed + self._our_dropped,
                self._max_pending,
            )
        return self.ended_as == status

    # -- the shipping thread ----------------------------------------------------------------
    def _ship(self) -> None:
        try:
            # Blocked in this thread, SIGINT and SIGTERM are blocked in the sender
            # process from its first instruction on (the mask goes through fork and
            # exec) until it ignores them: a Ctrl-C while it starts cannot kill it.
            # The training process's handlers run as before (another thread gets them).
            signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
            process = self._spawn()
            if process is None:
                return
            first = True
            while True:
                closing = self._closing  # read first: what was queued before is shipped
                records, items = self._drain()
                while first or records or items:
                    chunk, records = records[:FRAME_RECORDS], records[FRAME_RECORDS:]
                    if first:
                        config = dataclasses.asdict(self.config)
                        self._send(process, ("start", config, chunk, items), chunk, items)
                        first = False
                    else:
                        self._send(process, ("items", chunk, items), chunk, items)
                    items = []
                if closing is not None:
                    seconds = max(0.0, closing[1] - time.monotonic())
                    self._send(process, ("close", closing[0], seconds), [], [])
                    return
                self._wake.wait(max(self.config.flush_secs, MIN_FLUSH_SECS))
        except Exception as exc:  # never into the training
            log.warning("monitored-mlflow: the shipping thread stopped: %r", exc)
            process = self._process
            if process is not None and process.stdin is not None:
                process.stdin.close()  # the sender process sends what it has, and ends

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        """Start the sender process and its reader thread; ``None`` (warned) if it cannot start."""
        # -P: not the working directory first on sys.path (a file of the user's there
        # must not stand in for a module MLflow imports); the working directory and
        # the environment are the training's, so MLflow finds the same store.
        command = [sys.executable, "-P", WRITER_SCRIPT]
        try:
            if not sys.executable:
                raise OSError("this interpreter does not know its own executable")
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                # Its own process group: a Ctrl-C (to the terminal's foreground group)
                # does not reach it; it ends when the training closes the run, or dies.
                process_group=0,
            )
        except OSError as exc:
            with self._lock:
                self._gone = True
            self._drain_dropped()
            log.warning(
                "monitored-mlflow: could not start the sender process (%s: %s); nothing is "
                "logged to MLflow for this run, training goes on",
                " ".join(command),
                exc,
            )
            self._opened.set()
            self._done.set()
            return None
        self._process = process
        threading.Thread(
            target=self._read, args=(process,), name="monitored-mlflow-reader", daemon=True
        ).start()
        return process

    def _drain(self) -> tuple[list[Record], list[tuple[Any, ...]]]:
        """What the step loop queued so far (appends go on meanwhile, none lost)."""
        records, items = self._records, self._items
        return (
            [records.popleft() for _ in range(len(records))],
            [items.popleft() for _ in range(len(items))],
        )

    def _drain_dropped(self) -> None:
        records, items = self._drain()
        with self._lock:
            self._our_dropped += _count(records, items)

    def _send(
        self,
        process: subprocess.Popen[bytes],
        message: tuple[Any, ...],
        records: list[Record],
        items: list[tuple[Any, ...]],
    ) -> None:
        count = _count(records, items)
        assert process.stdin is not None
        # Under the lock: the reader counting what a dead process left unsent sees
        # every item shipped before it, and none after.
        with self._lock:
            if self._gone:
                self._our_dropped += count
                return
            try:
                write_frame(process.stdin.fileno(), message)
            except OSError:  # it died; the reader says so
                self._our_dropped += count
            else:
                self._shipped += count

    # -- the reading thread -----------------------------------------------------------------
    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        error: Exception | None = None
        try:
            while (message := read_frame(process.stdout.fileno())) is not None:
                kind = message[0]
                if self._finished:  # a thread past the grace period: its count is stale
                    continue
                if kind == "log":
                    log.log(message[1], "%s", message[2])
                elif kind == "run":
                    self.run_id = message[1]
                    self._opened.set()
                elif kind == "norun":
                    self._opened.set()
                elif kind == "counts":
                    self.sent, self._their_dropped, settled = message[1:]
                    with self._lock:
                        self._settled = settled
                elif kind == "done":
                    self.ended_as, self.sent, self._their_dropped, settled = message[1:]
                    with self._lock:
                        self._settled = settled
                        self._finished = True
        except Exception as exc:  # a cut or malformed frame: as if it had died
            error = exc
        finally:
            process.stdout.close()
            with self._lock:
                self._gone = True
                lost = max(0, self._shipped - self._settled)
                self._our_dropped += lost
            code = process.wait()
            assert process.stdin is not None
            process.stdin.close()
        self._opened.set()
        if not self._finished and not self._abandoned:
            log.warning(
                "monitored-mlflow: the sender process (pid %d) %s before the run was closed%s: "
                "%d items it had not sent are dropped, and what comes is dropped and counted; "
                "training goes on",
                process.pid,
                _how_it_ended(code),
                "" if error is None else f" ({type(error).__name__}: {error})",
                lost,
            )
        self._done.set()


def _count(records: list[Record], items: list[tuple[Any, ...]]) -> int:
    """Items in a frame: every metric point, parameter and tag, and each artifact."""
    count = sum(len(values) for _, _, values in records)
    for item in items:
        count += 1 if item[0] == "artifact" else len(item[1])
    return count


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
