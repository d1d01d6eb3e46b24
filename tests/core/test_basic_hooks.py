"""The built-in hooks, with TF1's arguments, validation and timing."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import numpy as np
import pytest
from _helpers import counting_step

import monitored
from monitored import TrainState


async def train(
    state: TrainState, hooks: list[Any], limit: int = 100
) -> monitored.MonitoredSession:
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        for _ in range(limit):
            if sess.should_stop():
                break
            await sess.run(counting_step)
    return sess


# --- StopAtStepHook --------------------------------------------------------------------


def test_stop_at_step_needs_exactly_one_argument() -> None:
    with pytest.raises(ValueError, match="One of num_steps or last_step must be specified."):
        monitored.StopAtStepHook()
    with pytest.raises(ValueError, match="Only one of num_steps or last_step can be specified."):
        monitored.StopAtStepHook(num_steps=1, last_step=2)
    with pytest.raises(ValueError, match="num_steps must be >= 0"):
        monitored.StopAtStepHook(num_steps=-1)


async def test_last_step_runs_exactly_that_many_steps_from_zero(state: TrainState) -> None:
    await train(state, [monitored.StopAtStepHook(last_step=3)])
    assert state.global_step == 3


async def test_num_steps_counts_from_the_step_at_creation(state: TrainState) -> None:
    state.global_step = 5
    hook = monitored.StopAtStepHook(num_steps=2)
    await train(state, [hook])
    assert state.global_step == 7
    assert hook.last_step == 7


async def test_already_past_last_step_runs_no_step(state: TrainState) -> None:
    state.global_step = 4
    async with monitored.MonitoredSession(
        state, hooks=[monitored.StopAtStepHook(last_step=3)]
    ) as sess:
        assert sess.should_stop()
    assert state.global_step == 4


# --- StepCounterHook ------------------------------------------------------------------------


async def test_step_counter_writes_global_step_per_sec_at_tf1_steps(state: TrainState) -> None:
    written: list[int] = []

    class Sink:
        def write_summaries(self, step: int, summaries: dict[str, float]) -> None:
            assert set(summaries) == {"global_step/sec"}
            assert summaries["global_step/sec"] > 0
            written.append(step)

    hooks = [
        monitored.StepCounterHook(every_n_steps=2),
        Sink(),
        monitored.StopAtStepHook(last_step=7),
    ]
    await train(state, hooks)
    assert written == [3, 5, 7]


def test_step_counter_needs_exactly_one_period() -> None:
    with pytest.raises(ValueError, match="exactly one of every_n_steps and every_n_secs"):
        monitored.StepCounterHook(every_n_steps=None, every_n_secs=None)
    with pytest.raises(ValueError, match="exactly one of every_n_steps and every_n_secs"):
        monitored.StepCounterHook(every_n_steps=2, every_n_secs=1.0)


# --- LoggingTensorHook --------------------------------------------------------------------


async def test_logging_tensor_hook_every_n_iter(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    hook = monitored.LoggingTensorHook({"loss": "loss", "step": "global_step"}, every_n_iter=2)
    await train(state, [hook, monitored.StopAtStepHook(last_step=5)])
    lines = [r.getMessage() for r in caplog.records if "loss =" in r.getMessage()]
    assert len(lines) == 3  # iterations 0, 2, 4
    assert lines[0].startswith("loss = 3, step = 1")
    assert "sec)" in lines[1]


async def test_logging_tensor_hook_at_end_with_formatter(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    hook = monitored.LoggingTensorHook(
        ["w"], at_end=True, formatter=lambda values: f"final w {values['w'].tolist()}"
    )
    await train(state, [hook, monitored.StopAtStepHook(last_step=2)])
    assert [r.getMessage() for r in caplog.records if "final" in r.getMessage()] == [
        "final w [2.0, 2.0, 2.0]"
    ]


def test_logging_tensor_hook_validation() -> None:
    with pytest.raises(ValueError, match="exactly one of every_n_iter and every_n_secs"):
        monitored.LoggingTensorHook(["loss"])
    with pytest.raises(ValueError, match="exactly one of every_n_iter and every_n_secs"):
        monitored.LoggingTensorHook(["loss"], every_n_iter=1, every_n_secs=1)
    with pytest.raises(ValueError, match=r"invalid every_n_iter=0\."):
        monitored.LoggingTensorHook(["loss"], every_n_iter=0)
    with pytest.raises(TypeError, match="list of names or a dict"):
        monitored.LoggingTensorHook("loss", every_n_iter=1)  # type: ignore[arg-type]


# --- GlobalStepWaiterHook -----------------------------------------------------------------


async def test_global_step_waiter_waits_for_the_chief(state: TrainState) -> None:
    """A worker session on the same state waits until the chief reaches step 3."""
    state.initialized = True
    seen_at_first_worker_step: list[int] = []

    def worker_step(state: TrainState) -> None:
        seen_at_first_worker_step.append(state.global_step)

    async def worker() -> None:
        hooks = [monitored.GlobalStepWaiterHook(3, poll_secs=0.01)]
        async with monitored.MonitoredSession(state, hooks=hooks, is_chief=False) as sess:
            await sess.run(worker_step)

    async def chief() -> None:
        for _ in range(5):
            await anyio.sleep(0.02)
            state.global_step += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        tg.start_soon(chief)
    assert seen_at_first_worker_step[0] >= 3


async def test_global_step_waiter_gives_up_when_stopping(state: TrainState) -> None:
    async with monitored.MonitoredSession(
        state, hooks=[monitored.GlobalStepWaiterHook(10**9, poll_secs=0.01)]
    ) as sess:
        sess.coord.request_stop()
        with anyio.fail_after(5):
            await sess._run_hooked(counting_step, (), {})


# --- FinalOpsHook, FeedFnHook ----------------------------------------------------------------


async def test_final_ops_with_names_and_with_a_callable(state: TrainState) -> None:
    by_name = monitored.FinalOpsHook({"w": "w", "loss": "loss"})
    by_fn = monitored.FinalOpsHook(lambda state, scale: state["w"] * scale, {"scale": 2})
    assert by_name.final_ops_values is None
    await train(state, [by_name, by_fn, monitored.StopAtStepHook(last_step=2)])
    np.testing.assert_array_equal(by_name.final_ops_values["w"], [2, 2, 2])
    assert by_name.final_ops_values["loss"] == 6.0
    np.testing.assert_array_equal(by_fn.final_ops_values, [4, 4, 4])


def test_final_ops_feed_dict_needs_a_callable() -> None:
    with pytest.raises(ValueError, match="needs final_ops to be a callable"):
        monitored.FinalOpsHook(["w"], {"x": 1})


async def test_feed_fn_hook_feeds_every_step(state: TrainState) -> None:
    counter = iter(range(100))
    seen = []

    def step(state: TrainState, lr: int) -> None:
        seen.append(lr)
        state.global_step += 1

    hooks = [monitored.FeedFnHook(lambda: {"lr": next(counter)})]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        for _ in range(3):
            await sess.run(step)
    assert seen == [0, 1, 2]


async def test_logging_tensor_hook_at_end_without_any_step_logs_nothing(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredSession(
        state, hooks=[monitored.LoggingTensorHook(["loss"], at_end=True)]
    ):
        pass
    assert "loss" not in caplog.text
