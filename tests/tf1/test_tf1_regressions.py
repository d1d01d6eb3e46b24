"""Regression tests for the TF1 differences fixed in issue 15 (section 2), and the
APIs it added, beyond what TF's own tests (the other ``test_tf1_*`` files) check."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from _tf1 import do_step

import monitored
from monitored import MonitoredSession, RunOptions, SessionRunArgs, TrainState


async def test_an_unavailable_error_from_a_background_task_recreates_the_session() -> None:
    created = []
    fail_now = anyio.Event()

    class Input(monitored.SessionRunHook):
        def after_create_session(self, session: Any, coord: monitored.Coordinator) -> None:
            created.append(session.state.global_step)
            if len(created) == 1:

                async def service() -> None:
                    await fail_now.wait()
                    raise monitored.UnavailableError("the input service went away")

                coord.start_soon(service)

    async with MonitoredSession(TrainState(), hooks=[Input()]) as sess:
        await sess.run(do_step)
        fail_now.set()
        with anyio.fail_after(5):
            await sess.coord.wait_for_stop()  # the task fails in the background
        assert not sess.should_stop()  # a recoverable error is not a stop
        await sess.run(do_step)  # re-creates the session first, then runs
        assert created == [0, 1]
        assert sess.coord.exception is None
        assert sess.state.global_step == 2


async def test_a_recoverable_coordinator_error_past_max_recoveries_is_raised() -> None:
    session = MonitoredSession(TrainState(), max_recoveries=0)
    with pytest.raises(monitored.AbortedError, match="peer lost"):
        async with session:
            await session.run(do_step)
            session.coord.request_stop(monitored.AbortedError("peer lost"))
            assert session.should_stop()
            await session.run(do_step)


async def test_a_retried_first_creation_runs_init_fn_again() -> None:
    calls = []

    def init_fn(state: TrainState) -> None:
        calls.append("init")
        if len(calls) == 1:
            raise monitored.AbortedError("lost the chief's connection")
        state["w"] = np.ones(2)

    state = TrainState()
    async with MonitoredSession(state, scaffold=monitored.Scaffold(init_fn=init_fn)):
        assert calls == ["init", "init"]
        assert state["w"].tolist() == [1.0, 1.0]


async def test_a_second_session_on_the_same_state_may_add_entries_in_begin() -> None:
    class AddsEntry:
        def __init__(self, name: str) -> None:
            self.name = name

        def begin(self, session: MonitoredSession) -> None:
            session.state[self.name] = np.zeros(1)

    state = TrainState()
    async with MonitoredSession(state, hooks=[AddsEntry("train_metric")]):
        assert state.finalized
    assert not state.finalized
    async with MonitoredSession(state, hooks=[AddsEntry("eval_metric")]):
        pass
    assert {"train_metric", "eval_metric"} <= set(state)


async def test_a_raw_session_kept_past_close_refuses_to_run() -> None:
    async with monitored.SingularMonitoredSession(TrainState()) as sess:
        raw = sess.raw_session()
        assert raw is not None
    assert sess.raw_session() is None
    with pytest.raises(RuntimeError, match=r"RawSession.run\(do_step\): the session is closed"):
        await raw.run(do_step)


async def test_close_inside_async_with_after_an_error_keeps_the_error() -> None:
    with pytest.raises(ValueError, match="body failed"):
        async with MonitoredSession(TrainState()) as sess:
            await sess.close()
            raise ValueError("body failed")


@pytest.mark.parametrize(
    "step_fn",
    [
        lambda: None,
        lambda step_context, *, extra: None,
        lambda step_context, extra, more=1: None,
    ],
)
async def test_run_step_fn_refuses_functions_that_do_not_take_one_step_context(
    step_fn: Any,
) -> None:
    async with MonitoredSession(TrainState()) as sess:
        with pytest.raises(ValueError, match="may either have one `step_context` argument"):
            await sess.run_step_fn(step_fn)


async def test_run_step_fn_accepts_extra_parameters_with_defaults() -> None:
    async with MonitoredSession(TrainState()) as sess:
        assert await sess.run_step_fn(lambda step_context, extra=3: extra) == 3


async def test_logging_tensor_hook_at_end_logs_state_entries_when_steps_return_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def step(state: TrainState) -> None:
        state["w"] += 1
        state.global_step += 1

    hook = monitored.LoggingTensorHook(["w", "global_step"], at_end=True)
    with caplog.at_level(logging.INFO, logger="monitored"):
        async with MonitoredSession(TrainState({"w": np.zeros(())}), hooks=[hook]) as sess:
            await sess.run(step)
            await sess.run(step)
    assert "w = 2, global_step = 2" in caplog.text


def test_session_run_args_refuses_options_it_cannot_honour() -> None:
    with pytest.raises(TypeError, match="must be a monitored.RunOptions"):
        SessionRunArgs(options={"trace_level": 3})  # type: ignore[arg-type]


async def test_a_trace_request_reaches_the_asking_hook_only() -> None:
    seen: dict[str, Any] = {}

    class Tracer:
        plugin_name = "tracer"

        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs(options=RunOptions(trace=True))

        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen["tracer"] = run_values

    class Other:
        plugin_name = "other"

        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs("w")

        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen["other"] = run_values

    def step(state: TrainState) -> None:
        state.global_step += 1

    async with MonitoredSession(TrainState({"w": np.zeros(1)}), hooks=[Tracer(), Other()]) as sess:
        await sess.run(step)
        assert sess.current_trace is None  # only while the step runs
    trace = seen["tracer"].run_metadata
    assert isinstance(trace, monitored.StepTrace)
    assert seen["tracer"].options == RunOptions(trace=True)
    assert seen["other"].options is None
    assert seen["other"].run_metadata is None
    assert seen["other"].results.tolist() == [0.0]
    names = [event["name"] for event in trace.events]
    assert names[:3] == ["other.before_run", "step.step", "session.fetch"]
    assert "tracer.after_run" in names
    assert trace.step == 1


async def test_profiler_hook_writes_a_chrome_trace_and_a_cost_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Slowish(monitored.SessionRunHook):
        plugin_name = "slowish"

        def after_run(self, run_context: Any, run_values: Any) -> None:
            sum(range(1000))

    profiler = monitored.ProfilerHook(save_steps=1, output_dir=str(tmp_path), show_memory=True)
    with caplog.at_level(logging.INFO, logger="monitored"):
        async with MonitoredSession(
            TrainState({"w": np.zeros(4)}), hooks=[profiler, Slowish()]
        ) as sess:
            for _ in range(3):
                await sess.run(do_step)
    trace = json.loads((tmp_path / "timeline-3.json").read_text())
    names = {event["name"] for event in trace["traceEvents"]}
    assert {"step.do_step", "slowish.after_run", "state memory"} <= names
    assert all(event["ph"] in {"X", "C"} for event in trace["traceEvents"])
    assert profiler.traced_steps == 2  # steps 2 and 3; the first is never traced
    table = profiler.cost_table()
    assert ("slowish", "after_run", 2) in [row[:3] for row in table]
    assert "time per plugin over 2 traced steps" in caplog.text
    assert "slowish after_run" in caplog.text


async def test_a_looper_thread_stops_with_the_session() -> None:
    calls = []
    async with MonitoredSession(TrainState()) as sess:
        looper = monitored.LooperThread.loop(sess.coord, 0.001, target=calls.append, args=(1,))
        assert looper.is_alive()
        assert looper in sess.coord.registered_threads
    assert not looper.is_alive()
    assert calls


async def test_a_looper_thread_without_interval_calls_its_target_once() -> None:
    coord = monitored.Coordinator()
    calls = []
    looper = monitored.LooperThread(coord, None, target=lambda: calls.append(1))
    looper.start()
    coord.request_stop()
    await coord.join([looper])
    assert calls == [1]


def test_a_looper_thread_needs_a_coordinator_and_a_target_for_args() -> None:
    with pytest.raises(ValueError, match="must be a Coordinator"):
        monitored.LooperThread(object(), 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="require that you also pass 'target'"):
        monitored.LooperThread(monitored.Coordinator(), 1.0, args=(1,))


async def test_a_looper_thread_failure_stops_the_coordinator_with_it() -> None:
    coord = monitored.Coordinator()

    def boom() -> None:
        raise KeyError("looper failed")

    looper = monitored.LooperThread.loop(coord, 0, target=boom)
    with pytest.raises(KeyError, match="looper failed"):
        await coord.join([looper])
    assert isinstance(threading.current_thread(), threading.Thread)


async def test_a_looper_task_runs_an_async_target_until_the_session_stops() -> None:
    calls = []

    async def poll(tag: str) -> None:
        calls.append(tag)
        if len(calls) == 3:
            raise monitored.OutOfRangeError("input exhausted")  # a clean stop

    async with MonitoredSession(TrainState()) as sess:
        sess.coord.start_looper(0, poll, "x")
        with anyio.fail_after(5):
            await sess.coord.wait_for_stop()
        assert sess.should_stop()
    assert calls == ["x", "x", "x"]


async def test_a_singular_session_raises_the_root_cause_the_coordinator_holds() -> None:
    class Stuck(monitored.SessionRunHook):
        """A step fails (a cancelled read) because a thread lost its peer."""

        def after_create_session(self, session: Any, coord: monitored.Coordinator) -> None:
            self.coord = coord

        def after_run(self, run_context: Any, run_values: Any) -> None:
            self.coord.request_stop(monitored.AbortedError("peer lost"))
            raise TimeoutError("read cancelled")

    with pytest.raises(monitored.AbortedError, match="peer lost") as info:
        async with monitored.SingularMonitoredSession(TrainState(), hooks=[Stuck()]) as sess:
            await sess.run(do_step)
    assert isinstance(info.value.__cause__, TimeoutError)
