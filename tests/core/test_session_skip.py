"""MonitoredSession.skip_step_hooks: a hook acting every N steps is not called in between."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import Recorder, counting_step

import monitored
from monitored import PluginError, TrainState


class EveryN(monitored.SessionRunHook):
    """Fetches the loss every ``n`` global steps and skips its step hooks in between."""

    def __init__(self, n: int, lag: int = 0) -> None:
        self.n = n
        self.lag = lag
        #: (event, global step at the call) for every call the session made.
        self.calls: list[tuple[str, int]] = []
        self.values: list[tuple[int, Any]] = []

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.skip_step_hooks(self, self._next(session.state.global_step))

    def before_run(self, run_context: monitored.SessionRunContext) -> Any:
        step = run_context.session.state.global_step
        self.calls.append(("before_run", step))
        due = (step + 1) % self.n == 0
        return monitored.SessionRunArgs("loss", lag=self.lag) if due else None

    def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> None:
        step = run_context.session.state.global_step
        self.calls.append(("after_run", step))
        if run_values.results is not None:
            self.values.append((step, run_values.results))
        run_context.session.skip_step_hooks(self, self._next(step))

    def _next(self, step: int) -> int:
        return (step // self.n + 1) * self.n


async def test_the_hook_is_called_only_for_the_steps_it_is_due_at(
    state: TrainState, log: list[Any]
) -> None:
    hook = EveryN(3)
    async with monitored.MonitoredSession(state, hooks=[hook, Recorder("r", log)]) as sess:
        for _ in range(10):
            await sess.run(counting_step)
    # before_run sees the global step the step starts at; the step makes it 3, 6, 9.
    assert hook.calls == [
        ("before_run", 2),
        ("after_run", 3),
        ("before_run", 5),
        ("after_run", 6),
        ("before_run", 8),
        ("after_run", 9),
    ]
    assert [step for step, _ in hook.values] == [3, 6, 9]
    # The other hooks are called at every step, in order.
    assert log.count(("r", "before_run")) == log.count(("r", "after_run")) == 10


async def test_a_step_that_jumps_past_the_due_step_calls_the_hook_at_the_next_one(
    state: TrainState,
) -> None:
    hook = EveryN(10)

    def jump(state: TrainState) -> dict[str, Any]:
        state.global_step += 7
        return {"loss": 0.0}

    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for _ in range(3):
            await sess.run(jump)
    # Starts at 0 and 7 are before 9; the start at 14 is past it.
    assert hook.calls == [("before_run", 14), ("after_run", 21)]


async def test_values_asked_for_with_lag_1_still_reach_a_skipped_hook(state: TrainState) -> None:
    hook = EveryN(4, lag=1)
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for _ in range(9):
            await sess.run(counting_step)
    # Asked at the step making 4 (and 8); delivered at the next step's after_run,
    # although the hook had asked to skip its step hooks until 8 (and 12).
    assert [step for step, _ in hook.values] == [5, 9]
    assert ("before_run", 4) not in hook.calls  # the step delivering them calls only after_run


async def test_lagged_values_of_the_last_step_are_delivered_when_the_loop_stops(
    state: TrainState,
) -> None:
    hook = EveryN(4, lag=1)
    stop = monitored.StopAtStepHook(last_step=4)
    async with monitored.MonitoredSession(state, hooks=[hook, stop]) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
    assert [step for step, _ in hook.values] == [4]


async def test_creating_the_session_again_ends_every_skip(state: TrainState) -> None:
    hook = EveryN(100)
    calls = 0

    def step(state: TrainState) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise monitored.AbortedError("lost a worker")
        return counting_step(state)

    class Eager(monitored.SessionRunHook):
        """Skips all steps once created; counts the steps it is called for."""

        def __init__(self) -> None:
            self.steps = 0

        def after_create_session(self, session: Any, coord: Any) -> None:
            if session.state.global_step == 0:
                session.skip_step_hooks(self, None)

        def before_run(self, run_context: Any) -> None:
            self.steps += 1

    eager = Eager()
    async with monitored.MonitoredSession(state, hooks=[hook, eager]) as sess:
        for _ in range(4):
            await sess.run(step)
    # Skipped for good at creation; the recreation after the abort (global step 2,
    # no checkpoint: kept in memory) calls it again for the retried steps.
    assert eager.steps == 2
    assert hook.calls == []


async def test_an_installed_plugin_is_named_by_its_name_and_a_delegate_by_itself(
    state: TrainState,
) -> None:
    seen: list[str] = []

    class Delegate:
        def before_run(self, run_context: Any) -> None:
            seen.append("delegate")

        def after_run(self, run_context: Any, run_values: Any) -> None:
            run_context.session.skip_step_hooks(self, None)

    class Plugin:
        plugin_name = "mine"

        def __init__(self) -> None:
            self.delegate = Delegate()

        def begin(self, session: monitored.MonitoredSession) -> None:
            session.delegate_step_hooks("mine", self.delegate)

        def before_run(self, run_context: Any) -> None:  # pragma: no cover - delegated
            seen.append("plugin")

        def after_run(self, run_context: Any, run_values: Any) -> None:  # pragma: no cover
            seen.append("plugin")

    class Named:
        plugin_name = "named"

        def after_create_session(self, session: Any, coord: Any) -> None:
            session.skip_step_hooks("named", 5)

        def before_run(self, run_context: Any) -> None:
            seen.append(f"named@{run_context.session.state.global_step}")

    async with monitored.MonitoredSession(state, hooks=[Plugin(), Named()]) as sess:
        for _ in range(6):
            await sess.run(counting_step)
    assert seen == ["delegate", "named@4", "named@5"]


async def test_a_hook_not_in_the_session_is_refused_with_the_sessions_hooks_named(
    state: TrainState, log: list[Any]
) -> None:
    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        with pytest.raises(PluginError, match=r"skip_step_hooks: .*EveryN.* is not a hook"):
            sess.skip_step_hooks(EveryN(2), 4)
        with pytest.raises(PluginError, match="'nope' is not a hook of this session"):
            sess.skip_step_hooks("nope", 4)


@pytest.mark.parametrize("until", [1.5, "4", True])
async def test_until_step_must_be_a_global_step(state: TrainState, until: object) -> None:
    hook = EveryN(2)
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        with pytest.raises(TypeError, match="until_step must be a global step"):
            sess.skip_step_hooks(hook, until)  # type: ignore[arg-type]


async def test_before_the_session_is_entered_it_says_so(state: TrainState) -> None:
    sess = monitored.MonitoredSession(state)
    with pytest.raises(RuntimeError, match="not been entered"):
        sess.skip_step_hooks(EveryN(2), 4)
