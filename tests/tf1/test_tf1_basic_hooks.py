"""TensorFlow's ``basic_session_run_hooks_test.py``, ported to ``monitored``'s hooks.

TF drives each hook through a private ``_HookedSession`` and calls ``begin``/``end``
by hand; the ports run the hook in a real ``MonitoredSession`` (so ``end`` runs on
exit). Tensors become step outputs or state entries; ``time.time`` mocks become a
fake clock for ``monitored._core._timer``; TF's fake summary writer becomes a
``write_summaries`` sink. ``CheckpointSaverHook``'s tests are in
``test_tf1_checkpoint_hook.py``, ``SummarySaverHook``'s in ``test_tf1_summary_hook.py``
(see ``tests/tf1/README.md``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tf1 import MOCK_START_TIME, FakeClock, SummarySink, constant_step, do_step, step_by

import monitored
from monitored import (
    FeedFnHook,
    FinalOpsHook,
    GlobalStepWaiterHook,
    LoggingTensorHook,
    SecondOrStepTimer,
    SessionRunContext,
    StepCounterHook,
    StopAtStepHook,
    TrainState,
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("monitored._core._timer.time", fake)
    return fake


# --- SecondOrStepTimerTest ------------------------------------------------------------------


def test_SecondOrStepTimerTest_test_raise_in_both_secs_and_steps() -> None:
    with pytest.raises(ValueError):
        SecondOrStepTimer(every_secs=2.0, every_steps=10)


def test_SecondOrStepTimerTest_test_raise_in_none_secs_and_steps() -> None:
    with pytest.raises(ValueError):
        SecondOrStepTimer()


def test_SecondOrStepTimerTest_test_every_secs(clock: FakeClock) -> None:
    timer = SecondOrStepTimer(every_secs=1.0)
    assert timer.should_trigger_for_step(1)
    timer.update_last_triggered_step(1)
    assert not timer.should_trigger_for_step(1)
    assert not timer.should_trigger_for_step(2)
    clock.value += 1.0
    assert not timer.should_trigger_for_step(1)
    assert timer.should_trigger_for_step(2)


def test_SecondOrStepTimerTest_test_every_steps() -> None:
    timer = SecondOrStepTimer(every_steps=3)
    assert timer.should_trigger_for_step(1)
    timer.update_last_triggered_step(1)
    assert not timer.should_trigger_for_step(1)
    assert not timer.should_trigger_for_step(2)
    assert not timer.should_trigger_for_step(3)
    assert timer.should_trigger_for_step(4)


def test_SecondOrStepTimerTest_test_update_last_triggered_step(clock: FakeClock) -> None:
    timer = SecondOrStepTimer(every_steps=1)
    assert timer.update_last_triggered_step(1) == (None, None)
    clock.value += 0.01  # TF reads the real clock; time passes between the calls
    elapsed_secs, elapsed_steps = timer.update_last_triggered_step(5)
    assert elapsed_secs is not None
    assert elapsed_secs > 0
    assert elapsed_steps == 4
    clock.value += 0.01
    elapsed_secs, elapsed_steps = timer.update_last_triggered_step(7)
    assert elapsed_secs is not None
    assert elapsed_secs > 0
    assert elapsed_steps == 2


# --- StopAtStepTest ---------------------------------------------------------------------------


def test_StopAtStepTest_test_raise_in_both_last_step_and_num_steps() -> None:
    with pytest.raises(ValueError):
        StopAtStepHook(num_steps=10, last_step=20)


def set_step(state: TrainState, value: int) -> None:
    """TF's ``assign(global_step, value)``, run as the step."""
    state.global_step = value


async def _stop_at_steps(hook: StopAtStepHook, steps: list[tuple[int, bool]]) -> None:
    # TF assigns the global step before after_create_session: the session starts at 5.
    async with monitored.MonitoredSession(TrainState(global_step=5), hooks=[hook]) as sess:
        for i, (value, stops) in enumerate(steps):
            if i == len(steps) - 1 and sess.should_stop():
                sess._should_stop = False  # as TF resets mon_sess._should_stop
            await sess.run(set_step, value)
            assert sess.should_stop() == stops, (value, stops)


async def test_StopAtStepTest_test_stop_based_on_last_step() -> None:
    await _stop_at_steps(
        StopAtStepHook(last_step=10), [(5, False), (9, False), (10, True), (11, True)]
    )


async def test_StopAtStepTest_test_stop_based_on_num_step() -> None:
    await _stop_at_steps(
        StopAtStepHook(num_steps=10),
        [(5, False), (13, False), (14, False), (15, True), (16, True)],
    )


async def test_StopAtStepTest_test_stop_based_with_multiple_steps() -> None:
    await _stop_at_steps(StopAtStepHook(num_steps=10), [(5, False), (15, True)])


# --- LoggingTensorHookTest ------------------------------------------------------------------


class LogCatcher(logging.Handler):
    """TF mocks ``tf_logging.info``; here the last INFO line of "monitored" is kept."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.logged_message = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.INFO:
            self.logged_message = record.getMessage()


@pytest.fixture
def logged() -> Any:
    catcher = LogCatcher()
    logger = logging.getLogger("monitored")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(catcher)
    yield catcher
    logger.removeHandler(catcher)
    logger.setLevel(old_level)


def test_LoggingTensorHookTest_test_illegal_args() -> None:
    with pytest.raises(ValueError, match="nvalid every_n_iter"):
        LoggingTensorHook(tensors=["t"], every_n_iter=0)
    with pytest.raises(ValueError, match="nvalid every_n_iter"):
        LoggingTensorHook(tensors=["t"], every_n_iter=-10)
    with pytest.raises(ValueError, match="xactly one of"):
        LoggingTensorHook(tensors=["t"], every_n_iter=5, every_n_secs=5)
    with pytest.raises(ValueError, match="xactly one of"):
        LoggingTensorHook(tensors=["t"])


TRAIN_OP = constant_step(foo=42.0, train=3)


async def test_LoggingTensorHookTest_test_print_at_end_only(logged: LogCatcher) -> None:
    hook = LoggingTensorHook(tensors=["foo"], at_end=True)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        logged.logged_message = ""
        for _ in range(3):
            await sess.run(TRAIN_OP)
            assert "foo" not in logged.logged_message
    assert "foo" in logged.logged_message


async def _validate_print_every_n_steps(logged: LogCatcher, at_end: bool) -> None:
    hook = LoggingTensorHook(tensors=["foo"], every_n_iter=10, at_end=at_end)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(TRAIN_OP)
        assert "foo" in logged.logged_message
        for _ in range(3):
            logged.logged_message = ""
            for _ in range(9):
                await sess.run(TRAIN_OP)
                assert "foo" not in logged.logged_message
            await sess.run(TRAIN_OP)
            assert "foo" in logged.logged_message
        # One more run, to check the reset after several triggers.
        logged.logged_message = ""
        await sess.run(TRAIN_OP)
        assert "foo" not in logged.logged_message
        logged.logged_message = ""
    if at_end:
        assert "foo" in logged.logged_message
    else:
        assert "foo" not in logged.logged_message


async def test_LoggingTensorHookTest_test_print_every_n_steps(logged: LogCatcher) -> None:
    await _validate_print_every_n_steps(logged, at_end=False)
    await _validate_print_every_n_steps(logged, at_end=False)  # a fresh hook starts over


async def test_LoggingTensorHookTest_test_print_every_n_steps_and_end(logged: LogCatcher) -> None:
    await _validate_print_every_n_steps(logged, at_end=True)
    await _validate_print_every_n_steps(logged, at_end=True)


async def test_LoggingTensorHookTest_test_print_first_step(logged: LogCatcher) -> None:
    # Logging every iteration: the first line has no elapsed time.
    hook = LoggingTensorHook(tensors={"foo": "foo"}, every_n_iter=1)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(TRAIN_OP)
        assert "foo" in logged.logged_message
        assert "sec" not in logged.logged_message


async def _validate_print_every_n_secs(logged: LogCatcher, at_end: bool, clock: FakeClock) -> None:
    hook = LoggingTensorHook(tensors=["foo"], every_n_secs=1.0, at_end=at_end)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(TRAIN_OP)
        assert "foo" in logged.logged_message
        logged.logged_message = ""
        await sess.run(TRAIN_OP)
        assert "foo" not in logged.logged_message
        clock.value += 1.0
        logged.logged_message = ""
        await sess.run(TRAIN_OP)
        assert "foo" in logged.logged_message
        logged.logged_message = ""
    if at_end:
        assert "foo" in logged.logged_message
    else:
        assert "foo" not in logged.logged_message


async def test_LoggingTensorHookTest_test_print_every_n_secs(
    logged: LogCatcher, clock: FakeClock
) -> None:
    await _validate_print_every_n_secs(logged, at_end=False, clock=clock)
    await _validate_print_every_n_secs(logged, at_end=False, clock=clock)


async def test_LoggingTensorHookTest_test_print_every_n_secs_and_end(
    logged: LogCatcher, clock: FakeClock
) -> None:
    await _validate_print_every_n_secs(logged, at_end=True, clock=clock)
    await _validate_print_every_n_secs(logged, at_end=True, clock=clock)


async def test_LoggingTensorHookTest_test_print_formatter(logged: LogCatcher) -> None:
    hook = LoggingTensorHook(
        tensors=["foo"], every_n_iter=10, formatter=lambda items: f"qqq={items['foo']}"
    )
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(TRAIN_OP)
        assert logged.logged_message == "qqq=42.0"


# --- StepCounterHookTest --------------------------------------------------------------------


async def test_StepCounterHookTest_test_step_counter_every_n_steps(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sink = SummarySink()
    hook = StepCounterHook(every_n_steps=10)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook, sink]) as sess:
        with caplog.at_level(logging.WARNING, logger="monitored"):
            for _ in range(30):
                clock.value += 0.01
                await sess.run(do_step)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(sink.summaries) == [11, 21]
    for step in [11, 21]:
        assert list(sink.summaries[step]) == ["global_step/sec"]
        assert sink.summaries[step]["global_step/sec"] > 0


async def test_StepCounterHookTest_test_step_counter_every_n_secs(clock: FakeClock) -> None:
    sink = SummarySink()
    hook = StepCounterHook(every_n_steps=None, every_n_secs=0.1)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook, sink]) as sess:
        await sess.run(do_step)
        clock.value += 0.2
        await sess.run(do_step)
        clock.value += 0.2
        await sess.run(do_step)
    assert sink.summaries, "No summaries were created."
    assert sorted(sink.summaries) == [2, 3]
    for summary in sink.summaries.values():
        assert list(summary) == ["global_step/sec"]
        assert summary["global_step/sec"] > 0


async def test_StepCounterHookTest_test_log_warning_if_global_step_not_increased(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # TF's StepCounterHook warns; here the session itself warns (naming the step
    # function), whatever hooks are installed.
    hook = StepCounterHook(every_n_steps=1, every_n_secs=None)

    def keep_same(state: TrainState) -> None:
        """TF's ``_increment_global_step(0)``."""

    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(keep_same)  # one step to record the global step
        with caplog.at_level(logging.WARNING, logger="monitored"):
            for _ in range(30):
                await sess.run(keep_same)
        assert any(
            "has not been increased" in r.getMessage() and "global step" in r.getMessage()
            for r in caplog.records
        )


async def _steps_per_run(every_n_steps: int, steps_per_run: int, clock: FakeClock) -> SummarySink:
    # TF tells the hook steps_per_run through a private setter; here the hook reads
    # the global step each step leaves, so a step that adds steps_per_run suffices.
    sink = SummarySink()
    hook = StepCounterHook(every_n_steps=every_n_steps)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook, sink]) as sess:
        for _ in range(5):
            clock.value += 0.01
            await sess.run(step_by(steps_per_run))
    for summary in sink.summaries.values():
        assert list(summary) == ["global_step/sec"]
        assert summary["global_step/sec"] > 0
    return sink


async def test_StepCounterHookTest_test_steps_per_run_less_than_every_n_steps(
    clock: FakeClock,
) -> None:
    sink = await _steps_per_run(10, 5, clock)
    assert sorted(sink.summaries) == [15, 25]


async def test_StepCounterHookTest_test_steps_per_run_equal_every_n_steps(clock: FakeClock) -> None:
    sink = await _steps_per_run(5, 5, clock)
    assert sorted(sink.summaries) == [10, 15, 20, 25]


async def test_StepCounterHookTest_test_steps_per_run_greater_than_every_n_steps(
    clock: FakeClock,
) -> None:
    sink = await _steps_per_run(5, 10, clock)
    assert sorted(sink.summaries) == [20, 30, 40, 50]


# --- GlobalStepWaiterHookTest ---------------------------------------------------------------


async def test_GlobalStepWaiterHookTest_test_not_wait_for_step_zero() -> None:
    hook = GlobalStepWaiterHook(wait_until_step=0)
    async with monitored.MonitoredSession(TrainState()) as sess:
        # Returns without waiting for the global step to grow.
        await hook.before_run(SessionRunContext(None, sess))


async def test_GlobalStepWaiterHookTest_test_wait_for_step(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = GlobalStepWaiterHook(wait_until_step=1000)
    async with monitored.MonitoredSession(TrainState()) as sess:
        counter = 0

        async def fake_sleep(seconds: float) -> None:
            nonlocal counter
            counter += 1
            if counter == 1:
                sess.state.global_step = 500  # the first sleep: 0 -> 500
            elif counter == 2:
                sess.state.global_step = 1100  # the second sleep: 500 -> 1100
            else:
                raise AssertionError("before_run should return after the second sleep")

        monkeypatch.setattr("monitored._core._basic_hooks.anyio.sleep", fake_sleep)
        await hook.before_run(SessionRunContext(None, sess))
        assert counter == 2


# --- FinalOpsHookTest -----------------------------------------------------------------------


async def test_FinalOpsHookTest_test_final_ops_is_scalar_tensor() -> None:
    expected_value = 4
    hook = FinalOpsHook("final")
    state = TrainState({"final": np.asarray(expected_value)})
    async with monitored.MonitoredSession(state, hooks=[hook]):
        pass
    assert hook.final_ops_values == expected_value


async def test_FinalOpsHookTest_test_final_ops_is_tensor() -> None:
    expected_values = [1, 6, 3, 5, 2, 4]
    hook = FinalOpsHook("final")
    state = TrainState({"final": np.asarray(expected_values)})
    async with monitored.MonitoredSession(state, hooks=[hook]):
        pass
    assert hook.final_ops_values.tolist() == expected_values


async def test_FinalOpsHookTest_test_final_ops_triggers_out_of_range_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dataset = iter(range(1))
    next(dataset)  # the input is read to its end, as TF's session.run(read_ops)

    def read_ops(state: TrainState) -> Any:
        try:
            return next(dataset)
        except StopIteration:
            raise monitored.OutOfRangeError("End of sequence") from None

    hook = FinalOpsHook(read_ops)
    async with monitored.MonitoredSession(TrainState()) as sess:
        with (
            caplog.at_level(logging.WARNING, logger="monitored"),
            pytest.raises(monitored.OutOfRangeError, match="End of sequence"),
        ):
            await hook.end(sess)
        assert "dependency back to some input source" in caplog.text


async def test_FinalOpsHookTest_test_final_ops_with_dictionary() -> None:
    expected_values = [4, -3]
    hook = FinalOpsHook(lambda state, x: np.asarray(x, np.float32), {"x": expected_values})
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]):
        pass
    assert hook.final_ops_values.tolist() == expected_values


# --- FeedFnHookTest -------------------------------------------------------------------------


async def test_FeedFnHookTest_test_feeding_placeholder() -> None:
    def y(state: TrainState, x: float) -> dict[str, Any]:
        state.global_step += 1
        return {"y": x + 1}

    hook = FeedFnHook(feed_fn=lambda: {"x": 1.0})
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        assert (await sess.run(y))["y"] == 2


# --- ProfilerHookTest -----------------------------------------------------------------------


def _timeline_files(output_dir: Path) -> list[str]:
    return sorted(p.name for p in output_dir.glob("timeline-*.json"))


def _count_timeline_files(output_dir: Path) -> int:
    return len(_timeline_files(output_dir))


def test_ProfilerHookTest_test_raise_in_both_secs_and_steps() -> None:
    with pytest.raises(ValueError):
        monitored.ProfilerHook(save_secs=10, save_steps=20)


def test_ProfilerHookTest_test_raise_in_none_secs_and_steps() -> None:
    with pytest.raises(ValueError):
        monitored.ProfilerHook(save_secs=None, save_steps=None)


async def test_ProfilerHookTest_test_save_secs_does_not_save_in_first_step(tmp_path: Path) -> None:
    hook = monitored.ProfilerHook(save_secs=2, output_dir=str(tmp_path))
    async with monitored.SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)
        assert _count_timeline_files(tmp_path) == 0


async def test_ProfilerHookTest_test_save_secs_saves_periodically(
    tmp_path: Path, clock: FakeClock
) -> None:
    hook = monitored.ProfilerHook(save_secs=2, output_dir=str(tmp_path))
    async with monitored.SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)  # not saved
        assert _count_timeline_files(tmp_path) == 0
        clock.value = MOCK_START_TIME + 2.5  # 2.5 seconds later
        await sess.run(do_step)  # saved
        assert _count_timeline_files(tmp_path) == 1
        clock.value = MOCK_START_TIME + 2.6
        await sess.run(do_step)  # not saved
        clock.value = MOCK_START_TIME + 4.4  # just before the next save
        await sess.run(do_step)  # not saved
        assert _count_timeline_files(tmp_path) == 1
        clock.value = MOCK_START_TIME + 4.5
        await sess.run(do_step)  # saved
        assert _count_timeline_files(tmp_path) == 2


async def test_ProfilerHookTest_test_save_steps_does_not_save_in_first_step(
    tmp_path: Path,
) -> None:
    hook = monitored.ProfilerHook(save_steps=1, output_dir=str(tmp_path))
    async with monitored.SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)  # not saved
        assert _count_timeline_files(tmp_path) == 0


async def test_ProfilerHookTest_test_save_steps_saves_periodically(tmp_path: Path) -> None:
    hook = monitored.ProfilerHook(save_steps=2, output_dir=str(tmp_path))
    async with monitored.SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        assert _count_timeline_files(tmp_path) == 0
        for expected in [0, 1, 1, 2, 2]:  # saved at the 2nd and 4th runs
            await sess.run(do_step)
            assert _count_timeline_files(tmp_path) == expected


async def test_ProfilerHookTest_test_run_metadata_saves(tmp_path: Path) -> None:
    # TF checks the run metadata its writer got ("step_2"); here the trace of step 2
    # is what the hook records, and the traced step's metadata reaches the hook.
    hook = monitored.ProfilerHook(save_steps=1, output_dir=str(tmp_path))
    async with monitored.SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)  # not saved
        await sess.run(do_step)  # saved
        assert _timeline_files(tmp_path) == ["timeline-2.json"]
        assert list(hook.run_metadata) == ["step_2"]
