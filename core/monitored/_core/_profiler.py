"""Tracing a step as the session sees it, and ``ProfilerHook``, which writes traces.

A hook asks for a trace with ``SessionRunArgs(options=RunOptions(trace=True))``;
the session then records the rest of that step: each hook call (plugin, event),
the step function and the batched fetch, as complete events of the trace-event
format that Perfetto and ``chrome://tracing`` open. Steps nobody traces record
nothing. ``ProfilerHook`` asks for a trace every N steps or seconds, writes
``timeline-<step>.json`` files as TF1's does, and at the end logs what each
plugin cost over the traced steps (the ``pytest --durations`` habit).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

from ._markers import hookimpl
from ._session_run_hook import SessionRunHook
from ._timer import SecondOrStepTimer

if TYPE_CHECKING:
    from ._run import RunOptions, SessionRunArgs, SessionRunContext, SessionRunValues
    from ._session import MonitoredSession
    from ._state import TrainState

__all__ = ["ProfilerHook", "StepTrace"]

log = logging.getLogger("monitored")


@final
class StepTrace:
    """The record of one traced step: spans in Chrome's trace-event format.

    ``events`` are complete events (``"ph": "X"``) named ``"<plugin>.<event>"``;
    :meth:`add` is thread-safe, so a plugin's worker thread (a background write)
    may add its spans while the trace is open (``session.current_trace``).
    """

    __slots__ = ("_lock", "_origin", "closed", "events", "requested_by", "show_memory", "step")

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
        entry = {
            "name": f"{plugin}.{event}",
            "cat": event,
            "ph": "X",
            "ts": (start - self._origin) * 1e6,
            "dur": max(0.0, end - start) * 1e6,
            "pid": os.getpid(),
            "tid": thread,
            "args": {"plugin": plugin, "event": event, "step": self.step, **args},
        }
        with self._lock:
            self.events.append(entry)

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
        self.closed = True

    def durations(self) -> dict[tuple[str, str], float]:
        """Seconds spent per ``(plugin, event)`` in this step."""
        totals: dict[tuple[str, str], float] = {}
        with self._lock:
            for entry in self.events:
                if entry.get("ph") == "X":
                    key = (entry["args"]["plugin"], entry["args"]["event"])
                    totals[key] = totals.get(key, 0.0) + entry["dur"] / 1e6
        return totals

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as a JSON-ready object Perfetto and ``chrome://tracing`` open."""
        with self._lock:
            events = list(self.events)
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"step": self.step}}


@final
class ProfilerHook(SessionRunHook):
    """Traces a step every ``save_steps`` steps or ``save_secs`` seconds (TF1's hook).

    Each traced step is written to ``<output_dir>/timeline-<global step>.json``.
    ``show_memory`` adds the state's memory to the trace; ``show_dataflow`` marks,
    on each ``after_run`` span, whether the hook received fetched values. At the
    end, the time each plugin took in the traced steps is logged, costliest first
    (:meth:`cost_table`). The first step is never traced (it includes warm-up).
    """

    __slots__ = (
        "_costs",
        "_next_step",
        "_request",
        "_step_before",
        "_timer",
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

    def begin(self, session: MonitoredSession) -> None:
        self._next_step = None
        self._timer.reset()
        if self.output_dir:
            os.makedirs(self.output_dir, exist_ok=True)

    @hookimpl(tryfirst=True)  # first, so that every other hook's before_run is traced
    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        from ._run import RunOptions, SessionRunArgs

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
            self._save(global_step, trace)
        self._next_step = global_step + 1

    def end(self, session: MonitoredSession) -> None:
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
        if not self.show_dataflow:
            for event in trace.events:
                event.get("args", {}).pop("fetched", None)
        path = os.path.join(self.output_dir, f"timeline-{global_step}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace.to_chrome_trace(), f)
        self.run_metadata[f"step_{global_step}"] = trace
        self.traced_steps += 1
        for key, seconds in trace.durations().items():
            entry = self._costs.setdefault(key, [0.0, 0.0])
            entry[0] += 1
            entry[1] += seconds

    @property
    def costs(self) -> Mapping[tuple[str, str], tuple[int, float]]:
        """``{(plugin, event): (calls, seconds)}`` over the traced steps."""
        return {key: (int(calls), total) for key, (calls, total) in self._costs.items()}
