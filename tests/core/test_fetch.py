"""Fetch plans (made once, reused, rebuilt on a new structure), copies, and lag=1."""

from __future__ import annotations

import collections
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from _helpers import Recorder, counting_step

import monitored
from monitored import SessionRunArgs, TrainState
from monitored._core._fetch import FetchPlan, StepPlan, fetch_many


async def run_steps(sess: monitored.MonitoredSession, n: int) -> None:
    for _ in range(n):
        await sess.run(counting_step)


class Asker(monitored.SessionRunHook):
    """Asks, at each step, for what ``ask(step)`` returns; records every ``after_run``."""

    def __init__(self, ask: Any) -> None:
        self.ask = ask
        self.results: list[Any] = []
        self.events: list[str] = []

    def before_run(self, run_context: Any) -> Any:
        return self.ask(run_context.session.state.global_step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.events.append("after_run")
        self.results.append(run_values.results)

    def end(self, session: Any) -> None:
        self.events.append("end")


def plans_of(sess: monitored.MonitoredSession) -> dict[int, FetchPlan]:
    return dict(sess._fetcher._plans)


# -- plans ---------------------------------------------------------------------------------


async def test_a_constant_request_is_planned_once(state: TrainState) -> None:
    args = SessionRunArgs({"loss": "loss", "w": "w"})
    hook = Asker(lambda step: args)
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.run(counting_step)
        [plan] = plans_of(sess).values()
        step_plan = sess._fetcher._step_plan
        await run_steps(sess, 3)
        assert list(plans_of(sess).values()) == [plan]
        assert sess._fetcher._step_plan is step_plan
    assert [float(r["loss"]) for r in hook.results] == [3.0, 6.0, 9.0, 12.0]
    np.testing.assert_array_equal(hook.results[0]["w"], [1, 1, 1])


async def test_an_equal_new_structure_each_step_reuses_the_plan(state: TrainState) -> None:
    hook = Asker(lambda step: SessionRunArgs({"l": "loss", "s": ["global_step"]}))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.run(counting_step)
        [plan] = plans_of(sess).values()
        await run_steps(sess, 2)
        assert list(plans_of(sess).values()) == [plan]
    assert [r["s"] for r in hook.results] == [[1], [2], [3]]


async def test_a_changed_structure_builds_a_new_plan(state: TrainState) -> None:
    shapes = ["loss", ("loss", "w"), {"w": "w"}, ["loss"], "loss"]
    hook = Asker(lambda step: SessionRunArgs(shapes[step]))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        seen = []
        for _ in shapes:
            await sess.run(counting_step)
            seen.append(next(iter(plans_of(sess).values())))
    assert len({id(plan) for plan in seen}) == len(shapes)
    first, second, third, fourth, fifth = hook.results
    assert first == 3.0
    assert isinstance(second, tuple)
    assert second[0] == 6.0
    np.testing.assert_array_equal(second[1], [2, 2, 2])
    assert list(third) == ["w"]
    assert fourth == [12.0]
    assert fifth == 15.0


async def test_a_structure_changed_in_place_is_replanned(state: TrainState) -> None:
    fetches: dict[str, Any] = {"loss": "loss"}
    args = SessionRunArgs(fetches)
    hook = Asker(lambda step: args)
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.run(counting_step)
        fetches["step"] = "global_step"
        await sess.run(counting_step)
        del fetches["loss"]
        await sess.run(counting_step)
    assert hook.results == [{"loss": 3.0}, {"loss": 6.0, "step": 2}, {"step": 3}]


async def test_a_tuple_and_a_list_of_the_same_names_are_different_plans(state: TrainState) -> None:
    hook = Asker(lambda step: SessionRunArgs(("loss",) if step % 2 else ["loss"]))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await run_steps(sess, 3)
    assert [type(r) for r in hook.results] == [list, tuple, list]


async def test_namedtuples_other_keys_and_deep_nesting_are_rebuilt(state: TrainState) -> None:
    Pair = collections.namedtuple("Pair", ["a", "b"])
    deep: Any = "loss"
    for _ in range(40):  # deeper than one generated expression may nest
        deep = [deep]
    fetches = {
        "pair": Pair("loss", monitored.optional("missing")),
        1: "global_step",
        ("k", 2): ["w", ("loss",)],
        "deep": deep,
        "empty": {},
    }
    hook = Asker(lambda step: SessionRunArgs(fetches))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await run_steps(sess, 2)
    got = hook.results[1]
    assert list(got) == ["pair", 1, ("k", 2), "deep", "empty"]
    assert type(got["pair"]) is Pair
    assert got["pair"].a == 6.0
    assert got["pair"].b is None
    assert got[1] == 2
    np.testing.assert_array_equal(got[("k", 2)][0], [2, 2, 2])
    assert got[("k", 2)][1] == (6.0,)
    inner = got["deep"]
    for _ in range(40):
        assert isinstance(inner, list)
        [inner] = inner
    assert inner == 6.0
    assert got["empty"] == {}


async def test_hooks_with_the_same_names_share_one_step_plan(state: TrainState) -> None:
    hooks = [Asker(lambda step: SessionRunArgs(["loss", "w"])) for _ in range(3)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        await sess.run(counting_step)
        step_plan = sess._fetcher._step_plan
        assert step_plan is not None
        assert step_plan.names == ("loss", "w")
    first, second, third = (hook.results[0] for hook in hooks)
    assert first is not second  # each hook gets its own structure ...
    assert first[1] is second[1] is third[1]  # ... holding the one host copy of "w"


async def test_a_name_missing_at_a_later_step_names_the_hook_the_name_and_the_step(
    state: TrainState,
) -> None:
    def step(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(1)} if state.global_step < 3 else {}

    hook = Asker(lambda _: SessionRunArgs({"loss": "loss"}))
    with pytest.raises(monitored.FetchError) as info:
        async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
            for _ in range(3):
                await sess.run(step)
    message = str(info.value)
    assert message.startswith("hook 'hooks[0]:Asker'")
    assert "asked to fetch 'loss' at step 3" in message
    assert "outputs []" in message
    assert "entries ['w']" in message
    assert len(hook.results) == 2


async def test_a_non_name_after_good_steps_is_a_type_error(state: TrainState) -> None:
    hook = Asker(lambda step: SessionRunArgs(["loss"] if step < 2 else ["loss", 3]))
    with pytest.raises(TypeError, match=r"hook 'hooks\[0\]:Asker'.*asked to fetch 3 \(int\)"):
        async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
            await run_steps(sess, 3)


async def test_values_are_copies_made_once_per_step(state: TrainState) -> None:
    hook = Asker(lambda _: SessionRunArgs(["w", "w", monitored.optional("w")]))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await run_steps(sess, 2)
    first, second = hook.results
    assert first[0] is first[1] is first[2]
    assert first[0] is not state["w"]
    np.testing.assert_array_equal(first[0], [1, 1, 1])
    np.testing.assert_array_equal(second[0], [2, 2, 2])


def test_fetch_many_answers_each_request_in_its_own_structure() -> None:
    state = TrainState({"w": np.ones(2)})
    state.global_step = 4
    plain, nested = fetch_many(
        [("w", lambda: "a"), ({"s": ["global_step", monitored.optional("x")]}, lambda: "b")],
        {"loss": 1.5},
        state,
    )
    np.testing.assert_array_equal(plain, [1, 1])
    assert plain is not state["w"]
    assert nested == {"s": [4, None]}
    assert type(nested["s"][0]) is np.int64
    with pytest.raises(monitored.FetchError, match=r"^a, b asked to fetch 'nope' at step 4"):
        fetch_many([("nope", lambda: "a"), ({"n": "nope"}, lambda: "b")], {}, state)
    with pytest.raises(monitored.FetchError, match=r"\['loss'\].*; did you mean 'loss'\?"):
        fetch_many([("los", lambda: "a")], {"loss": 1.5}, state)
    with pytest.raises(monitored.FetchError, match=r"; did you mean 'w'\?"):
        fetch_many([("W", lambda: "a")], {"loss": 1.5}, state)


def test_a_step_plan_knows_which_names_are_required_and_late() -> None:
    plans = [
        FetchPlan({"a": monitored.optional("x"), "b": "y"}, lambda: "h0", 0),
        FetchPlan(["x", "z"], lambda: "h1", 1, lag=1),
        FetchPlan(monitored.optional("z"), lambda: "h2", 2, lag=1),
    ]
    step_plan = StepPlan(plans)
    assert step_plan.names == ("x", "y", "z")
    assert step_plan.required == (True, True, True)
    assert step_plan.late_only == (False, False, True)
    assert step_plan.now is not None
    assert step_plan.late is not None


def test_equal_step_plans_share_their_generated_code_each_with_its_own_values() -> None:
    """A second session making the same plans compiles nothing; each plan answers alike."""

    def plans(named: type) -> list[FetchPlan]:
        return [FetchPlan({"a": "x", "b": named("y", "x")}, lambda: "h0", 3)]

    pair = collections.namedtuple("pair", "first second")
    other = collections.namedtuple("other", "first second")
    first, second = StepPlan(plans(pair)), StepPlan(plans(other))
    assert first.fast is not None
    assert second.fast is not None
    assert first.fast.__code__ is second.fast.__code__
    state = TrainState()
    outputs = {"x": np.float32(1.0), "y": np.float32(2.0)}
    first.collect(outputs, state)  # the general path meets float32 (the fast path then keeps it)
    request = [(type("Call", (), {"plugin_index": 3})(), SessionRunArgs(plans(pair)[0].source))]
    answer = first.fast(request, outputs, state)  # type: ignore[arg-type]
    assert answer is not None
    assert type(answer[3].results["b"]) is pair
    request = [(request[0][0], SessionRunArgs(plans(other)[0].source))]
    answer = second.fast(request, outputs, state)  # type: ignore[arg-type]
    assert answer is not None
    assert type(answer[3].results["b"]) is other
    assert answer[3].results == {"a": 1.0, "b": other(2.0, 1.0)}


def test_plans_match_equal_structures_and_the_same_lag_only() -> None:
    plan = FetchPlan({"a": ["x", "y"]}, lambda: "h")
    assert plan.matches({"a": ["x", "y"]}, 0)
    assert not plan.matches({"a": ["x", "y"]}, 1)
    assert not plan.matches({"a": ("x", "y")}, 0)
    assert not plan.matches({"a": [np.zeros(3), "y"]}, 0)  # compares oddly: replanned
    constant = FetchPlan(("x", ("y",)), lambda: "h")
    assert constant.constant
    assert constant.matches(constant.source, 0)
    assert not FetchPlan(["x"], lambda: "h").constant


# -- lag=1 ---------------------------------------------------------------------------------


async def test_lagged_values_arrive_one_step_late_and_the_last_at_the_stop(
    state: TrainState,
) -> None:
    late = Asker(lambda _: SessionRunArgs({"w": "w", "step": "global_step"}, lag=1))
    now = Asker(lambda _: SessionRunArgs({"w": "w", "step": "global_step"}))
    hooks = [late, now, monitored.StopAtStepHook(last_step=3)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
        # Delivered by the last run, before the loop sees should_stop().
        assert len(late.results) == 4
    assert late.results[0] is None
    assert [int(r["step"]) for r in late.results[1:]] == [1, 2, 3]
    for i, result in enumerate(late.results[1:], start=1):
        np.testing.assert_array_equal(result["w"], [i, i, i])
    assert [int(r["step"]) for r in now.results] == [1, 2, 3]
    assert late.events == ["after_run"] * 4 + ["end"]


async def test_lagged_values_are_delivered_before_end_when_the_body_ends(
    state: TrainState,
) -> None:
    late = Asker(lambda _: SessionRunArgs("loss", lag=1))
    async with monitored.MonitoredSession(state, hooks=[late]) as sess:
        await run_steps(sess, 2)
        raise monitored.OutOfRangeError("input exhausted")
    assert late.results == [None, 3.0, 6.0]
    assert late.events == ["after_run", "after_run", "after_run", "end"]


async def test_lagged_values_are_delivered_by_close(state: TrainState) -> None:
    late = Asker(lambda _: SessionRunArgs("loss", lag=1))
    sess = monitored.MonitoredSession(state, hooks=[late])
    await sess.__aenter__()
    await run_steps(sess, 1)
    await sess.close()
    assert late.results == [None, 3.0]
    assert late.events == ["after_run", "after_run", "end"]


async def test_lagged_values_are_dropped_when_the_session_fails(state: TrainState) -> None:
    late = Asker(lambda _: SessionRunArgs("loss", lag=1))
    with pytest.raises(ZeroDivisionError):
        async with monitored.MonitoredSession(state, hooks=[late]) as sess:
            await run_steps(sess, 2)
            1 / 0  # noqa: B018
    assert late.results == [None, 3.0]
    assert late.events == ["after_run", "after_run"]


async def test_a_hook_asking_only_sometimes_still_gets_its_late_values(state: TrainState) -> None:
    late = Asker(lambda step: SessionRunArgs("loss", lag=1) if step % 2 == 0 else None)
    async with monitored.MonitoredSession(state, hooks=[late]) as sess:
        await run_steps(sess, 4)
    # Asked at steps 1 and 3 (global step 0 and 2 before them): answered at 2 and 4.
    assert late.results == [None, 3.0, None, 9.0]


async def test_late_and_immediate_hooks_share_names_and_one_copy(state: TrainState) -> None:
    late = Asker(lambda _: SessionRunArgs(["w", monitored.optional("acc")], lag=1))
    now = Asker(lambda _: SessionRunArgs("w"))
    async with monitored.MonitoredSession(state, hooks=[late, now]) as sess:
        await run_steps(sess, 2)
        step_plan = sess._fetcher._step_plan
        assert step_plan is not None
        assert step_plan.late_only == (False, True)
    assert late.results[1][0] is now.results[0]
    assert late.results[1][1] is None


async def test_a_flushed_after_run_may_defer_and_request_a_stop(state: TrainState) -> None:
    ran: list[int] = []

    class Late(monitored.SessionRunHook):
        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs("global_step", lag=1)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            if run_values.results is not None:
                step = int(run_values.results)
                run_context.session.call_after_hooks(lambda: ran.append(step))
                run_context.request_stop()

    hooks = [Late(), monitored.StopAtStepHook(last_step=1)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
    assert ran == [1]


async def test_an_error_in_a_flushed_after_run_names_the_hook(state: TrainState) -> None:
    class Late(monitored.SessionRunHook):
        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs("loss", lag=1)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            if run_values.results is not None:
                raise ValueError("bad loss")

    hooks = [Late(), monitored.StopAtStepHook(last_step=1)]
    with pytest.raises(ValueError, match="bad loss") as info:
        async with monitored.MonitoredSession(state, hooks=hooks) as sess:
            while not sess.should_stop():
                await sess.run(counting_step)
    assert any("hook 'after_run' of hook 'hooks[0]:Late'" in n for n in info.value.__notes__)


async def test_switching_from_lag_to_none_at_once_is_an_error_naming_the_hook(
    state: TrainState,
) -> None:
    hook = Asker(lambda step: SessionRunArgs("loss", lag=1 if step == 0 else 0))
    with pytest.raises(
        monitored.FetchError, match=r"hook 'hooks\[0\]:Asker'.*without lag at step 2"
    ):
        async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
            await run_steps(sess, 2)


def test_session_run_args_lag_is_zero_or_one() -> None:
    assert SessionRunArgs("loss").lag == 0
    assert SessionRunArgs("loss", lag=1).lag == 1
    assert "lag=1" in repr(SessionRunArgs("loss", lag=1))
    assert "lag" not in repr(SessionRunArgs("loss"))
    assert SessionRunArgs("loss", lag=1) != SessionRunArgs("loss")
    with pytest.raises(ValueError, match="lag must be 0 .* or 1"):
        SessionRunArgs("loss", lag=2)  # type: ignore[arg-type]


def test_a_cpu_session_with_late_fetches_never_imports_cupy() -> None:
    code = """
import sys, anyio, numpy as np, monitored
async def main():
    state = monitored.TrainState({"w": np.zeros(2)})
    class H:
        def before_run(self, run_context):
            return monitored.SessionRunArgs(["w", "loss"], lag=1)
    async with monitored.MonitoredSession(state, hooks=[H()]) as sess:
        for _ in range(3):
            await sess.run(lambda s: {"loss": s["w"].sum()})
anyio.run(main)
assert "cupy" not in sys.modules, "cupy was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_recorder_style_hooks_still_get_fresh_args_each_step(state: TrainState) -> None:
    hook = Recorder("r", [], fetches={"loss": "loss"})
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await run_steps(sess, 2)
    assert hook.results == [{"loss": 3.0}, {"loss": 6.0}]


async def test_a_hook_asking_every_few_steps_reuses_the_step_plans_it_switches_between(
    state: TrainState,
) -> None:
    """A summary writer asking every 3 steps beside a hook asking every step: two step
    plans, each made once (their generated code is not made again at each switch)."""
    every = Asker(lambda step: SessionRunArgs("loss"))
    sometimes = Asker(lambda step: SessionRunArgs("w", lag=1) if step % 3 == 0 else None)
    async with monitored.MonitoredSession(state, hooks=[every, sometimes]) as sess:
        seen = []
        for _ in range(12):
            await sess.run(counting_step)
            seen.append(sess._fetcher._step_plan)
        assert len({id(plan) for plan in seen}) == 2
        assert seen[0] is seen[3] is seen[6] is seen[9]
        assert seen[1] is seen[4] is seen[10]
    assert len(every.results) == 12
    assert [r is not None for r in sometimes.results].count(True) == 4
