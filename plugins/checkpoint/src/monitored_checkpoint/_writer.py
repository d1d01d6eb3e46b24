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

    def __init__(self, step: int, target: str) -> None:
        #: The global step the checkpoint holds.
        self.step = step
        #: What is being written, for messages (``dir/model.ckpt-<step>``).
        self.target = target
        #: Set when the write has finished, well or not.
        self.done = threading.Event()
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

    The thread starts with the first write and ends once idle after :meth:`close`,
    after a stop request on the coordinator, or when the main thread has exited.
    """

    __slots__ = (
        "__weakref__",
        "_closing",
        "_cond",
        "_coord",
        "_exit_wait",
        "_job",
        "_thread",
        "name",
        "pending",
    )

    def __init__(
        self, coord: Coordinator | None = None, *, name: str = "checkpoint-writer"
    ) -> None:
        self._coord = coord
        self._cond = threading.Condition()
        self._job: Job | None = None
        self._thread: threading.Thread | None = None
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

    def submit(self, step: int, target: str, work: Callable[[], str]) -> PendingWrite:
        """Start ``work()`` (which writes and returns the path) in the worker thread.

        Raises ``RuntimeError`` if a write is still in flight: callers wait first.
        """
        with self._cond:
            if self.busy:
                raise RuntimeError(
                    f"a checkpoint write is still in flight ({self.pending}); wait for it first"
                )
            job = PendingWrite(step, target)
            self.pending = job
            self._job = (job, work)
            self._closing = False
            if self._thread is None:
                # A daemon: an exit waits for its write through _wait_at_exit, bounded.
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                if self._coord is not None:
                    self._coord.register_thread(self._thread)
                _register(self)
                self._thread.start()
            self._cond.notify_all()
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
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _should_exit(self) -> bool:
        return (
            self._closing
            or (self._coord is not None and self._coord.should_stop())
            or not threading.main_thread().is_alive()
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None:
                    if self._should_exit():
                        self._thread = None
                        return
                    self._cond.wait(0.25)
                job, work = self._job
            self._execute(job, work)
            with self._cond:
                # Cleared before `done` is set: the owner may submit the next
                # write as soon as it sees `done`.
                self._job = None
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
