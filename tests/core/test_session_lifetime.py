"""A session is an object with its own lifetime: opened, run and closed from any task.

Its background work (the loop watchdog, the tasks hooks start on the coordinator)
lives in a task of the session's own (``_core/_host.py``), not in the task that
opened it: two sessions close in any order, and a session opened by one task is
run by a second and closed by a third. Each test runs on asyncio and on trio.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from monitored import (
    Coordinator,
    EventLoopEndedError,
    MonitoredSession,
    OutOfRangeError,
    TrainState,
)

BACKENDS = ["asyncio", "trio"]

#: Read by a background task: it runs in the context of the task that opened the session.
opener: contextvars.ContextVar[str] = contextvars.ContextVar("opener", default="nobody")


def step(state: TrainState) -> dict[str, Any]:
    state["w"] += 1
    state.global_step += 1
    return {"loss": float(state["w"].sum())}


class Ticker:
    """A hook whose background task ticks until the session closes, then says it ended."""

    def __init__(self) -> None:
        self.ticks = 0
        self.ticked = anyio.Event()
        self.ended_by: str | None = None
        self.context: str | None = None
        self.ends = 0

    def after_create_session(self, session: Any, coord: Coordinator) -> None:
        coord.start_soon(self.tick, name="ticker")

    async def tick(self) -> None:
        self.context = opener.get()
        try:
            while True:
                self.ticks += 1
                self.ticked.set()
                await anyio.sleep(0.001)
        except anyio.get_cancelled_exc_class():
            self.ended_by = "cancel"
            raise

    def end(self, session: Any) -> None:
        self.ends += 1

    async def wait_for_ticks(self) -> None:
        """Wait (30 s at most) until the background task ticked again."""
        self.ticked = anyio.Event()
        with anyio.fail_after(30):
            await self.ticked.wait()


def new_session(ticker: Ticker) -> MonitoredSession:
    state = TrainState({"w": np.zeros(3, np.float32)})
    return MonitoredSession(state, hooks=[ticker], blocked_loop_warning_secs=30)


def in_task(fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
    """``fn`` run to its end in a task of its own (which then ends)."""

    async def run() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(fn)

    return run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("close_order", list(itertools.permutations("ab")))
@pytest.mark.parametrize("closing", ["close", "__aexit__"])
def test_two_sessions_close_in_every_order(
    backend: str, close_order: tuple[str, str], closing: str
) -> None:
    """A training and an evaluation session, TF1 style: opened a, b; closed a, b or b, a."""

    async def main() -> None:
        tickers = {"a": Ticker(), "b": Ticker()}
        sessions = {name: new_session(ticker) for name, ticker in tickers.items()}
        for name in "ab":
            assert await sessions[name].open() is sessions[name]
        for name in "ab":
            await sessions[name].run(step)
            await tickers[name].wait_for_ticks()
        for name in close_order:
            sess = sessions[name]
            if closing == "close":
                await sess.close()
            else:
                assert await sess.__aexit__(None, None, None) is False
            assert tickers[name].ended_by == "cancel"
            assert tickers[name].ends == 1
            assert sess.coord.running_tasks == 0
            with pytest.raises(RuntimeError, match="the session is closed"):
                sess.run(step)
        other = next(n for n in "ab" if n != close_order[0])
        assert sessions[other].state.global_step == 1

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_async_with_blocks_that_interleave_through_tasks(backend: str) -> None:
    """``async with`` still works where sessions nest; and sessions close in opening order
    when each lives in a task of its own that ends first-in, first-out."""

    async def main() -> None:
        tickers = [Ticker(), Ticker()]
        done = [anyio.Event(), anyio.Event()]
        release = [anyio.Event(), anyio.Event()]

        async def hold(index: int) -> None:
            async with new_session(tickers[index]) as sess:
                await sess.run(step)
                done[index].set()
                await release[index].wait()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(hold, 0)
                await done[0].wait()
                group.start_soon(hold, 1)
                await done[1].wait()
                release[0].set()
                await anyio.sleep(0.01)
                release[1].set()
        assert [t.ends for t in tickers] == [1, 1]
        assert [t.ended_by for t in tickers] == ["cancel", "cancel"]

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_run_and_close_from_three_different_tasks(backend: str) -> None:
    async def main() -> None:
        ticker = Ticker()
        sess = new_session(ticker)

        async def open_it() -> None:
            opener.set("the opening task")
            await sess.open()

        await in_task(open_it)()
        # The opening task has ended; the session's background work goes on.
        await ticker.wait_for_ticks()
        assert ticker.context == "the opening task", "background work keeps the opener's context"

        async def run_it() -> None:
            for _ in range(3):
                await sess.run(step)

        await in_task(run_it)()
        await ticker.wait_for_ticks()
        await in_task(sess.close)()
        assert sess.state.global_step == 3
        assert ticker.ended_by == "cancel"
        assert ticker.ends == 1
        assert sess.coord.running_tasks == 0

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancelled_close_still_ends_the_background_work(backend: str) -> None:
    """A close in a cancelled scope (the caller interrupted) leaves nothing running."""

    async def main() -> None:
        ticker = Ticker()
        sess = new_session(ticker)
        await sess.open()
        await sess.run(step)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await sess.close()
        assert ticker.ended_by == "cancel"
        assert sess.coord.running_tasks == 0
        with pytest.raises(RuntimeError, match="the session is closed"):
            sess.run(step)

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelling_the_block_closes_the_session_as_before(backend: str) -> None:
    async def main() -> None:
        ticker = Ticker()
        with anyio.move_on_after(0.05) as scope:
            async with new_session(ticker) as sess:
                while True:
                    await sess.run(step)
                    await anyio.sleep(0.001)
        assert scope.cancelled_caught
        assert ticker.ended_by == "cancel"
        assert ticker.ends == 0, "a cancelled block is not a normal end"
        assert sess.coord.running_tasks == 0

    anyio.run(main, backend=backend)


class Fatal(BaseException):
    """Not an ``Exception``: the coordinator's guard lets it through to the task group."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_escapes_a_background_task_stops_the_session_and_is_raised(backend: str) -> None:
    async def main() -> None:
        async def fatal() -> None:
            raise Fatal("from the background")

        class Starter:
            def after_create_session(self, session: Any, coord: Coordinator) -> None:
                coord.start_soon(fatal)

        sess = MonitoredSession(hooks=[Starter()])
        await sess.open()
        assert await sess.coord.wait_for_stop(30)
        assert sess.should_stop()
        with pytest.raises(BaseExceptionGroup) as raised:
            await sess.run(step)
        assert raised.group_contains(Fatal, match="from the background")
        with pytest.raises(BaseExceptionGroup) as again:
            await sess.close()
        assert again.group_contains(Fatal)

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_session_opens_once(backend: str) -> None:
    async def main() -> None:
        sess = MonitoredSession()
        await sess.open()
        with pytest.raises(RuntimeError, match="entered only once"):
            await sess.open()
        with pytest.raises(RuntimeError, match="entered only once"):
            await sess.__aenter__()
        await sess.close()
        await sess.close()  # closing a closed session does nothing, as before
        with pytest.raises(RuntimeError, match="entered only once"):
            await sess.open()

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_session_left_open_ends_with_its_event_loop_and_says_so_after(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The loop's end (asyncio.run's, trio.run's) ends the session's background work;
    a later loop that uses the session gets EventLoopEndedError from run; closing it,
    as that error says to, releases it with a warning, not the same error again.

    Why a notebook on IPython's ``%autoawait trio`` cannot keep a session across
    cells: each cell runs in a ``trio.run`` of its own.
    """
    ticker = Ticker()
    sess = new_session(ticker)

    async def open_it() -> None:
        await sess.open()
        await sess.run(step)
        await ticker.wait_for_ticks()

    async def use_it() -> None:
        assert sess.should_stop()
        with pytest.raises(EventLoopEndedError, match="event loop this session was opened in"):
            await sess.run(step)
        await sess.close()  # warns through logging, raises nothing

    anyio.run(open_it, backend=backend)
    assert ticker.ended_by == "cancel"
    assert sess.coord.running_tasks == 0
    anyio.run(use_it, backend=backend)
    assert ticker.ends == 0, "not a normal end"
    assert "event loop ended while it was open: its end hooks did not run" in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threads", [False, True])
def test_an_input_pipeline_feeds_a_session_opened_run_and_closed_by_different_tasks(
    backend: str, threads: bool
) -> None:
    """The pipeline's producers are the session's background work: they outlive the
    opening task, feed the steps another task runs, and end with the close."""
    from monitored import data

    seen: list[int] = []

    def take(state: TrainState, batch: np.ndarray) -> None:
        seen.append(int(batch[0]))
        state.global_step += 1

    async def main() -> None:
        def number(i: int) -> np.ndarray:
            if i >= 20:
                raise IndexError(i)  # the end of the input
            return np.full(1, i)

        pipeline = data.prefetch(
            number,
            buffer_size=2,
            num_workers=2,
            threads=threads,
            feed="batch",
        )
        ticker = Ticker()
        sess = MonitoredSession(hooks=[pipeline, ticker])
        await in_task(sess.open)()

        async def run_it() -> None:
            # Outside ``async with``, the end of input reaches the caller, as in TF1.
            with pytest.raises(OutOfRangeError, match="exhausted after 20 batches"):
                while not sess.should_stop():
                    await sess.run(take)

        await in_task(run_it)()
        await in_task(sess.close)()  # a normal end
        assert sess.coord.running_tasks == 0
        assert ticker.ends == 1

    anyio.run(main, backend=backend)
    assert seen == list(range(20))


#: Opens a checkpointed session in one task, trains in a second, closes in a third.
_INTERRUPTED = textwrap.dedent(
    """
    import sys
    import anyio, numpy as np
    import monitored

    async def step(state):
        await anyio.sleep(0.002)
        state["w"] += 1
        state.global_step += 1

    async def main():
        sess = monitored.MonitoredTrainingSession(
            monitored.TrainState({"w": np.zeros(3, np.float32)}),
            checkpoint_dir=sys.argv[1], save_checkpoint_steps=10**9,
            save_summaries_steps=None, log_step_count_steps=None,
            disable_plugins=["progress"],
        )

        async def train():
            print("training", flush=True)
            while not sess.should_stop():
                await sess.run(step)

        for work in (sess.open, train, sess.close):
            async with anyio.create_task_group() as group:
                group.start_soon(work)
        print("closed at", sess.state.global_step, sess.stopped_by_signal, flush=True)

    anyio.run(main)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="POSIX signals")
@pytest.mark.parametrize("trial", range(3))
def test_ctrl_c_stops_a_session_run_by_another_task_than_opened_it_with_its_checkpoint(
    tmp_path: Path, trial: int
) -> None:
    """A real process and a real SIGINT: the checkpoint plugin (listening since the
    opening task opened the session) stops the loop another task runs, and the close,
    in a third task, saves the last step's checkpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    process = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "training\n"
        time.sleep(0.05 * (trial + 1))  # a few steps in
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    step = int(re.fullmatch(r"closed at (\d+) SIGINT\n", out)[1])  # type: ignore[index]
    assert step >= 1
    assert f"SIGINT: saving a checkpoint of step {step} and stopping" in err
    saved = sorted(p.name for p in tmp_path.glob("model.ckpt-*"))
    assert any(name.startswith(f"model.ckpt-{step}.") for name in saved), saved
