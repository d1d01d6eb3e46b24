"""Tracing a step as the session sees it, and ``ProfilerHook``, which writes traces.

A hook asks for a trace with ``SessionRunArgs(options=RunOptions(trace=True))``;
the session then records the rest of that step: each hook call (plugin, event),
the step function and the batched fetch, as complete events of the trace-event
format that Perfetto and ``chrome://tracing`` open. Work a plugin starts during
the step and finishes in the background (a checkpoint write) is a *background
span* of the same trace, opened with :meth:`StepTrace.begin` and ended from any
thread. Steps nobody traces record nothing. ``ProfilerHook`` asks for a trace
every N steps or seconds, writes ``timeline-<step>.json`` files as TF1's does
(again once the step's background spans have ended), and at the end logs what
each plugin cost over the traced steps (the ``pytest --durations`` habit).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, final

import anyio.to_thread

from ._markers import hookimpl
from ._session_run_hook import SessionRunHook
from ._timer import SecondOrStepTimer

if TYPE_CHECKING:
    from ._run import RunOptions, SessionRunArgs, SessionRunContext, SessionRunValues
    from ._session import MonitoredSession
    from ._state import TrainState

__all__ = ["BackgroundSpan", "ProfilerHook", "StepTrace"]

log = logging.getLogger("monitored")

#: How long ``ProfilerHook.end`` waits for background spans (a checkpoint write) to end.
END_WAIT_SECS: Final = 30.0


@final
class BackgroundSpan:
    """A span of a :class:`StepTrace` that ends later, possibly in another thread.

    Returned by :meth:`StepTrace.begin`; call :meth:`end` exactly once, when the
    work is over (also when it failed: pass ``error=...`` as an argument).
    """

    __slots__ = ("_ended", "_trace", "event", "plugin", "start", "thread")

    def __init__(self, trace: StepTrace, plugin: str, event: str, thread: str) -> None:
        self._trace = trace
        self.plugin = plugin
        self.event = event
        self.thread = thread
        self.start = time.perf_counter()
        self._ended = False

    def end(self, **args: Any) -> None:
        """Close the span now; ``args`` are recorded with it. A second call is ignored."""
        self._trace._end_span(self, args)


@final
class StepTrace:
    """The record of one traced step: spans in Chrome's trace-event format.

    ``events`` are complete events (``"ph": "X"``) named ``"<plugin>.<event>"``;
    :meth:`add` is thread-safe, so a plugin's worker thread may add spans while
    the trace is open (``session.current_trace``). Work that outlives the step
    is recorded with :meth:`begin`: the trace is :attr:`finished` once the step
    is over and every such span has ended.
    """

    __slots__ = (
        "_lock",
        "_open",
        "_origin",
        "_settled",
        "closed",
        "events",
        "requested_by",
        "show_memory",
        "step",
    )

    def __init__(self, step: int, *, show_memory: bool = False) -> None:
        #: The global step this trace records (the one the step produces).
        self.step = step
        self.show_memory = show_memory
        self.events: list[dict[str, Any]] = []
        #: Hooks (by plugin index) that asked for this trace, with their options.
        self.requested_by: dict[int, RunOptions] = {}
        self.closed = False
        self._origin = time.perf_counter()
        self._lock = threading.Lock()
        self._open: list[BackgroundSpan] = []
        self._settled = threading.Event()

    def add(
        self,
        plugin: str,
        event: str,
        start: float,
        end: float | None = None,
        *,
        thread: str = "step loop",
        **args: Any,
    ) -> None:
        """Record a span of ``plugin``'s ``event`` from ``start`` to ``end`` (now).

        Times are ``time.perf_counter()`` readings.
        """
        end = time.perf_counter() if end is None else end
        entry = self._entry(plugin, event, start, thread, args)
        entry["dur"] = max(0.0, end - start) * 1e6
        with self._lock:
            self.events.append(entry)

    def begin(self, plugin: str, event: str, *, thread: str) -> BackgroundSpan:
        """Open a span of ``plugin``'s ``event`` that ends later (in ``thread``).

        The trace is not :attr:`finished` until the span's :meth:`~BackgroundSpan.end`.
        """
        span = BackgroundSpan(self, plugin, event, thread)
        with self._lock:
            self._open.append(span)
            self._settled.clear()
        return span

    @property
    def open_spans(self) -> int:
        """How many background spans have begun and not ended."""
        with self._lock:
            return len(self._open)

    @property
    def finished(self) -> bool:
        """The step is over and every background span has ended."""
        with self._lock:
            return self.closed and not self._open

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until :attr:`finished` (or ``timeout`` seconds); whether it is."""
        self._settled.wait(timeout)
        return self.finished

    def _entry(
        self, plugin: str, event: str, start: float, thread: str, args: Mapping[str, Any]
    ) -> dict[str, Any]:
        return {
            "name": f"{plugin}.{event}",
            "cat": event,
            "ph": "X",
            "ts": (start - self._origin) * 1e6,
            "pid": os.getpid(),
            "tid": thread,
            "args": {"plugin": plugin, "event": event, "step": self.step, **args},
        }

    def _end_span(self, span: BackgroundSpan, args: Mapping[str, Any]) -> None:
        end = time.perf_counter()
        with self._lock:
            if span._ended:
                return
            span._ended = True
            entry = self._entry(span.plugin, span.event, span.start, span.thread, args)
            entry["dur"] = max(0.0, end - span.start) * 1e6
            entry["args"]["background"] = True
            self.events.append(entry)
            self._open.remove(span)
            if self.closed and not self._open:
                self._settled.set()

    def memory(self, state: TrainState) -> None:
        """With ``show_memory``, a counter event of the bytes the state holds now."""
        if not self.show_memory:
            return
        total = sum(int(getattr(array, "nbytes", 0)) for array in state.values())
        with self._lock:
            self.events.append(
                {
                    "name": "state memory",
                    "ph": "C",
                    "ts": (time.perf_counter() - self._origin) * 1e6,
                    "pid": os.getpid(),
                    "args": {"bytes": total},
                }
            )

    def close(self) -> None:
        """Called by the session when the step is over."""
        with self._lock:
            self.closed = True
            if not self._open:
                self._settled.set()

    def durations(self) -> dict[tuple[str, str], float]:
        """Seconds spent per ``(plugin, event)`` in this step.

        Ended background spans count under ``"<event> (background)"``: their time
        was spent off the step loop.
        """
        totals: dict[tuple[str, str], float] = {}
        with self._lock:
            for entry in self.events:
                if entry.get("ph") == "X":
                    args = entry["args"]
                    event = args["event"] + (" (background)" if args.get("background") else "")
                    key = (args["plugin"], event)
                    totals[key] = totals.get(key, 0.0) + entry["dur"] / 1e6
        return totals

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as a JSON-ready object Perfetto and ``chrome://tracing`` open.

        A background span still open is a begin event (``"ph": "B"``) marked
        ``unfinished``: the viewers draw it to the end of the trace.
        """
        with self._lock:
            events = list(self.events)
            for span in self._open:
                entry = self._entry(span.plugin, span.event, span.start, span.thread, {})
                entry["ph"] = "B"
                entry["args"].update(background=True, unfinished=True)
                events.append(entry)
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"step": self.step}}


@final
class ProfilerHook(SessionRunHook):
    """Traces a step every ``save_steps`` steps or ``save_secs`` seconds (TF1's hook).

    Each traced step is written to ``<output_dir>/timeline-<global step>.json``
    when the step is over, after the work hooks deferred to the end of the step
    (a checkpoint's snapshot). When that work goes on in the background (the
    checkpoint's write), the file first shows it as unfinished and is written
    again once it has ended (at the next step, or at ``end``, which waits up to
    30 seconds for it). ``show_memory`` adds the state's memory to the trace;
    ``show_dataflow`` marks, on each ``after_run`` span, whether the hook received
    fetched values. At the end, the time each plugin took in the traced steps is
    logged, costliest first (:meth:`cost_table`; background work is listed as
    such). The first step is never traced (it includes warm-up).
    """

    __slots__ = (
        "_costs",
        "_next_step",
        "_request",
        "_step_before",
        "_timer",
        "_unfinished",
        "output_dir",
        "run_metadata",
        "show_dataflow",
        "show_memory",
        "traced_steps",
    )

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        output_dir: str | os.PathLike[str] = "",
        show_dataflow: bool = True,
        show_memory: bool = False,
    ) -> None:
        if (save_steps is None) == (save_secs is None):
            raise ValueError("exactly one of save_steps and save_secs should be provided.")
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self.output_dir = os.fspath(output_dir)
        self.show_dataflow = show_dataflow
        self.show_memory = show_memory
        #: The traces written, by TF1's run-metadata tag ``"step_<N>"``.
        self.run_metadata: dict[str, StepTrace] = {}
        self.traced_steps = 0
        self._costs: dict[tuple[str, str], list[float]] = {}
        self._next_step: int | None = None
        self._request = False
        self._step_before = 0
        self._unfinished: list[tuple[int, StepTrace]] = []

    def begin(self, session: MonitoredSession) -> None:
        self._next_step = None
        self._unfinished = []
        self._timer.reset()
        if self.output_dir:
            os.makedirs(self.output_dir, exist_ok=True)

    @hookimpl(tryfirst=True)  # first, so that every other hook's before_run is traced
    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        from ._run import RunOptions, SessionRunArgs

        if self._unfinished:
            self._rewrite_finished()
        self._step_before = run_context.session.state.global_step
        self._request = self._next_step is not None and self._timer.should_trigger_for_step(
            self._step_before + 1
        )
        if not self._request:
            return None
        return SessionRunArgs(options=RunOptions(trace=True, show_memory=self.show_memory))

    @hookimpl(trylast=True)  # last, so that every other hook's after_run is in the trace
    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._next_step is None:
            # The timer starts now: no trace until N steps or seconds have passed.
            self._timer.update_last_triggered_step(self._step_before)
        global_step = run_context.session.state.global_step
        trace = run_values.run_metadata
        if self._request and isinstance(trace, StepTrace):
            self._timer.update_last_triggered_step(global_step)
            # After the work other hooks deferred to the end of this step (a checkpoint).
            run_context.session.call_after_hooks(lambda: self._save(global_step, trace))
        self._next_step = global_step + 1

    async def end(self, session: MonitoredSession) -> None:
        if self._unfinished:
            waiting = self._unfinished[-1][1]  # writes run one at a time: the last ends last
            await anyio.to_thread.run_sync(waiting.wait_finished, END_WAIT_SECS)
            self._rewrite_finished()
            for step, trace in self._unfinished:
                log.warning(
                    "ProfilerHook: %d background span(s) of step %d had not ended after "
                    "%.0f s; timeline-%d.json shows them as unfinished",
                    trace.open_spans,
                    step,
                    END_WAIT_SECS,
                    step,
                )
                self._count(trace)
            self._unfinished = []
        if not self._costs:
            return
        lines = [
            f"{total * 1e3:10.3f} ms {int(calls):6d} calls  {plugin} {event}"
            for plugin, event, calls, total in self.cost_table()
        ]
        log.info(
            "ProfilerHook: time per plugin over %d traced steps, costliest first:\n%s",
            self.traced_steps,
            "\n".join(lines),
        )

    def cost_table(self) -> list[tuple[str, str, int, float]]:
        """``(plugin, event, calls, seconds)`` over the traced steps, costliest first."""
        rows = [
            (plugin, event, int(calls), total)
            for (plugin, event), (calls, total) in self._costs.items()
        ]
        return sorted(rows, key=lambda row: -row[3])

    def _save(self, global_step: int, trace: StepTrace) -> None:
        self._write(global_step, trace)
        self.run_metadata[f"step_{global_step}"] = trace
        self.traced_steps += 1
        if trace.open_spans:
            self._unfinished.append((global_step, trace))
        else:
            self._count(trace)

    def _write(self, global_step: int, trace: StepTrace) -> None:
        if not self.show_dataflow:
            for event in trace.events:
                event.get("args", {}).pop("fetched", None)
        path = os.path.join(self.output_dir, f"timeline-{global_step}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace.to_chrome_trace(), f)

    def _rewrite_finished(self) -> None:
        """Write again the traces whose background spans have all ended since."""
        still = []
        for global_step, trace in self._unfinished:
            if trace.finished:
                self._write(global_step, trace)
                self._count(trace)
            else:
                still.append((global_step, trace))
        self._unfinished = still

    def _count(self, trace: StepTrace) -> None:
        for key, seconds in trace.durations().items():
            entry = self._costs.setdefault(key, [0.0, 0.0])
            entry[0] += 1
            entry[1] += seconds

    @property
    def costs(self) -> Mapping[tuple[str, str], tuple[int, float]]:
        """``{(plugin, event): (calls, seconds)}`` over the traced steps."""
        return {key: (int(calls), total) for key, (calls, total) in self._costs.items()}
