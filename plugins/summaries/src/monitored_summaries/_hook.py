"""``SummarySaverHook``: TF1's summary hook, free on the steps that write nothing.

Timing is TF1's: the first step after the session is created is written, then
one step every ``save_steps`` steps (or ``save_secs`` seconds); with
``save_steps=3`` and a last step of 7 the steps written are 1, 4 and 7.
With ``save_steps`` whether a step is due is decided after the previous step
(TF1 predicts the next global step the same way), so a step that is not due
costs one call of a synchronous ``after_run`` that compares two integers: no
``before_run`` (unless summaries are fetched by name), no coroutine, no fetch.
With ``save_secs`` the clock is read when the step starts, as TF1's
``before_run`` read it (time that passes between two runs counts for the next
step): a synchronous ``before_run`` reading the clock, and the same
``after_run`` comparing integers.

With ``step_outputs=True`` (the plugin's hook) a due step also asks, in a
``before_run``, for its scalar outputs (``monitored.SCALAR_OUTPUTS``, the rule
every summary sink follows) with ``lag=1``: on a device their copy is started
in the step without waiting, and they are written, at the step they belong to,
when they arrive at the next step's ``after_run`` (or when the session stops,
before the writer closes). The step's outputs are never read in the step.

A due step that records nothing (a validation or test step run in the same
session, which calls no ``summaries.*`` function and fetches nothing) does not
use up the slot: the next step that records something is written instead.

The hook also writes TF1's ``SessionLog`` events, which is how TensorBoard shows
a resumed run as one curve: ``START`` when the session is created (at the step
the restored run writes first, so points an earlier run wrote past the
restored checkpoint are purged), ``CHECKPOINT`` after each checkpoint (the core's
``after_save`` hookspec, called by checkpoint plugins) and ``STOP`` at a normal end.

The scalars a due step writes (``summaries.scalar`` and ``scalars=``) are also
handed to the session's other summary sinks (``session.write_summaries``: an
experiment tracker, a log), at the step written, under the tag written. The
hook's own sink, and any other hook writing through the same writer, skips
that mapping: each point reaches the event file once. Only the recording path
hands values on, never the sink, so no value goes round twice.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio
import anyio.to_thread
from tensorboardX.proto.event_pb2 import SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.summary import hparams as hparams_summaries

from monitored import (
    SCALAR_OUTPUTS,
    SecondOrStepTimer,
    SessionRunArgs,
    scalar_outputs,
    to_host,
)

from . import _record
from ._encode import clean_tag
from ._errors import (
    SummaryDirectoryError,
    SummaryScheduleError,
    SummaryValueError,
    SummaryWriteError,
)
from ._writer import FileWriter, FileWriterCache, Record, scalar_tags_in

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = ["SummarySaverHook"]

log = logging.getLogger("monitored.summaries")

#: ``_arm_after`` of a ``save_secs`` hook: its ``after_run`` never arms (``before_run`` does).
_NEVER: Final = sys.maxsize

#: What a ``step_outputs`` hook asks of a due step: its scalar outputs, one step late
#: (on a device, their copy starts without waiting; the next step's ``after_run``, or
#: the session's stop, hands them over).
_LATE_OUTPUTS: Final = SessionRunArgs(SCALAR_OUTPUTS, lag=1)


class SummarySaverHook:
    """Writes summaries every ``save_steps`` steps or ``save_secs`` seconds (TF1's timing).

    Args:
        save_steps: write every this many global steps, or
        save_secs: every this many seconds (exactly one of the two).
        output_dir: the log directory; its shared writer is acquired from
            :class:`FileWriterCache` for each session and released when it ends.
        summary_writer: a :class:`FileWriter` to use instead of ``output_dir``'s.
        scaffold, summary_op: TF1's arguments; a graph's summary op has no
            equivalent here (record with ``summaries.scalar(...)`` in the step, or
            name values in ``scalars``/``histograms``), so only ``None`` is accepted.
        scalars: names of step outputs or state entries written as scalars on due
            steps, fetched through ``SessionRunArgs`` on those steps only.
        histograms: the same, written as histograms.
        hparams: the run's hyperparameters, for TensorBoard's HParams dashboard.
        metrics: scalar tags that HParams compares runs by.
        step_outputs: write the step's scalar outputs on due steps and at the end
            (:func:`monitored.scalar_outputs`, the rule every summary sink follows),
            besides what the step records and what ``scalars`` names. Off by
            default for a hook made in code (TF1's hook wrote its summary op
            only); the hook the ``summaries`` plugin makes has it on. They are
            fetched one step late (``SCALAR_OUTPUTS`` with ``lag=1``: a device's
            copy is started in the due step and collected at the next one, or when
            the session stops), and written at the step they belong to; a hook that
            fetches by name (``scalars``/``histograms``) waits for those values in
            the due step anyway, and reads the outputs with them.
    """

    __slots__ = (
        "_arm_after",
        "_coord",
        "_due_at",
        "_every_secs",
        "_every_steps",
        "_final_metrics",
        "_hand_on",
        "_held",
        "_hparams_metrics",
        "_hparams_written",
        "_last_written",
        "_late",
        "_listener",
        "_recorded_names",
        "_recorder",
        "_step_outputs",
        "_timer",
        "_writer",
        "claims_directory",
        "histograms",
        "hparams",
        "keep_writer_open",
        "metrics",
        "output_dir",
        "scalars",
        "summary_writer",
    )

    #: Passed in ``hooks=[...]``, it owns the session's summaries: the installed
    #: ``summaries`` plugin adds no second writer (each value is written once).
    provides: ClassVar[frozenset[str]] = frozenset({"summaries"})

    #: Whether the due steps' outputs are asked for with ``lag=1`` (``before_run``).
    _lagged: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> SummarySaverHook:
        # Only a hook that fetches by name or reads the clock has a before_run: the
        # core calls no before_run at all for the others, on any step.
        if cls is SummarySaverHook:
            fetching = bool(kwargs.get("scalars") or kwargs.get("histograms"))
            timed = kwargs.get("save_secs", args[1] if len(args) > 1 else None) is not None
            if fetching and timed:
                cls = _TimedFetchingSummarySaverHook
            elif fetching:
                cls = _FetchingSummarySaverHook
            elif timed:
                outputs = bool(kwargs.get("step_outputs"))
                cls = _TimedOutputsSummarySaverHook if outputs else _TimedSummarySaverHook
            elif kwargs.get("step_outputs"):
                cls = _OutputsSummarySaverHook
        return object.__new__(cls)

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        summary_writer: FileWriter | None = None,
        scaffold: object = None,
        summary_op: object = None,
        *,
        scalars: Iterable[str] = (),
        histograms: Iterable[str] = (),
        hparams: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | Sequence[str] = (),
        step_outputs: bool = False,
    ) -> None:
        if (save_steps is None) == (save_secs is None):
            raise SummaryScheduleError(
                "SummarySaverHook: exactly one of save_steps and save_secs should be provided, "
                f"got save_steps={save_steps!r} and save_secs={save_secs!r}"
            )
        if save_steps is not None and (
            not isinstance(save_steps, int) or isinstance(save_steps, bool) or save_steps < 1
        ):
            raise SummaryScheduleError(
                f"SummarySaverHook: save_steps must be a positive int, got {save_steps!r}"
            )
        if save_secs is not None and not save_secs > 0:
            raise SummaryScheduleError(
                f"SummarySaverHook: save_secs must be a positive number, got {save_secs!r}"
            )
        if output_dir is None and summary_writer is None:
            raise SummaryDirectoryError(
                "SummarySaverHook: give output_dir (a log directory) or summary_writer"
            )
        if summary_op is not None:
            raise SummaryValueError(
                "SummarySaverHook: summary_op has no equivalent here; record summaries with "
                "monitored_summaries.scalar(...) in the step, or name step outputs in "
                "scalars=[...]/histograms=[...]"
            )
        # Resolved once: an os.chdir during training does not move the event files.
        self.output_dir = _fixed(output_dir) if output_dir is not None else None
        self.summary_writer = summary_writer
        #: Whether the session's chief claims ``output_dir`` (``run_directories``):
        #: set on the hook the plugin makes for a ``MonitoredTrainingSession``.
        self.claims_directory = False
        #: Whether the session gives its shared writer back open, for the next session
        #: of ``output_dir`` in this process (``FileWriterCache.release(keep_open=True)``):
        #: set on the hook the plugin makes for an evaluation, so that a training's
        #: evaluations append to one event file.
        self.keep_writer_open = False
        self.scalars = _names("scalars", scalars)
        self.histograms = _names("histograms", histograms)
        self.hparams = (
            _record.check_hparams(hparams, "SummarySaverHook: hparams")
            if hparams is not None
            else None
        )
        self.metrics = metrics
        self._step_outputs = bool(step_outputs)
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._every_steps = save_steps
        self._every_secs = save_secs
        self._arm_after = 0 if save_steps is not None else _NEVER
        self._due_at = -math.inf
        self._last_written: int | None = None
        self._recorder: _record.Recorder | None = None
        self._writer: FileWriter | None = None
        #: The shared writer this hook acquired for the running session (to release).
        self._held: FileWriter | None = None
        self._coord: Coordinator | None = None
        self._listener: Callable[[SummaryWriteError], None] | None = None
        self._hparams_written = False
        self._final_metrics: dict[str, float] = {}
        #: Every metric the HParams dashboard was told of this session (cleaned tags).
        self._hparams_metrics: dict[str, float | None] = {}
        #: The names the steps recorded themselves: at the end, a step output of the
        #: same name is not written (the recorded value is the curve).
        self._recorded_names: set[str] = set()
        #: A due step whose scalar outputs are on their way (``lag=1``): its global
        #: step, and the names written there already (recorded or fetched by name).
        self._late: tuple[int, frozenset[str]] | None = None
        #: Whether a summary sink other than this writer's hooks is there to hand the
        #: written scalars to (decided when the session is created).
        self._hand_on = True

    @property
    def step_outputs(self) -> bool:
        """Whether the step's scalar outputs are written (fixed when the hook is made)."""
        return self._step_outputs

    @property
    def writer(self) -> FileWriter | None:
        """The writer in use (set when the session begins)."""
        return self._writer

    # -- hooks ------------------------------------------------------------------------------------
    def run_directories(self, session: MonitoredSession) -> list[str] | None:
        """The log directory of a ``MonitoredTrainingSession``'s summaries: the chief owns it.

        Only the hook the ``summaries`` plugin makes for a training session claims
        its directory (one writer per run). Hooks made in code share one writer
        per directory within a process (``FileWriterCache``, as TF1's), which is
        one writer, and an evaluation writes its own directory (``<model_dir>/eval``).
        """
        if not self.claims_directory or self.output_dir is None:
            return None
        return [self.output_dir]

    def begin(self, session: MonitoredSession) -> None:
        # A hook used again after a session that failed before it could release.
        self._release_quietly()
        # Fails now, naming the directory, not at the first write.
        if self.summary_writer is not None:
            self._writer = self.summary_writer
        else:
            assert self.output_dir is not None
            self._writer = self._held = FileWriterCache.acquire(self.output_dir)
        self._timer.reset()
        self._last_written = None
        self._recorded_names = set()
        self._late = None
        self._arm_after = 0 if self._every_steps is not None else _NEVER
        self._due_at = -math.inf

    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        writer = self._require_writer()
        self._detach()
        self._coord = coord
        self._listener = _stop_on_error(coord)
        # Handing on to no one costs a coroutine and a hook call per written step.
        self._hand_on = any(
            not (isinstance(owner, SummarySaverHook) and owner._writer is writer)
            for owner in session.implementers("write_summaries")
        )
        writer.add_error_listener(self._listener)
        self._disarm()
        # The step the first run writes: TensorBoard drops what an earlier run wrote
        # from that step on (purge of orphaned data).
        first = session.state.global_step + 1
        writer.add_session_log(SessionLog(status=SessionLog.START), first)
        if self.hparams is not None:
            _record.hparams(self.hparams, self.metrics)
        self._write_hparams(first)
        self._arm(first)
        coord.start_soon(self._flush_when_stopped, session, coord)

    def after_run(
        self, run_context: SessionRunContext, run_values: SessionRunValues
    ) -> Awaitable[None] | None:
        # Sync on purpose: on a step that is not due nothing is made, fetched or awaited.
        recorder = self._recorder
        if recorder is None:
            if self._late is not None:
                self._write_late(run_values.results)
            # save_steps: nothing until the step before the next due one (the timer, a
            # method call, decides only then); save_secs: never (before_run arms).
            step = run_context.session.state.global_step
            if step >= self._arm_after and self._timer.should_trigger_for_step(step + 1):
                self._arm(step + 1)
            return None
        results = run_values.results
        late = self._lagged
        if late:
            # What arrives now are the outputs of an earlier step, asked for lag=1
            # (written if that step was a due training step, else dropped).
            if self._late is not None:
                self._write_late(results)
            results = None
        session = run_context.session
        # Only a training step's outputs (one that moved the global step to the step
        # armed): a validation step's are not the run's curves. With lag=1 nothing is
        # read now: the session picks the scalars when it fetches them.
        training = self._step_outputs and session.state.global_step >= recorder.step
        outputs: Mapping[str, Any] = (
            {}
            if not training
            else session.last_outputs
            if late
            else scalar_outputs(session.last_outputs)
        )
        if results is None and not recorder.records and not outputs:
            # A step that recorded nothing (a validation step) leaves the slot to the next.
            recorder.step = session.state.global_step + 1
            return None
        return self._write_step(session, recorder, results, outputs, late=late)

    def end(self, session: MonitoredSession) -> Any:
        return self._end(session)

    async def _end(self, session: MonitoredSession) -> None:
        writer = self._require_writer()
        self._disarm()
        step = session.state.global_step
        try:
            if self._last_written != step and session.last_outputs:
                # TF1 writes the end step: the values named in scalars/histograms can
                # still be fetched (what the step recorded itself was not due), and
                # the step's scalar outputs are there.
                fetched = self._fetches()
                host_records = self._fetched_records(session.fetch(fetched)) if fetched else []
                outputs = scalar_outputs(session.last_outputs) if self._step_outputs else {}
                if outputs and _writer_took_outputs(writer, step):
                    outputs = {}
                records = [
                    record
                    for record in _output_records(outputs, host_records)
                    if record[1] not in self._recorded_names
                ]
                if records or host_records:
                    self._write(step, records, host_records)
                    written = self._written_scalars([], [], host_records)
                    if written is not None:
                        await session.write_summaries(step, written)
            self._write_hparams(step, end=True)
            writer.add_session_log(SessionLog(status=SessionLog.STOP), step)
            await anyio.to_thread.run_sync(writer.flush)
        except BaseException:
            self._release_quietly()  # what failed propagates; the writer is given back
            raise
        # The session is over: its shared writer is closed if no other session holds it.
        await anyio.to_thread.run_sync(self._release)

    def write_summaries(
        self, session: MonitoredSession, step: int, summaries: Mapping[str, Any]
    ) -> None:
        """The core's summary sink: ``global_step/sec`` and other hooks' values.

        Skips the scalars that this hook, or another writing through the same
        writer, wrote and handed on itself (they are in the event file already).
        """
        if self._writer is None or self._writer.closed:
            return
        if type(summaries) is _Written and summaries.writer is self._writer:
            return
        records: list[Record] = []
        for tag, value in summaries.items():
            kind = "scalar" if _record_size(value) == 1 else "histogram"
            records.append((kind, tag, value, {}))
        self._write(step, records, [])

    def after_save(self, session: MonitoredSession, step: int, path: str) -> None:
        """TF1's ``SessionLog.CHECKPOINT``, after each checkpoint a checkpoint plugin wrote."""
        if self._writer is not None and not self._writer.closed:
            # A proto string is UTF-8: a path's undecodable bytes (surrogate escapes)
            # are written as \xNN, not raised mid-training.
            shown = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            log_entry = SessionLog(status=SessionLog.CHECKPOINT, checkpoint_path=shown)
            self._writer.add_session_log(log_entry, step)

    # -- writing ------------------------------------------------------------------------------
    def _arm(self, step: int) -> None:
        self._recorder = _record.arm(step)

    def _disarm(self) -> None:
        if self._recorder is not None:
            _record.disarm(self._recorder)
            self._recorder = None

    def _write_step(
        self,
        session: MonitoredSession,
        recorder: _record.Recorder,
        results: Any,
        outputs: Mapping[str, Any],
        *,
        late: bool = False,
    ) -> Awaitable[None] | None:
        """Write a due step; return the handing of its scalars to the other sinks.

        ``late``: ``outputs`` are on their way (``lag=1``) and written when they arrive.
        """
        _record.disarm(recorder)
        self._recorder = None
        step = session.state.global_step
        fetched = self._fetched_records(results) if results is not None else []
        self._recorded_names.update(name for _, name, _, _ in recorder.records)
        if outputs and _writer_took_outputs(self._require_writer(), step):
            outputs = {}  # another hook writing through this writer wrote them
        recorded = recorder.records
        if late:
            if outputs:
                self._late = (step, frozenset(name for _, name, _, _ in recorded))
            outputs = {}
        records = [*recorded, *_output_records(outputs, recorded, fetched)]
        host = self._write(step, records, fetched)
        # Step outputs are not handed on: every sink takes them itself, by the same rule.
        written = self._written_scalars(recorded, host[: len(recorded)], fetched)
        self._write_hparams(step)
        self._timer.update_last_triggered_step(step)
        self._last_written = step
        if self._every_steps is not None:
            self._arm_after = step + self._every_steps - 1
        elif self._every_secs is not None:
            self._due_at = monotonic() + self._every_secs
        if self._timer.should_trigger_for_step(step + 1):
            self._arm(step + 1)
        return None if written is None else session.write_summaries(step, written)

    def _write_late(self, results: Mapping[str, Any] | None) -> None:
        """Write the scalar outputs of the due step noted in ``_late``, just arrived.

        ``None`` (the session stopped before they came) writes nothing. A name the
        step recorded itself is not written twice.
        """
        pending, self._late = self._late, None
        if not results or pending is None:
            return
        writer = self._writer
        if writer is None or writer.closed:
            return
        step, taken = pending
        records: list[Record] = [
            ("scalar", name, value, {}) for name, value in results.items() if name not in taken
        ]
        if records:
            writer.add_records(step, records, [record[2] for record in records])

    def _write(
        self, step: int, records: Sequence[Record], host_records: Sequence[Record]
    ) -> list[Any]:
        """Queue ``records`` (moved to host in one transfer) and ``host_records``.

        Returns the host values of ``records``, in order.
        """
        writer = self._require_writer()
        host: list[Any] = []
        if records:
            host = to_host([value for _, _, value, _ in records])
            writer.add_records(step, list(records), host)
        if host_records:
            writer.add_records(step, list(host_records), [r[2] for r in host_records])
        return host

    def _written_scalars(
        self, records: Sequence[Record], host: Sequence[Any], host_records: Sequence[Record]
    ) -> _Written | None:
        """The scalars just written, by the tag they were written under, for the other
        summary sinks; ``None`` when there are none (or no other sink)."""
        if not self._hand_on:
            return None
        pairs = [
            (name, value)
            for (kind, name, _, _), value in zip(records, host, strict=True)
            if kind == "scalar"
        ]
        pairs += [(name, value) for kind, name, value, _ in host_records if kind == "scalar"]
        if not pairs:
            return None
        written = _Written(self._require_writer())
        for name, value in pairs:
            written[clean_tag(name)] = value
        return written

    def _fetches(self) -> dict[str, dict[str, str]]:
        fetches = {}
        if self.scalars:
            fetches["scalars"] = {name: name for name in self.scalars}
        if self.histograms:
            fetches["histograms"] = {name: name for name in self.histograms}
        return fetches

    @staticmethod
    def _fetched_records(results: Mapping[str, Mapping[str, Any]]) -> list[Record]:
        records: list[Record] = []
        for name, value in results.get("scalars", {}).items():
            records.append(("scalar", name, value, {}))
        for name, value in results.get("histograms", {}).items():
            records.append(("histogram", name, value, {}))
        return records

    def _write_hparams(self, step: int, *, end: bool = False) -> None:
        """Write hyperparameters recorded since the last write; at the end, close them."""
        writer = self._require_writer()
        for values, named in _record.take_hparams():
            # The dashboard finds a metric by its tag, which TF1's rules cleaned.
            metrics = {clean_tag(tag): value for tag, value in named.items()}
            experiment, start_info, _ = hparams_summaries(values, dict.fromkeys(metrics))
            writer.add_summary(experiment, step)
            writer.add_summary(start_info, step)
            self._hparams_written = True
            self._final_metrics.update({k: v for k, v in metrics.items() if v is not None})
            self._hparams_metrics.update(metrics)
        if end and self._hparams_written:
            self._warn_of_unwritten_metrics(writer.get_logdir())
            if self._final_metrics:
                final = [
                    Summary.Value(tag=k, simple_value=v) for k, v in self._final_metrics.items()
                ]
                writer.add_summary(Summary(value=final), step)
            _, _, end_info = hparams_summaries({}, {})
            writer.add_summary(end_info, step)
            self._hparams_written = False
            self._final_metrics = {}
            self._hparams_metrics = {}

    def _warn_of_unwritten_metrics(self, logdir: str) -> None:
        """Say which HParams metrics nothing wrote where the dashboard reads them.

        TensorBoard's HParams dashboard reads a metric's last value from the run's
        own directory (a metric names no sub-directory here): a tag written
        nowhere, or only to a sub-directory such as an evaluation's ``eval``,
        leaves its column empty without a word. Only the chief writes the run
        directory, so what this process wrote there is all there is.
        """
        written = scalar_tags_in(logdir)
        here = {clean_tag(tag) for tag in written.get(".", ())}
        for metric in self._hparams_metrics:
            if metric in self._final_metrics or metric in here:
                continue
            elsewhere = sorted(
                directory
                for directory, tags in written.items()
                if directory != "." and metric in {clean_tag(tag) for tag in tags}
            )
            where = (
                f"; it was written to {', '.join(map(repr, elsewhere))} only, where the "
                "dashboard does not look for it"
                if elsewhere
                else ""
            )
            log.warning(
                "HParams metric %r was never written to %s, the run's directory, so its "
                "column in TensorBoard's HParams dashboard stays empty%s. Write a scalar "
                "of that name there, or give its final value "
                "(summaries.hparams(..., metrics={%r: value}))",
                metric,
                logdir,
                where,
                metric,
            )

    def _require_writer(self) -> FileWriter:
        if self._writer is None:
            raise RuntimeError("SummarySaverHook: begin was not called")
        return self._writer

    async def _flush_when_stopped(self, session: MonitoredSession, coord: Coordinator) -> None:
        """Flush however the session ends: a crash leaves every event before it readable.

        A failed session never calls ``end``: the shared writer is released here
        when the session's close cancels this task, or when the stop carries an
        exception that ends the session (a background task failed). A session
        that recovers (re-created, the stop not final) keeps its writer.
        """
        closing = False
        try:
            await coord.wait_for_stop()
        except anyio.get_cancelled_exc_class():
            closing = True
            raise
        finally:
            writer = self._writer
            if writer is not None and writer.error is None and not writer.closed:
                with contextlib.suppress(Exception):
                    writer.flush()
            if closing or coord.exception is not None:
                with contextlib.suppress(Exception):
                    if session.should_stop():
                        self._release_quietly()

    def _detach(self) -> None:
        """Stop telling the session's coordinator about write failures."""
        if self._listener is not None and self._writer is not None:
            self._writer.remove_error_listener(self._listener)
        self._listener = self._coord = None

    def _release(self) -> None:
        """Give the shared writer back: flushed, and closed once no session holds it."""
        self._detach()
        writer, self._held = self._held, None
        if writer is not None:
            FileWriterCache.release(writer, keep_open=self.keep_writer_open)

    def _release_quietly(self) -> None:
        """:meth:`_release` where a failure was already reported (or nobody is left)."""
        with contextlib.suppress(SummaryWriteError):
            self._release()

    def __repr__(self) -> str:
        where = self.output_dir if self.output_dir is not None else self.summary_writer
        return f"<{type(self).__name__} {where}>"


class _FetchingSummarySaverHook(SummarySaverHook):
    """A :class:`SummarySaverHook` with ``scalars``/``histograms``: fetches on due steps."""

    __slots__ = ()

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        if self._recorder is None:
            return None
        return SessionRunArgs(self._fetches())


class _OutputsSummarySaverHook(SummarySaverHook):
    """A :class:`SummarySaverHook` with ``step_outputs``: a due step's scalar outputs are
    asked for one step late (nothing waits for a device in the step)."""

    __slots__ = ()

    _lagged = True

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        return None if self._recorder is None else _LATE_OUTPUTS


class _TimedSummarySaverHook(SummarySaverHook):
    """A :class:`SummarySaverHook` with ``save_secs``: the clock is read as the step starts."""

    __slots__ = ()

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        if self._recorder is None and monotonic() >= self._due_at:
            step = run_context.session.state.global_step + 1
            if self._timer.should_trigger_for_step(step):
                self._arm(step)
        return None


class _TimedOutputsSummarySaverHook(_TimedSummarySaverHook):
    """``save_secs`` and ``step_outputs``: armed as the step starts, outputs one step late."""

    __slots__ = ()

    _lagged = True

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        super().before_run(run_context)
        return None if self._recorder is None else _LATE_OUTPUTS


class _TimedFetchingSummarySaverHook(_FetchingSummarySaverHook):
    """``save_secs`` and ``scalars``/``histograms``: armed as the step starts, then fetches."""

    __slots__ = ()

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        if self._recorder is None and monotonic() >= self._due_at:
            step = run_context.session.state.global_step + 1
            if self._timer.should_trigger_for_step(step):
                self._arm(step)
        return super().before_run(run_context)


class _Written(dict[str, Any]):
    """Scalars a :class:`SummarySaverHook` wrote to ``writer`` and hands to the other sinks.

    Its own sink (``write_summaries``), and that of any hook sharing ``writer``,
    knows the mapping by its type and writer and skips it.
    """

    __slots__ = ("writer",)

    def __init__(self, writer: FileWriter) -> None:
        super().__init__()
        self.writer = writer


def _stop_on_error(coord: Coordinator) -> Callable[[SummaryWriteError], None]:
    """A writer's error listener: stop ``coord``'s session with the failure, unless that
    session is over (a joined coordinator would raise it into the writer's thread)."""

    def listener(error: SummaryWriteError) -> None:
        if not coord.joined:
            with contextlib.suppress(SummaryWriteError):
                coord.request_stop(error)

    return listener


def _names(argument: str, names: Iterable[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise SummaryValueError(
            f"SummarySaverHook: {argument} must be a list of names, got the string {names!r}"
        )
    checked = tuple(names)
    for name in checked:
        if not isinstance(name, str) or not name:
            raise SummaryValueError(
                f"SummarySaverHook: {argument} must hold non-empty names, got {name!r}"
            )
    return checked


def _writer_took_outputs(writer: FileWriter, step: int) -> bool:
    """Whether the step outputs of ``step`` went to ``writer`` already (another hook
    sharing it wrote them); if not, they go now: note it."""
    if writer.outputs_step == step:
        return True
    writer.outputs_step = step
    return False


def _output_records(outputs: Mapping[str, Any], *written: Sequence[Record]) -> list[Record]:
    """The step's scalar outputs as records, but for the names ``written`` holds already
    (a value the step recorded, or fetched by name, under the same name)."""
    if not outputs:
        return []
    taken = {name for records in written for _, name, _, _ in records}
    return [("scalar", name, value, {}) for name, value in outputs.items() if name not in taken]


def _record_size(value: Any) -> int:
    size = getattr(value, "size", None)
    return int(size) if size is not None else 1


def _fixed(directory: str | os.PathLike[str]) -> str:
    """A local log directory made absolute now, once; URLs as given."""
    text = os.fspath(directory)
    return text if not text or "://" in text else os.path.abspath(text)
