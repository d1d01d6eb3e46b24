"""NanTensorHook(lag=1), the installed guard's mode: a device's loss one step late, never waited for.

Device losses live on the stand-in CuPy of ``tests/_standin_device.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy, standin_cupy

import monitored
from monitored.testing import run_session
from monitored_nan_guard import (
    NanGuardConfigError,
    NanLossDuringTrainingError,
    NanTensorHook,
    Rollback,
)

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture

pytestmark = pytest.mark.anyio

Step = Callable[[monitored.TrainState], dict[str, Any]]


def device_loss_at(cupy: Any, bad_steps: set[int], host_until: int = 0) -> Step:
    """A step whose loss is a 0-d device array, NaN the first time each of ``bad_steps`` runs.

    Steps up to ``host_until`` return a NumPy loss instead.
    """

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        bad = state.global_step in bad_steps
        bad_steps.discard(state.global_step)
        if state.global_step <= host_until:
            return {"loss": np.float32(np.nan if bad else 1.0)}
        loss = state["w"].sum()
        return {"loss": loss * cupy.nan if bad else loss}

    return step


def device_state(cupy: Any) -> monitored.TrainState:
    return monitored.TrainState({"w": cupy.zeros(2, dtype=cupy.float32)})


async def test_a_device_loss_is_judged_one_step_late_naming_its_own_step(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    hook = NanTensorHook("loss", lag=1)
    state = device_state(cupy)
    with pytest.raises(NanLossDuringTrainingError, match="NaN loss during training"):
        await run_session([hook], device_loss_at(cupy, {5}), state=state, max_steps=10)
    [failure] = hook.failures
    assert (failure.kind, failure.step) == ("nan", 5)
    assert state.global_step == 6  # the step after it ran before the value was seen


async def test_a_stop_judges_no_later_value(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    hook = NanTensorHook("loss", lag=1, on_nan="stop")
    result = await run_session(
        [hook], device_loss_at(cupy, {3, 4}), state=device_state(cupy), max_steps=10
    )
    assert result.state.global_step == 4
    # step 4's NaN, delivered when the session stops, belongs to a step after the failure
    assert [f.step for f in hook.failures] == [3]


async def test_a_nan_on_the_last_step_is_caught_when_the_session_stops(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    hook = NanTensorHook("loss", lag=1)
    with pytest.raises(NanLossDuringTrainingError):
        await run_session(
            [hook, monitored.StopAtStepHook(last_step=5)],
            device_loss_at(cupy, {5}),
            state=device_state(cupy),
            max_steps=10,
        )
    assert [f.step for f in hook.failures] == [5]


async def test_a_rollback_goes_back_before_the_failing_step_and_ignores_the_value_in_flight(
    standin_cupy: StandinCupy, tmp_path: Any
) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    cupy = standin_cupy.module
    seen: list[Rollback] = []
    hook = NanTensorHook("loss", lag=1, on_nan="rollback", on_rollback=seen.append)
    saver = CheckpointSaverHook(tmp_path, save_steps=3, asynchronous=False, handle_signals=False)
    state = device_state(cupy)
    result = await run_session(
        [hook, saver, monitored.StopAtStepHook(last_step=12)],
        device_loss_at(cupy, {7, 8}),  # step 8 runs on the diverged state before 7 is judged
        state=state,
        max_steps=50,
    )
    assert result.state.global_step == 12
    [rollback] = seen  # step 8's NaN, in flight during the rollback, is not judged
    assert (rollback.failed_step, rollback.restored_step) == (7, 6)
    np.testing.assert_array_equal(state["w"].get(), [12, 12])


async def test_a_host_loss_is_judged_in_its_own_step_without_a_fetch() -> None:
    hook = NanTensorHook("loss", lag=1)
    asked: list[Any] = []

    class Recording:
        """The hook, recording what it asks of each step."""

        def before_run(self, run_context: monitored.SessionRunContext) -> Any:
            asked.append(hook.before_run(run_context))
            return asked[-1]

        def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> Any:
            return hook.after_run(run_context, run_values)

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(np.nan if state.global_step == 4 else 1.0)}

    with pytest.raises(NanLossDuringTrainingError):
        await run_session([Recording()], step, max_steps=10)
    assert [f.step for f in hook.failures] == [4]
    # The first step asks (where the loss lives is not known yet); once a host loss
    # is seen, nothing is fetched.
    assert asked[0] is not None
    assert asked[0].lag == 1
    assert asked[1:] == [None, None, None]


async def test_a_loss_moving_to_the_device_is_read_at_once_that_one_step(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    hook = NanTensorHook("loss", lag=1)
    state = device_state(cupy)
    with pytest.raises(NanLossDuringTrainingError):
        await run_session(
            [hook], device_loss_at(cupy, {3}, host_until=2), state=state, max_steps=10
        )
    assert [f.step for f in hook.failures] == [3]
    assert state.global_step == 3


async def test_a_watched_state_entry_is_judged_in_its_step() -> None:
    def step(state: monitored.TrainState) -> None:
        state.global_step += 1
        state["w"][...] = np.nan if state.global_step == 2 else 0.0

    state = monitored.TrainState({"w": np.zeros((), np.float32)})
    with pytest.raises(NanLossDuringTrainingError):
        await run_session([NanTensorHook("w", lag=1)], step, state=state, max_steps=5)
    assert state.global_step == 2


async def test_steps_without_an_optional_loss_pass_and_a_required_one_is_named() -> None:
    result = await run_session([NanTensorHook(monitored.optional("loss"), lag=1)], max_steps=3)
    assert result.state.global_step == 3
    hook = NanTensorHook("loss", lag=1)
    hook._late = None  # as after a step with a host loss: the value is looked up directly
    with pytest.raises(monitored.FetchError, match=r"'loss' is neither an output of step 1"):
        await run_session([hook], max_steps=3)


async def test_the_global_step_resolves_as_in_a_fetch() -> None:
    result = await run_session([NanTensorHook("global_step", lag=1)], max_steps=3)
    assert result.state.global_step == 3


@pytest.mark.parametrize("lag", [2, -1, True, "1"])
def test_lag_is_zero_or_one(lag: Any) -> None:
    with pytest.raises(NanGuardConfigError, match="NanTensorHook: lag must be 0"):
        NanTensorHook("loss", lag=lag)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,early_stopping,checkpoint")


@pytest.mark.usefixtures("installed")
async def test_the_installed_guard_judges_a_device_loss_one_step_late(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    state = device_state(cupy)
    with pytest.raises(NanLossDuringTrainingError):
        await run_session([], device_loss_at(cupy, {3}), state=state, max_steps=10)
    assert state.global_step == 4


@pytest.mark.usefixtures("installed")
async def test_the_installed_guard_takes_lag_0_for_the_same_step(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    state = device_state(cupy)
    with pytest.raises(NanLossDuringTrainingError):
        await run_session(
            [],
            device_loss_at(cupy, {3}),
            state=state,
            max_steps=10,
            plugin_options={"nan_guard": {"lag": 0}},
        )
    assert state.global_step == 3


# -- on a real GPU --------------------------------------------------------------------------


def _real_cupy() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA runtime missing or broken
        pytest.skip(f"no usable CUDA device: {exc}")
    return cupy


@pytest.mark.gpu
async def test_a_gpu_loss_is_judged_one_step_late_naming_its_own_step() -> None:
    cupy = _real_cupy()
    hook = NanTensorHook("loss", lag=1)
    state = device_state(cupy)
    with pytest.raises(NanLossDuringTrainingError):
        await run_session([hook], device_loss_at(cupy, {5}), state=state, max_steps=10)
    assert [f.step for f in hook.failures] == [5]
    assert state.global_step == 6


@pytest.mark.gpu
async def test_a_gpu_rollback_goes_back_before_the_failing_step(tmp_path: Any) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    cupy = _real_cupy()
    hook = NanTensorHook("loss", lag=1, on_nan="rollback")
    saver = CheckpointSaverHook(tmp_path, save_steps=3, asynchronous=False, handle_signals=False)
    state = device_state(cupy)
    result = await run_session(
        [hook, saver, monitored.StopAtStepHook(last_step=12)],
        device_loss_at(cupy, {7, 8}),
        state=state,
        max_steps=50,
    )
    assert result.state.global_step == 12
    assert [(r.failed_step, r.restored_step) for r in hook.rollbacks] == [(7, 6)]
    np.testing.assert_array_equal(state["w"].get(), [12, 12])
