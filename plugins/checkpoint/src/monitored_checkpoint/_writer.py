"""``BackgroundWriter``: checkpoint writes in a worker thread, at most one at a time.

A real thread rather than an anyio task: a task only runs when the step loop
yields to the event loop, which a loop of synchronous steps and hooks never does,
so a write started as a task would not start until the session closes. The
thread is registered with the session's :class:`~monitored.Coordinator`, which
joins it (with the grace period) however the session closes.

An interpreter exit waits for a write in flight, but not forever: a write to a
filesystem that stopped answering (an NFS server gone) would otherwise hold the
process at exit for good. The thread is a daemon, and an ``atexit`` handler
waits up to ``MONITORED_CHECKPOINT_EXIT_WAIT_SECS`` (default
:data:`DEFAULT_EXIT_WAIT_SECS`) for the writes in flight, then names each one
still running on stderr and lets the process exit. Such a checkpoint is never
taken for a good one: its files are written under temporary names and renamed
into place only once complete, the manifest last.

A failed write is wrapped in :class:`CheckpointWriteError` (path, step, cause)
and handed to ``coord.request_stop``: the session stops at the next step
boundary and raises it, from the next ``run`` or from ``async with``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, final

import anyio.to_thread

from ._errors import CheckpointWriteError

if TYPE_CHECKING:
    from monitored import Coordinator

__all__ = ["DEFAULT_EXIT_WAIT_SECS", "EXIT_WAIT_ENV", "BackgroundWriter", "PendingWrite"]

log = logging.getLogger("monitored.checkpoint")

#: How long an interpreter exit waits for the checkpoint writes in flight, in seconds.
EXIT_WAIT_ENV: Final = "MONITORED_CHECKPOINT_EXIT_WAIT_SECS"
#: The default: a large checkpoint on a slow store finishes; a hung store is left.
DEFAULT_EXIT_WAIT_SECS: Final = 300.0


def exit_wait_secs() -> float:
    """``MONITORED_CHECKPOINT_EXIT_WAIT_SECS``, checked: a number of seconds >= 0."""
    raw = os.environ.get(EXIT_WAIT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_EXIT_WAIT_SECS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0 or math.isinf(seconds):
        raise ValueError(
            f"{EXIT_WAIT_ENV}={raw!r}: it must be a number of seconds >= 0 (how long an "
            "interpreter exit waits for a checkpoint write in flight)"
        )
    return seconds


#: The writers whose thread runs, for the exit handler.
_LIVE: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_HANDLER_REGISTERED = False


def _register(writer: BackgroundWriter) -> None:
    global _HANDLER_REGISTERED
    with _LIVE_LOCK:
        _LIVE.add(writer)
        if not _HANDLER_REGISTERED:
            atexit.register(_wait_at_exit)
            _HANDLER_REGISTERED = True


def _wait_at_exit() -> None:
    """At interpreter exit: wait a bounded time for writes in flight, then name the rest."""
    with _LIVE_LOCK:
        writers = list(_LIVE)
    running = [w.pending for w in writers if w.pending is not None and w.busy]
    if not running:
        return
    wait = max(w._exit_wait for w in writers)
    started = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop waiting, still say so
        for job in running:
            if job is not None:
                job.done.wait(max(0.0, started + wait - time.monotonic()))
    waited = time.monotonic() - started
    for job in running:
        if job is None or job.done.is_set():
            continue
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                f"monitored-checkpoint: checkpoint {job.target} (step {job.step}) was still "
                f"being written when the interpreter exited, after waiting {waited:.1f}s "
                f"({EXIT_WAIT_ENV}={wait:g}; a filesystem that stopped answering?). It is "
                "left as it is and may be incomplete; it is not taken as a checkpoint: its "
                "files are renamed into place only once complete, and a restore finds the "
                "newest complete checkpoint.\n"
            )
            sys.stderr.flush()


@final
class PendingWrite:
    """One checkpoint write handed to the :class:`BackgroundWriter`."""

    __slots__ = ("delivered", "done", "error", "finished", "path", "started", "step", "target")

    def __init__(self, step: int, target: str, done: threading.Event | None = None) -> None:
        #: The global step the checkpoint holds.
        self.step = step
        #: What is being written, for messages (``dir/model.ckpt-<step>``).
        self.target = target
        #: Set when the write has finished, well or not.
        self.done = done if done is not None else threading.Event()
        #: The checkpoint's path once written.
        self.path: str | None = None
        #: The failure, if the write failed.
        self.error: CheckpointWriteError | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        #: Whether the owner has acted on the result (``after_save`` listeners).
        self.delivered = False

    @property
    def seconds(self) -> float | None:
        """How long the write took (``None`` while it runs)."""
        return None if self.finished is None else self.finished - self.started

    def __repr__(self) -> str:
        status = "failed" if self.error else "done" if self.done.is_set() else "running"
        return f"<PendingWrite step {self.step} {self.target} {status}>"


Job = tuple[PendingWrite, Callable[[], str]]


@final
class BackgroundWriter:
    """Runs checkpoint writes in one worker thread, at most one at a time.

    The thread starts with :meth:`start` or the first write, and ends once idle
    after :meth:`close`, after a stop request on the coordinator, or when the
    main thread has exited. Jobs reach it through a ``queue.SimpleQueue``: handing
    one over costs the step loop a C call, not a ``threading.Condition``'s Python.
    """

    __slots__ = (
        "__weakref__",
        "_closing",
        "_coord",
        "_exit_wait",
        "_jobs",
        "_lock",
        "_spare",
        "_thread",
        "name",
        "pending",
    )

    def __init__(
        self, coord: Coordinator | None = None, *, name: str = "checkpoint-writer"
    ) -> None:
        self._coord = coord
        self._lock = threading.Lock()
        #: Jobs for the thread; ``None`` wakes it to see whether it should end.
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: The next write's ``done`` event, made ahead by the worker thread after
        #: each write: a ``threading.Event`` costs the step loop 15-20 us to make
        #: after an idle spell (a ``Condition`` whose set-up raises three times).
        self._spare: threading.Event | None = threading.Event()
        self._closing = False
        #: How long an interpreter exit waits for this writer's write in flight.
        self._exit_wait = exit_wait_secs()
        self.name = name
        #: The latest write handed over (finished or not), or ``None``.
        self.pending: PendingWrite | None = None

    @property
    def busy(self) -> bool:
        """Whether a write is in flight."""
        return self.pending is not None and not self.pending.done.is_set()

    def start(self) -> None:
        """Start the worker thread now, idle: the first write then does not wait for it.

        A thread's start takes a tenth of a millisecond or more, which the saver
        hook spends at the session's start rather than in the first save's step.
        """
        with self._lock:
            self._closing = False
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        """Start the worker thread unless it runs (the caller holds ``_lock``)."""
        if self._thread is None:
            # A daemon: an exit waits for its write through _wait_at_exit, bounded.
            thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread = thread
            if self._coord is not None:
                self._coord.register_thread(thread)
            _register(self)
            thread.start()

    def submit(self, step: int, target: str, work: Callable[[], str]) -> PendingWrite:
        """Start ``work()`` (which writes and returns the path) in the worker thread.

        Raises ``RuntimeError`` if a write is still in flight: callers wait first.
        """
        done, self._spare = self._spare, None
        job = PendingWrite(step, target, done)
        with self._lock:
            if self.busy:
                raise RuntimeError(
                    f"a checkpoint write is still in flight ({self.pending}); wait for it first"
                )
            self.pending = job
            self._closing = False
            self._jobs.put((job, work))
            self._ensure_thread()
        return job

    async def wait(self) -> PendingWrite | None:
        """Wait (without blocking the event loop) until no write is in flight."""
        job = self.pending
        if job is not None and not job.done.is_set():
            # Not abandoned on cancellation: the write always runs to its end.
            await anyio.to_thread.run_sync(job.done.wait)
        return job

    def wait_blocking(self, timeout: float | None = None) -> bool:
        """Block until no write is in flight; ``False`` if ``timeout`` ran out first."""
        job = self.pending
        return job is None or job.done.wait(timeout)

    def close(self) -> None:
        """Let the worker thread end once the write in flight (if any) is done."""
        with self._lock:
            self._closing = True
            if self._thread is not None:
                self._jobs.put(None)

    def _should_exit(self) -> bool:
        return (
            self._closing
            or (self._coord is not None and self._coord.should_stop())
            or not threading.main_thread().is_alive()
        )

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            try:
                item = jobs.get(timeout=0.25)
            except queue.Empty:
                item = None
            if item is None:
                with self._lock:
                    # Under the lock that submit holds to queue a job: none is lost.
                    if jobs.empty() and self._should_exit():
                        self._thread = None
                        return
                continue
            job, work = item
            self._execute(job, work)
            if self._spare is None:  # for the next write: the owner waits for `done` first
                self._spare = threading.Event()
            job.finished = time.monotonic()
            job.done.set()

    def _execute(self, job: PendingWrite, work: Callable[[], str]) -> None:
        try:
            job.path = work()
        except BaseException as exc:
            error = CheckpointWriteError(
                f"writing checkpoint {job.target} (step {job.step}) failed: "
                f"{type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            job.error = error
            if self._coord is not None:
                self._coord.request_stop(error)
            else:
                log.error("%s", error)
            return
        log.debug("wrote %s", job.path)
