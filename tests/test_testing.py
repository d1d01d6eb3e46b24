"""monitored.testing and its pytest fixture."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import monitored
from monitored.testing import counting_step, record_step_calls, run_session


class EarlyStop:
    def __init__(self, patience: int) -> None:
        self.patience, self.best, self.bad = patience, float("inf"), 0

    def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
        return monitored.SessionRunArgs("loss")

    def after_run(self, run_context: Any, run_values: Any) -> None:
        loss = float(run_values.results)
        if loss < self.best:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
        if self.bad >= self.patience:
            run_context.request_stop()


async def test_run_session_drives_a_hook_until_it_stops() -> None:
    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(1.0)}

    result = await run_session([EarlyStop(patience=2)], step, max_steps=100)
    assert result.state.global_step == 3
    assert result.events == {
        "begin": 1,
        "after_create_session": 1,
        "before_run": 3,
        "after_run": 3,
        "end": 1,
    }
    assert len(result.outputs) == 3


async def test_run_session_stops_at_max_steps_and_propagates_errors() -> None:
    result = await run_session([], max_steps=4)
    assert result.state.global_step == 4

    class Broken:
        def after_run(self) -> None:
            raise ValueError("bad hook")

    with pytest.raises(ValueError, match="bad hook"):
        await run_session([Broken()])


async def test_the_fixture_is_registered(monitored_run: Any) -> None:
    hooks = [monitored.StopAtStepHook(last_step=2), monitored.FeedFnHook(lambda: {"lr": 0.1})]
    result = await monitored_run(hooks, counting_step, disable_plugins=())
    assert result.state.global_step == 2
    assert result.outputs == [{"lr": 0.1}, {"lr": 0.1}]


def test_the_documented_async_test_runs_as_written_without_an_async_plugin(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import numpy as np

        class StopOnPlateau:
            def __init__(self):
                self.best, self.bad = None, 0

            def before_run(self, run_context):
                import monitored
                return monitored.SessionRunArgs("loss")

            def after_run(self, run_context, run_values):
                loss = float(run_values.results)
                if self.best is not None and loss >= self.best:
                    self.bad += 1
                    if self.bad >= 2:
                        run_context.request_stop()
                else:
                    self.best = loss

        async def test_plateau(monitored_run):
            def step(state):
                state.global_step += 1
                return {"loss": np.float32(1.0)}

            result = await monitored_run([StopOnPlateau()], step, max_steps=100)
            assert result.state.global_step == 3
            assert result.events["after_run"] == 3

        async def test_failing(monitored_run):
            assert False, "this async test really ran"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-p", "no:anyio", "-W", "error")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*this async test really ran*"])


async def test_record_step_calls_lists_the_steps_a_skipping_hook_is_called_at() -> None:
    class EveryThird:
        def after_create_session(self, session: Any, coord: Any) -> None:
            session.skip_step_hooks(self, 3)

        def before_run(self, run_context: Any) -> None:
            return None

        async def after_run(self, run_context: Any, run_values: Any) -> None:
            step = run_context.session.state.global_step
            run_context.session.skip_step_hooks(self, (step // 3 + 1) * 3)

    hook = EveryThird()
    steps = record_step_calls(hook)
    await run_session([hook], counting_step, max_steps=7)
    assert steps == [2, 5]


async def test_record_step_calls_passes_an_async_before_run_through() -> None:
    asked: list[Any] = []

    class Fetcher:
        async def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
            return monitored.SessionRunArgs("global_step")

        def after_run(self, run_context: Any, run_values: Any) -> None:
            asked.append(int(run_values.results))

    hook = Fetcher()
    steps = record_step_calls(hook)
    await run_session([hook], counting_step, max_steps=2)
    assert (steps, asked) == ([0, 1], [1, 2])
