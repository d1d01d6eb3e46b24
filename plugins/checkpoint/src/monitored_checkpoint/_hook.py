"""``CheckpointSaverHook``: TF1's checkpoint hook, asynchronous and preemption-safe.

Timing is TF1's: a checkpoint at session creation unless one exists for the
current step, one every ``save_steps`` steps or ``save_secs`` seconds, and one at
``end`` unless the last step was just saved. The step loop pays only for the
snapshot to host memory; a worker thread writes (``_writer``). When a save falls
due while the previous one is still being written, the loop waits for that
write first: at most one write in flight and one snapshot in host memory.

The hook also restores: its ``restore_state`` implementation (the core's
firstresult hookspec) restores the newest valid checkpoint of its directory on
the chief, so a plain ``MonitoredSession(hooks=[CheckpointSaverHook(...)])``
resumes as ``MonitoredTrainingSession`` does.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar, Final, final

import anyio.to_thread

from monitored import SecondOrStepTimer

from . import _capability
from ._errors import CorruptCheckpointWarning
from ._format import Snapshot, SnapshotBuffers, take_snapshot
from ._preemption import SignalWatcher
from ._saver import Saver, check_basename, restore_latest_quietly
from ._store import fixed_directory, open_store
from ._writer import BackgroundWriter, PendingWrite

if TYPE_CHECKING:
    from monitored import (
        BackgroundSpan,
        Coordinator,
        MonitoredSession,
        SessionRunContext,
        SessionRunValues,
        TrainState,
    )

__all__ = ["CheckpointRestoreHook", "CheckpointSaverHook", "CheckpointSaverListener"]

log = logging.getLogger("monitored.checkpoint")


class CheckpointSaverListener:
    """TF1's ``CheckpointSaverListener``: called around each save of a saver hook.

    Subclass it (or pass any object with some of these methods; each may be
    ``async``) in ``CheckpointSaverHook(listeners=[...])``. ``after_save`` runs
    once the checkpoint is complete on disk; returning ``True`` requests a stop.

    As in TF1, a listener that overrides ``after_save`` hears of each save before
    the next step: the hook then waits for each write to finish
    (:attr:`synchronous_after_save`). Set that attribute to ``False`` on a
    listener that can hear of it later (at the first step boundary after the
    write finished), so that saves stay asynchronous.
    """

    #: Whether the saver hook waits for each write so that ``after_save`` runs
    #: before the next step (TF1's timing, the default for listeners); with
    #: ``False`` it runs at the first step boundary after the write finished,
    #: and a stop it requests takes effect there.
    synchronous_after_save: ClassVar[bool] = True

    def begin(self) -> Any:
        """Called once, when the session begins."""

    def before_save(self, session: MonitoredSession, global_step_value: int) -> Any:
        """Called before the snapshot of ``global_step_value`` is taken."""

    def after_save(self, session: MonitoredSession, global_step_value: int) -> Any:
        """Called when the checkpoint of ``global_step_value`` is written; ``True`` stops."""

    def end(self, session: MonitoredSession, global_step_value: int) -> Any:
        """Called at the end, after the last save."""


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


#: Below this many bytes of state, a NumPy snapshot is copied on the loop's own
#: thread: handing it to a worker thread and back costs more than the copy.
_INLINE_SNAPSHOT_BYTES: Final = 16 << 20


def _listens_synchronously(listener: object) -> bool:
    """Whether a ``listeners=`` entry must hear of each save before the next step.

    One that implements ``after_save`` (a :class:`CheckpointSaverListener`
    subclass only if it overrides it) and does not set ``synchronous_after_save``
    to ``False``: TF1's timing is the default for the listeners a user hands the hook.
    """
    method = getattr(type(listener), "after_save", None)
    if method is None and not hasattr(listener, "after_save"):
        return False
    if method is not None and method is CheckpointSaverListener.after_save:
        return False
    return getattr(listener, "synchronous_after_save", True) is not False


def _plugin_listens_synchronously(plugin: object) -> bool:
    """Whether a hook or plugin asks for its ``after_save`` hookspec before the next step.

    Only on request (``synchronous_after_save = True`` on the object, or at the
    top of a plugin module): other ``after_save`` implementations hear of a save
    at the first step boundary after its write finished, so that a summaries or
    tracking plugin listening to saves does not make every save wait for the disk.
    """
    return getattr(plugin, "synchronous_after_save", False) is True


@final
class CheckpointRestoreHook:
    """Restores the newest valid checkpoint of ``checkpoint_dir`` on the chief; saves none.

    What ``MonitoredTrainingSession(checkpoint_dir=..., save_checkpoint_secs=None,
    save_checkpoint_steps=None)`` gets: TF1 restores from ``checkpoint_dir`` even
    when it is not to write checkpoints.
    """

    __slots__ = ("checkpoint_dir",)

    #: Passed in ``hooks=[...]``, it owns the session's checkpoints: the installed
    #: ``checkpoint`` plugin steps aside.
    provides: ClassVar[frozenset[str]] = frozenset({"checkpoint"})
    #: The capability hooks, so that as the session's owner of ``"checkpoint"`` it
    #: serves ``monitored.provider("checkpoint", session=...)`` (a NaN guard's rollback).
    latest_checkpoint = staticmethod(_capability.latest_checkpoint)
    restore_checkpoint = staticmethod(_capability.restore_checkpoint)
    list_checkpoints = staticmethod(_capability.list_checkpoints)
    save_checkpoint = staticmethod(_capability.save_checkpoint)

    def __init__(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        self.checkpoint_dir = fixed_directory(checkpoint_dir)

    async def restore_state(self, session: MonitoredSession) -> str | None:
        return await _restore(session, self.checkpoint_dir)


def _traced(span: BackgroundSpan, saver: Saver, snapshot: Snapshot, save_path: str) -> str:
    """``saver.write(snapshot)`` recorded as a background span of a traced step."""
    try:
        path = saver.write(snapshot, save_path)
    except BaseException as exc:
        span.end(error=f"{type(exc).__name__}: {exc}")
        raise
    span.end(path=path, bytes=snapshot.nbytes)
    return path


def _uses_cupy() -> bool:
    """Whether CuPy is in use: its work then stays on the caller's thread.

    CuPy's current device and stream belong to a thread; copies made from a
    worker thread could run on another device, or not wait for the kernels the
    training thread queued on its stream.
    """
    return "cupy" in sys.modules


#: The packages between a user's code and a restore: the session runtime, this
#: project's plugins, the event loops. A warning skips their frames.
_LIBRARY_PACKAGES: Final = ("monitored", "anyio", "asyncio", "trio", "sniffio", "contextlib")


def _is_library(module: str) -> bool:
    package = module.partition(".")[0]
    return package in _LIBRARY_PACKAGES or package.startswith("monitored_")


def _users_stacklevel() -> int:
    """The ``stacklevel`` that points a warning issued by the caller at the user's code.

    The first frame, going out from the caller, of a module outside the library
    (:data:`_LIBRARY_PACKAGES`, ``monitored_*``): the line that entered the
    session, or called the function that did. Awaiting coroutines chain their
    frames, so it is on the stack. Without one (a session entered by the
    library itself on a bare event loop), the caller's own line (``1``).
    """
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and _is_library(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 1


async def _restore(session: MonitoredSession, checkpoint_dir: str) -> str | None:
    """Restore ``session.state`` and the plugin states; the checkpoint's path or ``None``."""
    if _uses_cupy():
        manifest, skipped = restore_latest_quietly(
            session.state, checkpoint_dir, session_plugin_states=True
        )
    else:
        manifest, skipped = await anyio.to_thread.run_sync(
            functools.partial(restore_latest_quietly, session_plugin_states=True),
            session.state,
            checkpoint_dir,
        )
    # Warned here, on the loop's thread, where the user's code is on the stack:
    # attributed to the line that entered the session, not to a worker thread.
    level = _users_stacklevel()
    for message in skipped:
        warnings.warn(message, CorruptCheckpointWarning, stacklevel=level)
    if manifest is None:
        log.info("No checkpoint in %s: starting afresh", checkpoint_dir)
        return None
    await session.load_plugin_states(manifest.plugins)
    log.info("Restored %s (step %d)", manifest.path, manifest.step)
    return manifest.path


@final
class CheckpointSaverHook:
    """Saves checkpoints of the session's state on TF1's schedule.

    Args:
        checkpoint_dir: a directory or an fsspec URL (``memory://``, ``s3://``...).
        save_secs: save every this many seconds, or
        save_steps: every this many global steps (exactly one of the two).
        saver: the :class:`Saver` (default ``Saver()``: five checkpoints kept).
        checkpoint_basename: checkpoints are named ``<basename>-<step>``.
        listeners: :class:`CheckpointSaverListener`-like objects.
        asynchronous: write in a worker thread while training goes on (default);
            with ``False`` each save finishes before the next step.
        restore: restore the newest valid checkpoint when the session is created.
        handle_signals: on SIGTERM or a first SIGINT, finish the step, save,
            run ``end`` and stop (main thread only).
    """

    __slots__ = (
        "_buffers",
        "_inline",
        "_listeners",
        "_saved_step",
        "_signals",
        "_stop_sent",
        "_sync_listeners",
        "_timer",
        "_writer",
        "asynchronous",
        "checkpoint_dir",
        "restore",
        "save_path",
        "saver",
    )

    #: Passed in ``hooks=[...]``, it owns the session's checkpoints: the installed
    #: ``checkpoint`` plugin steps aside (no second saver).
    provides: ClassVar[frozenset[str]] = frozenset({"checkpoint"})
    #: The capability hooks, so that as the session's owner of ``"checkpoint"`` it
    #: serves ``monitored.provider("checkpoint", session=...)`` (a NaN guard's rollback).
    latest_checkpoint = staticmethod(_capability.latest_checkpoint)
    restore_checkpoint = staticmethod(_capability.restore_checkpoint)
    list_checkpoints = staticmethod(_capability.list_checkpoints)
    save_checkpoint = staticmethod(_capability.save_checkpoint)

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        save_secs: float | None = None,
        save_steps: int | None = None,
        saver: Saver | None = None,
        checkpoint_basename: str = "model.ckpt",
        listeners: Iterable[object] | None = None,
        *,
        asynchronous: bool = True,
        restore: bool = True,
        handle_signals: bool = True,
    ) -> None:
        if (save_secs is None) == (save_steps is None):
            raise ValueError("exactly one of save_secs and save_steps should be provided")
        if not checkpoint_basename or "/" in checkpoint_basename:
            raise ValueError(
                f"checkpoint_basename must be a plain file name, got {checkpoint_basename!r}"
            )
        check_basename(checkpoint_basename, "CheckpointSaverHook")
        # Resolved once: an os.chdir during training does not move the checkpoints.
        self.checkpoint_dir = fixed_directory(checkpoint_dir)
        #: ``<checkpoint_dir>/<basename>``: checkpoints are ``<save_path>-<step>``.
        self.save_path = open_store(self.checkpoint_dir).path(checkpoint_basename)
        self.saver = saver if saver is not None else Saver()
        self.asynchronous = asynchronous
        self.restore = restore
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._listeners = list(listeners or ())
        self._signals = SignalWatcher() if handle_signals else None
        self._writer: BackgroundWriter | None = None
        self._buffers = SnapshotBuffers()
        self._saved_step: int | None = None
        self._stop_sent = False
        #: Whether a listener needs each write finished before the next step
        #: (worked out at the first save of each session).
        self._sync_listeners: bool | None = None
        #: Whether snapshots are copied on the loop's thread (worked out at the
        #: first save of each session: the state's entries are fixed once created).
        self._inline: bool | None = None

    @property
    def preempted_by(self) -> str | None:
        """The name of the signal that stopped training (``"SIGTERM"``), if one did."""
        received = self._signals.received if self._signals is not None else None
        return received.name if received is not None else None

    @property
    def last_write(self) -> PendingWrite | None:
        """The latest checkpoint write (its step, path, duration, error)."""
        return self._writer.pending if self._writer is not None else None

    # -- hooks --------------------------------------------------------------------------------
    def run_directories(self, session: MonitoredSession) -> list[str]:
        """The checkpoint directory: the chief's session owns it before anything is restored."""
        return [self.checkpoint_dir]

    async def begin(self, session: MonitoredSession) -> None:
        # Fails now, not at the first save: a missing or read-only directory, or
        # one that holds another project's checkpoints.
        await anyio.to_thread.run_sync(self.saver.prepare, self.save_path)
        self._timer.reset()
        self._writer = BackgroundWriter(session.coord, name=f"checkpoint-writer {self.save_path}")
        # Started now, idle: a thread's start is not paid in the first save's step.
        self._writer.start()
        self._saved_step = None
        self._inline = None
        self._stop_sent = False
        self._sync_listeners = None
        for listener in self._listeners:
            if hasattr(listener, "begin"):
                await _maybe_await(listener.begin())

    async def restore_state(self, session: MonitoredSession) -> str | None:
        if not self.restore:
            return None
        if self._writer is not None:
            await self._writer.wait()  # a re-created session restores the newest
        return await _restore(session, self.checkpoint_dir)

    async def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        step = session.state.global_step
        # Worked out now rather than in the first save's step.
        self._waits_for_listeners(session)
        self._inline = None
        self._copies_inline(session.state)
        if not self.saver.has_checkpoint(self.save_path, step):
            # After every hook's after_create_session, so plugin states are current;
            # at once when this is called directly, outside the session's creation.
            saving = session.call_after_hooks(lambda: self._save(session, step, None))
            if saving is not None:
                await saving
        elif not _uses_cupy():
            # No save now, so the first one would allocate its snapshot buffers in
            # the loop (a copy into fresh pages costs 2-4 times one into touched
            # ones): a thread allocates and touches them meanwhile.
            self._buffers.prepare(session.state)
        self._timer.update_last_triggered_step(step)
        signals = self._signals
        if signals is not None and not signals.installed and signals.install(coord.wake_waiters):
            coord.start_soon(self._restore_signals_on_stop, coord)

    def after_run(
        self, run_context: SessionRunContext, run_values: SessionRunValues
    ) -> Awaitable[None] | None:
        # Sync on purpose: on most steps nothing is due and no coroutine is made.
        writer = self._writer
        job = writer.pending if writer is not None else None
        deliver = job is not None and not job.delivered and job.done.is_set()
        preempt = self._signals is not None and self._signals.received is not None
        step = run_context.session.state.global_step
        due = self._timer.should_trigger_for_step(step)
        if deliver or (preempt and not self._stop_sent) or due:
            # The save runs once every hook's after_run of this step has run: the
            # checkpoint of step k holds every plugin's state as of the end of step k.
            # Called directly (outside a step), the save is returned, to be awaited.
            return run_context.session.call_after_hooks(  # type: ignore[no-any-return]
                lambda: self._after_run(run_context, step, due, preempt)
            )
        return None

    async def _after_run(
        self, run_context: SessionRunContext, step: int, due: bool, preempt: bool
    ) -> None:
        session = run_context.session
        await self._deliver(session, run_context)
        if preempt and not self._stop_sent:
            self._stop_sent = True
            log.warning("%s: saving a checkpoint of step %d and stopping", self.preempted_by, step)
            run_context.request_stop()
            if self._saved_step != step:
                self._timer.update_last_triggered_step(step)
                await self._save(session, step, run_context, wait=True)
            return
        if due:
            self._timer.update_last_triggered_step(step)
            await self._save(session, step, run_context)

    async def end(self, session: MonitoredSession) -> None:
        step = session.state.global_step
        try:
            if step != self._timer.last_triggered_step() and self._saved_step != step:
                await self._save(session, step, None, wait=True)
            if self._writer is not None:
                await self._writer.wait()
                await self._deliver(session, None)
                job = self._writer.pending
                if job is not None and job.error is not None:
                    raise job.error
            for listener in self._listeners:
                if hasattr(listener, "end"):
                    await _maybe_await(listener.end(session, step))
        finally:
            if self._writer is not None:
                self._writer.close()
            if self._signals is not None:
                self._signals.uninstall()
            self._buffers.clear()

    # -- saving ---------------------------------------------------------------------------------
    async def _save(
        self,
        session: MonitoredSession,
        step: int,
        run_context: SessionRunContext | None,
        *,
        wait: bool = False,
    ) -> None:
        writer = self._writer
        if writer is None:
            raise RuntimeError("CheckpointSaverHook: begin was not called")
        if writer.busy:
            started = time.monotonic()
            await writer.wait()
            log.debug(
                "checkpoint of step %d waited %.3fs for the previous write to finish",
                step,
                time.monotonic() - started,
            )
        previous = writer.pending
        if previous is not None and not previous.delivered and previous.done.is_set():
            await self._deliver(session, run_context)
        if previous is not None and previous.error is not None:
            return  # the session raises it; do not pile more writes on a failing store
        await session.call_hook("before_save", session, step)
        for listener in self._listeners:
            if hasattr(listener, "before_save"):
                await _maybe_await(listener.before_save(session, step))
        plugin_states = await session.plugin_states()
        trace = session.current_trace
        started = time.perf_counter()
        state = session.state
        if self._copies_inline(state):
            snapshot = take_snapshot(state, plugin_states, buffers=self._buffers)
        else:
            snapshot = await anyio.to_thread.run_sync(
                lambda: take_snapshot(session.state, plugin_states, buffers=self._buffers)
            )
        saver, save_path = self.saver, self.save_path
        if trace is None:
            writer.submit(step, f"{save_path}-{step}", lambda: saver.write(snapshot, save_path))
        else:
            trace.add("checkpoint", "snapshot", started, bytes=snapshot.nbytes)
            span = trace.begin("checkpoint", "write", thread=writer.name)
            writer.submit(
                step, f"{save_path}-{step}", lambda: _traced(span, saver, snapshot, save_path)
            )
        self._saved_step = step
        if wait or not self.asynchronous or self._waits_for_listeners(session):
            # A listener may stop training after this save (TF1's after_save) and
            # asked to hear of it before the next step, not a few steps later.
            # Other listeners hear of it at the first step boundary after the
            # write finished (``after_run`` delivers it).
            await writer.wait()
            await self._deliver(session, run_context)

    async def _deliver(
        self, session: MonitoredSession, run_context: SessionRunContext | None
    ) -> None:
        """Call the ``after_save`` listeners of a finished write, once."""
        job = self._writer.pending if self._writer is not None else None
        if job is None or job.delivered or not job.done.is_set():
            return
        job.delivered = True
        if job.error is not None or job.path is None:
            return  # the coordinator holds the error; the session raises it
        results = await session.call_hook("after_save", session, job.step, job.path)
        stop = any(r is True for r in results)
        for listener in self._listeners:
            if hasattr(listener, "after_save"):
                stop = (await _maybe_await(listener.after_save(session, job.step)) is True) or stop
        if stop:
            log.info("a checkpoint listener requested a stop after saving step %d", job.step)
            if run_context is not None:
                run_context.request_stop()
            else:
                session.coord.request_stop()

    def _copies_inline(self, state: TrainState) -> bool:
        """Whether a snapshot is copied on the loop's thread (NumPy under 16 MB, or CuPy).

        Worked out once per session: its state's entries cannot change shape once
        it is created.
        """
        inline = self._inline
        if inline is None:
            inline = _uses_cupy() or sum(a.nbytes for a in state.values()) < _INLINE_SNAPSHOT_BYTES
            self._inline = inline
        return inline

    def _waits_for_listeners(self, session: MonitoredSession) -> bool:
        waits = self._sync_listeners
        if waits is None:
            waits = any(_listens_synchronously(x) for x in self._listeners) or any(
                _plugin_listens_synchronously(info.plugin) for info in session.plugins
            )
            self._sync_listeners = waits
        return waits

    async def _restore_signals_on_stop(self, coord: Coordinator) -> None:
        """Put the previous signal handlers back when the session stops, even on error.

        An error close cancels this task while it waits: the handlers go back then too.
        """
        try:
            await coord.wait_for_stop()
        finally:
            if self._signals is not None:
                self._signals.uninstall()
