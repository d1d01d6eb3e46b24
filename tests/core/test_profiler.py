"""StepTrace's background spans and ProfilerHook's timelines of work that outlives a step."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import MonitoredSession, ProfilerHook, StepTrace, TrainState


def step(state: TrainState) -> None:
    state.global_step += 1


def events(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["traceEvents"])


def test_a_background_span_ends_in_another_thread_and_finishes_the_trace() -> None:
    trace = StepTrace(7)
    span = trace.begin("writer", "write", thread="writer thread")
    trace.close()
    assert (trace.open_spans, trace.finished) == (1, False)
    assert not trace.wait_finished(timeout=0.01)
    (unfinished,) = trace.to_chrome_trace()["traceEvents"]
    assert unfinished["ph"] == "B"
    assert unfinished["args"] == {
        "plugin": "writer",
        "event": "write",
        "step": 7,
        "background": True,
        "unfinished": True,
    }

    worker = threading.Thread(target=span.end, kwargs={"path": "/x"})
    worker.start()
    assert trace.wait_finished(timeout=10)
    worker.join()
    span.end(path="again")  # a second end is ignored
    (ended,) = trace.to_chrome_trace()["traceEvents"]
    assert (ended["ph"], ended["tid"], ended["args"]["path"]) == ("X", "writer thread", "/x")
    assert set(trace.durations()) == {("writer", "write (background)")}


def test_a_trace_without_background_spans_is_finished_when_the_step_closes_it() -> None:
    trace = StepTrace(1)
    trace.add("hook", "after_run", time.perf_counter())
    assert not trace.finished
    trace.close()
    assert trace.finished
    assert trace.wait_finished(timeout=0)


class BackgroundWork:
    """Starts work at the end of each traced step that a test ends by hand."""

    plugin_name = "background_work"

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def after_run(self, run_context: Any, run_values: Any) -> None:
        session = run_context.session
        session.call_after_hooks(lambda: self._start(session))

    def _start(self, session: MonitoredSession) -> None:
        trace = session.current_trace
        if trace is not None:
            self.spans.append(trace.begin("background_work", "write", thread="worker"))


async def test_timelines_show_background_work_unfinished_then_rewritten_once_it_ended(
    tmp_path: Path,
) -> None:
    work = BackgroundWork()
    profiler = ProfilerHook(save_steps=1, output_dir=tmp_path)
    async with MonitoredSession(TrainState(), hooks=[profiler, work]) as sess:
        await sess.run(step)
        await sess.run(step)  # traced: step 2
        [span] = work.spans
        (write,) = [e for e in events(tmp_path / "timeline-2.json") if e["cat"] == "write"]
        assert (write["ph"], write["args"]["unfinished"]) == ("B", True)

        worker = threading.Thread(target=span.end, kwargs={"path": "done"})
        worker.start()
        worker.join()
        await sess.run(step)  # the next step writes timeline-2.json again
        (write,) = [e for e in events(tmp_path / "timeline-2.json") if e["cat"] == "write"]
        assert (write["ph"], write["args"]["path"]) == ("X", "done")
        work.spans[-1].end()
    assert ("background_work", "write (background)") in profiler.costs


async def test_end_waits_for_background_work_and_warns_about_work_that_never_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("monitored._core._profiler.END_WAIT_SECS", 0.05)
    work = BackgroundWork()
    profiler = ProfilerHook(save_steps=1, output_dir=tmp_path)
    async with MonitoredSession(
        TrainState({"w": np.zeros(2)}), hooks=[profiler, work, monitored.StopAtStepHook(2)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert "1 background span(s) of step 2 had not ended" in caplog.text
    (write,) = [e for e in events(tmp_path / "timeline-2.json") if e["cat"] == "write"]
    assert write["ph"] == "B"
