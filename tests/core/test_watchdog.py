"""A hook or step function that holds the event loop is named in one warning."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import pytest

import monitored
from monitored import TrainState
from monitored._core._watchdog import BLOCKED_LOOP_ENV, FROM_ENV, blocked_loop_threshold

#: Short enough for a quick test, long enough that a loaded machine's pauses do not count.
THRESHOLD = 0.3
BLOCK = 1.0


def step(state: TrainState) -> None:
    state.global_step += 1


class SlowAfterRun:
    """Holds the loop in ``after_run`` of step 2."""

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_context.session.state.global_step == 2:
            time.sleep(BLOCK)


async def train(hooks: list[object], step_fn: Any = step, **kwargs: Any) -> None:
    hooks = [*hooks, monitored.StopAtStepHook(last_step=4)]
    async with monitored.MonitoredSession(TrainState(), hooks=hooks, **kwargs) as sess:
        while not sess.should_stop():
            await sess.run(step_fn)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]


async def test_a_hook_blocking_the_event_loop_is_named_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class SlowTwice(SlowAfterRun):
        def before_run(self, run_context: Any) -> None:
            if run_context.session.state.global_step == 3:
                time.sleep(BLOCK)

    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([SlowTwice()], blocked_loop_warning_secs=THRESHOLD)
    [message] = warnings_of(caplog)  # one warning, though the loop was held twice
    assert message.startswith("hook 'after_run' of hook 'hooks[0]:SlowTwice' (")
    assert "anyio.to_thread.run_sync" in message
    held = float(message.split("held the event loop for ")[1].split(" s")[0])
    assert THRESHOLD <= held <= BLOCK + 0.5


async def test_an_async_hook_blocking_the_event_loop_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class AsyncButBlocking:
        async def after_run(self, run_context: Any, run_values: Any) -> None:
            if run_context.session.state.global_step == 2:
                time.sleep(BLOCK)  # noqa: ASYNC251 (the blocking under test)

    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([AsyncButBlocking()], blocked_loop_warning_secs=THRESHOLD)
    [message] = warnings_of(caplog)
    assert message.startswith("hook 'after_run' of hook 'hooks[0]:AsyncButBlocking'")


async def test_a_step_function_blocking_the_event_loop_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def slow_step(state: TrainState) -> None:
        if state.global_step == 1:
            time.sleep(BLOCK)
        state.global_step += 1

    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([], slow_step, blocked_loop_warning_secs=THRESHOLD)
    [message] = warnings_of(caplog)
    assert message.startswith("step function tests.core.test_watchdog.")
    assert "slow_step (line" in message


async def test_a_plugin_blocking_in_end_is_named_with_its_distribution(
    fake_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake_plugin("sleepy", f"import time\n\ndef end():\n    time.sleep({BLOCK})\n", version="0.9")
    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([], blocked_loop_warning_secs=THRESHOLD)
    [message] = warnings_of(caplog)
    assert message.startswith("hook 'end' of plugin 'sleepy' (distribution monitored-sleepy 0.9)")


async def test_a_deferred_callback_blocking_the_event_loop_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def slow_save() -> None:
        time.sleep(BLOCK)

    class Defers:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            if run_context.session.state.global_step == 2:
                run_context.session.call_after_hooks(slow_save)

    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([Defers()], blocked_loop_warning_secs=THRESHOLD)
    [message] = warnings_of(caplog)
    assert message.startswith("callback tests.core.test_watchdog.")
    assert "slow_save (line" in message
    assert "deferred with call_after_hooks" in message


async def test_blocking_outside_the_sessions_calls_is_located(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="monitored"):
        async with monitored.MonitoredSession(
            TrainState(), blocked_loop_warning_secs=THRESHOLD
        ) as sess:
            await sess.run(step)
            time.sleep(BLOCK)  # noqa: ASYNC251 (the user's own loop, between steps)
    [message] = warnings_of(caplog)
    assert message.startswith("code outside the session (tests.core.test_watchdog.")


async def test_hooks_that_await_do_not_count_as_blocking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Awaits:
        async def after_run(self, run_context: Any, run_values: Any) -> None:
            await anyio.sleep(BLOCK / 4)
            await anyio.to_thread.run_sync(time.sleep, BLOCK / 4)

    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([Awaits()], blocked_loop_warning_secs=THRESHOLD)
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("off", [None, 0])
async def test_the_warning_can_be_switched_off(
    caplog: pytest.LogCaptureFixture, off: float | None
) -> None:
    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([SlowAfterRun()], blocked_loop_warning_secs=off)
    assert warnings_of(caplog) == []


async def test_the_environment_sets_the_threshold_or_switches_it_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BLOCKED_LOOP_ENV, "off")
    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([SlowAfterRun()])
    assert warnings_of(caplog) == []
    monkeypatch.setenv(BLOCKED_LOOP_ENV, str(THRESHOLD))
    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([SlowAfterRun()])
    assert len(warnings_of(caplog)) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="monitored"):
        await train([SlowAfterRun()], blocked_loop_warning_secs=None)  # the argument wins
    assert warnings_of(caplog) == []


def test_bad_thresholds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="blocked_loop_warning_secs must be a positive number"):
        monitored.MonitoredSession(blocked_loop_warning_secs=-1)
    monkeypatch.setenv(BLOCKED_LOOP_ENV, "soon")
    with pytest.raises(ValueError, match="MONITORED_BLOCKED_LOOP_WARNING_SECS='soon': give a"):
        monitored.MonitoredSession()
    monkeypatch.setenv(BLOCKED_LOOP_ENV, "")
    assert blocked_loop_threshold(FROM_ENV) == 1.0


async def test_an_explicit_threshold_of_one_second_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default is a marker, not the number 1.0: an explicit 1.0 is never the environment's."""
    monkeypatch.setenv(BLOCKED_LOOP_ENV, "off")
    assert blocked_loop_threshold(1.0) == 1.0
    assert blocked_loop_threshold(FROM_ENV) is None
    assert monitored.MonitoredSession(blocked_loop_warning_secs=1.0)._blocked_loop_secs == 1.0


async def test_monitored_training_session_takes_the_blocked_loop_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BLOCKED_LOOP_ENV, raising=False)
    sess = monitored.MonitoredTrainingSession(blocked_loop_warning_secs=None)
    assert sess._blocked_loop_secs is None
    assert (
        monitored.MonitoredTrainingSession(blocked_loop_warning_secs=0.5)._blocked_loop_secs == 0.5
    )
