"""``MonitoredSession.raise_after_close``: a hook's verdict, raised once the session closed."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import counting_step

import monitored
from monitored import TrainState


class Verdict(Exception):
    """What a hook decides about the run (as Optuna's TrialPruned)."""


class Judge:
    """Gives its verdict after step ``at``; records each ``end``."""

    def __init__(self, at: int, verdict: BaseException | None = None) -> None:
        self.at = at
        self.verdict = verdict if verdict is not None else Verdict(f"after step {at}")
        self.ended: list[int] = []

    def after_run(self, run_context: Any, run_values: Any) -> None:
        session = run_context.session
        if session.state.global_step == self.at:
            session.raise_after_close(self.verdict)

    def end(self, session: monitored.MonitoredSession) -> None:
        self.ended.append(session.state.global_step)


async def test_the_session_stops_after_the_step_closes_normally_then_raises_it(
    state: TrainState,
) -> None:
    judge = Judge(3)
    with pytest.raises(Verdict, match="after step 3"):
        async with monitored.MonitoredSession(state, hooks=[judge]) as sess:
            while not sess.should_stop():
                await sess.run(counting_step)
    assert state.global_step == 3
    assert judge.ended == [3], "end ran before the verdict was raised"


async def test_the_first_verdict_is_the_one_raised(state: TrainState) -> None:
    first, second = Judge(2, Verdict("first")), Judge(2, Verdict("second"))
    with pytest.raises(Verdict, match="first"):
        async with monitored.MonitoredSession(state, hooks=[first, second]) as sess:
            while not sess.should_stop():
                await sess.run(counting_step)


async def test_a_failure_in_the_block_wins_over_a_verdict(state: TrainState) -> None:
    judge = Judge(1)
    with pytest.raises(RuntimeError, match="broken"):
        async with monitored.MonitoredSession(state, hooks=[judge]) as sess:
            await sess.run(counting_step)
            raise RuntimeError("broken")
    assert judge.ended == [], "a failure skips end, as always"


async def test_an_end_of_input_is_a_normal_end_and_the_verdict_is_raised(
    state: TrainState,
) -> None:
    judge = Judge(1)
    with pytest.raises(Verdict):
        async with monitored.MonitoredSession(state, hooks=[judge]) as sess:
            await sess.run(counting_step)
            raise monitored.OutOfRangeError("input exhausted")
    assert judge.ended == [1]


async def test_close_in_the_block_raises_it_too(state: TrainState) -> None:
    judge = Judge(1)
    sess = monitored.MonitoredSession(state, hooks=[judge])
    with pytest.raises(Verdict):
        async with sess:
            await sess.run(counting_step)
            try:
                await sess.close()
            finally:
                assert judge.ended == [1]
            pytest.fail("close() raised nothing")  # pragma: no cover


async def test_what_is_not_an_exception_is_refused(state: TrainState) -> None:
    async with monitored.MonitoredSession(state) as sess:
        with pytest.raises(TypeError, match="raise_after_close takes an exception, got str"):
            sess.raise_after_close("pruned")  # type: ignore[arg-type]
        assert not sess.should_stop()
