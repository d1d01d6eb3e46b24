"""NanTensorHook on CuPy state: on the stand-in CuPy everywhere, on a real GPU with ``-m gpu``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy, standin_cupy

import monitored
from monitored.testing import run_session
from monitored_nan_guard import NanLossDuringTrainingError, NanTensorHook, NonFiniteStateError
from monitored_nan_guard._hook import scan_state

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture

pytestmark = pytest.mark.anyio


def _state(cupy: Any) -> monitored.TrainState:
    """Floating entries of every shape a scan meets: 0-d, strided, half; and an integer one."""
    return monitored.TrainState(
        {
            "w": cupy.zeros((4, 3), dtype=cupy.float32),
            "scale": cupy.asarray(np.float32(1.0)),  # 0-d
            "h": cupy.zeros(5, dtype=cupy.float16),
            "t": cupy.zeros((3, 2)).T,  # not contiguous
            "count": cupy.asarray(np.int64(0)),  # 0-d, not scanned
        }
    )


def _poisoning(name: str, at: int) -> Any:
    """A step that adds 1 to ``w`` and writes NaN into entry ``name`` at global step ``at``."""

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        if state.global_step == at:
            state[name][...] = np.nan
        return {"loss": state["w"].sum()}

    return step


def test_a_scan_of_cupy_state_names_the_bad_0d_entry_in_one_transfer(
    standin_cupy: StandinCupy,
) -> None:
    state = _state(standin_cupy.module)
    state["scale"][...] = np.inf
    standin_cupy.transfers.reset()
    failure = scan_state(state, 7)
    assert standin_cupy.transfers.to_host == 1  # every count in one transfer
    assert failure is not None
    assert (failure.array, failure.count, failure.size, failure.step) == ("scale", 1, 1, 7)


def test_a_scan_of_healthy_cupy_state_finds_nothing(standin_cupy: StandinCupy) -> None:
    assert scan_state(_state(standin_cupy.module), 3) is None


async def test_state_scans_on_cupy_state_catch_nan_in_a_strided_entry(
    standin_cupy: StandinCupy,
) -> None:
    hook = NanTensorHook("loss", check_state_every_n_steps=2)
    with pytest.raises(NonFiniteStateError, match=r"'t' has 6 non-finite of 6 elements at step 4"):
        await run_session(
            [hook], _poisoning("t", 3), state=_state(standin_cupy.module), max_steps=10
        )


async def test_a_nan_cupy_loss_fails_the_step(standin_cupy: StandinCupy) -> None:
    with pytest.raises(NanLossDuringTrainingError):
        await run_session(
            [NanTensorHook("loss")],
            _poisoning("w", 3),
            state=_state(standin_cupy.module),
            max_steps=10,
        )


async def test_a_rollback_restores_cupy_state_with_0d_entries(
    standin_cupy: StandinCupy, tmp_path: Any
) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    cupy = standin_cupy.module
    poison = {7}

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state["count"] += 1
        state.global_step += 1
        if state.global_step in poison:
            poison.discard(state.global_step)
            state["scale"][...] = np.nan
        return {"loss": state["w"].sum()}

    hook = NanTensorHook("loss", on_nan="rollback", check_state_every_n_steps=1)
    saver = CheckpointSaverHook(tmp_path, save_steps=3, asynchronous=False, handle_signals=False)
    state = _state(cupy)
    result = await run_session(
        [hook, saver, monitored.StopAtStepHook(last_step=10)], step, state=state, max_steps=50
    )
    assert result.state.global_step == 10
    [rollback] = hook.rollbacks
    assert (rollback.failed_step, rollback.restored_step) == (7, 6)
    assert isinstance(state["scale"], cupy.ndarray)
    assert state["scale"].shape == ()
    assert float(state["scale"]) == 1.0
    assert int(state["count"]) == 10
    np.testing.assert_array_equal(state["w"].get(), np.full((4, 3), 10))


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
def test_a_scan_of_cupy_state_names_the_bad_0d_entry_on_the_gpu() -> None:
    cupy = _real_cupy()
    state = _state(cupy)
    state["scale"][...] = cupy.inf
    failure = scan_state(state, 7)
    assert failure is not None
    assert (failure.array, failure.count, failure.size) == ("scale", 1, 1)


@pytest.mark.gpu
async def test_a_rollback_restores_cupy_state_with_0d_entries_on_the_gpu(tmp_path: Any) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    cupy = _real_cupy()
    hook = NanTensorHook("loss", on_nan="rollback", check_state_every_n_steps=1)
    saver = CheckpointSaverHook(tmp_path, save_steps=3, asynchronous=False, handle_signals=False)
    poison = {7}

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        if state.global_step in poison:
            poison.discard(state.global_step)
            state["scale"][...] = cupy.nan
        return {"loss": state["w"].sum()}

    state = _state(cupy)
    result = await run_session(
        [hook, saver, monitored.StopAtStepHook(last_step=10)], step, state=state, max_steps=50
    )
    assert result.state.global_step == 10
    assert [r.restored_step for r in hook.rollbacks] == [6]
    assert state["scale"].shape == ()
    assert float(state["scale"]) == 1.0
    assert float(state["w"][0, 0]) == 10.0
