"""The session on anyio's other backend: trio.

The library is written against anyio, asyncio first; these run the core
behaviours (hooks, async hooks, stop, background tasks, cancellation, end of
input, errors) on trio to keep it honest.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from _helpers import Recorder, counting_step

import monitored


def on_trio(test: Any) -> Any:
    """Run an async test function under trio (pytest-asyncio would use asyncio)."""

    def run() -> None:
        anyio.run(test, backend="trio")

    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run


@on_trio
async def test_a_session_trains_with_sync_and_async_hooks_on_trio() -> None:
    import trio

    trio.lowlevel.current_task()  # raises unless this really runs under trio
    log: list[tuple[str, str]] = []
    seen = []

    class AsyncHook:
        async def after_run(self, run_values: Any) -> None:
            await anyio.lowlevel.checkpoint()
            seen.append(float(run_values.results))

        def before_run(self) -> monitored.SessionRunArgs:
            return monitored.SessionRunArgs("loss")

    state = monitored.TrainState({"w": np.zeros(3, np.float32)})
    hooks = [Recorder("r", log), AsyncHook(), monitored.StopAtStepHook(last_step=3)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
    assert seen == [3.0, 6.0, 9.0]
    assert log[-1] == ("r", "end")


@on_trio
async def test_background_failure_and_cancellation_on_trio() -> None:
    class Starter:
        def after_create_session(self, coord: monitored.Coordinator) -> None:
            async def fail() -> None:
                raise OSError("reader died")

            coord.start_soon(fail)

    state = monitored.TrainState({"w": np.zeros(3, np.float32)})
    with pytest.raises(OSError, match="reader died"):
        async with monitored.MonitoredSession(state, hooks=[Starter()]) as sess:
            while not sess.should_stop():
                await sess.run(counting_step)
                await anyio.sleep(0.001)

    with anyio.move_on_after(0.05) as scope:
        async with monitored.MonitoredSession(monitored.TrainState({"w": np.zeros(1)})) as sess:
            while True:
                await sess.run(counting_step)
    assert scope.cancelled_caught


@on_trio
async def test_end_of_input_and_wait_for_stop_on_trio() -> None:
    batches = iter([1, 2])
    state = monitored.TrainState({"w": np.zeros(1)})
    async with monitored.MonitoredSession(state) as sess:
        while True:
            await sess.run(counting_step, batch=next(batches))
    assert state.global_step == 2
    coord = monitored.Coordinator()
    assert await coord.wait_for_stop(0.01) is False
