"""The fetch fast path: a steady step answered by one generated function, as the general path would."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
from _helpers import counting_step
from _standin_device import StandinCupy

import monitored
from monitored import SessionRunArgs, TrainState
from monitored._core._fetch import FetchPlan, StepPlan


class Asker(monitored.SessionRunHook):
    """Asks, at each step, for what ``ask(step)`` returns; records every answer."""

    def __init__(self, ask: Any) -> None:
        self.ask = ask
        self.results: list[Any] = []

    def before_run(self, run_context: Any) -> Any:
        return self.ask(run_context.session.state.global_step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.results.append(run_values.results)


def mixed_step(state: TrainState) -> dict[str, Any]:
    """Outputs of every host kind: a NumPy scalar, a Python float, an array."""
    state["w"] += 1
    state.global_step += 1
    return {"loss": np.float32(state.global_step), "lr": 0.5, "grad": np.ones(2)}


async def test_steady_steps_are_answered_by_the_fast_path_as_by_the_general_one(
    state: TrainState,
) -> None:
    fetches = {
        "loss": "loss",
        "lr": "lr",
        "grad": "grad",
        "w": "w",
        "step": "global_step",
        "none": monitored.optional("missing"),
    }
    args = SessionRunArgs(fetches)
    hooks = [Asker(lambda _: args), Asker(lambda _: SessionRunArgs(("w", "loss")))]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        await sess.run(mixed_step)  # planned and answered by the general path
        step_plan = sess._fetcher._step_plan
        assert step_plan is not None
        assert step_plan.fast is not None
        for _ in range(3):
            await sess.run(mixed_step)
        assert sess._fetcher._step_plan is step_plan
    first, last = hooks[0].results[0], hooks[0].results[-1]
    assert list(last) == list(fetches)
    assert last["loss"] == 4.0
    assert type(last["loss"]) is np.float32
    assert type(last["lr"]) is np.ndarray  # converted, as the general path does
    assert last["lr"].shape == ()
    assert type(last["step"]) is np.int64
    assert last["step"] == 4
    assert last["none"] is None
    np.testing.assert_array_equal(last["w"], [4, 4, 4])
    assert last["w"] is not state["w"]  # a copy ...
    assert last["w"] is hooks[1].results[-1][0]  # ... made once for every hook asking
    np.testing.assert_array_equal(first["w"], [1, 1, 1])  # earlier answers are not changed
    assert hooks[1].results[-1][1] == 4.0


async def test_a_namedtuple_equal_to_the_planned_tuple_is_rebuilt_as_itself(
    state: TrainState,
) -> None:
    Pair = collections.namedtuple("Pair", ["a", "b"])
    hook = Asker(lambda step: SessionRunArgs(("loss", "w") if step < 2 else Pair("loss", "w")))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for _ in range(4):
            await sess.run(counting_step)
    assert [type(r) for r in hook.results] == [tuple, tuple, Pair, Pair]


async def test_a_value_of_a_new_type_is_answered_and_the_fast_path_goes_on(
    state: TrainState,
) -> None:
    def step(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": 7 if state.global_step == 3 else np.float32(1)}

    hook = Asker(lambda _: SessionRunArgs("loss"))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for _ in range(5):
            await sess.run(step)
        step_plan = sess._fetcher._step_plan
        assert step_plan is not None
        assert step_plan.fast is not None
    assert [int(r) for r in hook.results] == [1, 1, 7, 1, 1]
    assert type(hook.results[2]) is np.ndarray


async def test_fewer_requests_than_planned_are_answered_by_the_general_path(
    state: TrainState,
) -> None:
    hooks = [
        Asker(lambda _: SessionRunArgs("loss")),
        Asker(lambda step: SessionRunArgs("global_step") if step != 2 else None),
    ]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        for _ in range(4):
            await sess.run(counting_step)
    assert hooks[1].results == [1, 2, None, 4]
    assert [float(r) for r in hooks[0].results] == [3.0, 6.0, 9.0, 12.0]


async def test_a_device_value_turns_the_fast_path_off_for_its_plan(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module

    def step(state: TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        return {"loss": state["w"].sum()}

    state = TrainState({"w": cupy.zeros(2, dtype=cupy.float32)})
    hook = Asker(lambda _: SessionRunArgs({"loss": "loss", "w": "w"}))
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for _ in range(3):
            await sess.run(step)
        step_plan = sess._fetcher._step_plan
        assert step_plan is not None
        assert step_plan.fast is None
    assert [float(r["loss"]) for r in hook.results] == [2.0, 4.0, 6.0]
    np.testing.assert_array_equal(hook.results[-1]["w"], [3, 3])


def test_no_fast_path_for_late_hooks_or_structures_too_deep_to_generate() -> None:
    deep: Any = "loss"
    for _ in range(40):
        deep = [deep]
    assert StepPlan([FetchPlan(deep, lambda: "h")]).fast is None
    assert StepPlan([FetchPlan("loss", lambda: "h", lag=1)]).fast is None
    assert StepPlan([FetchPlan(["loss"], lambda: "h")]).fast is not None
