"""EarlyStoppingHook on CuPy state: on the stand-in CuPy everywhere, on a GPU with ``-m gpu``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy, standin_cupy

import monitored
from monitored.testing import run_session
from monitored_early_stopping import EarlyStoppingHook

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture

pytestmark = pytest.mark.anyio

LOSSES = [5.0, 4.0, 3.0, 3.5, 2.9, 3.05, 3.3, 3.1, 3.0, 3.2, 3.4, 3.6]


def _state(cupy: Any) -> monitored.TrainState:
    """A 0-d entry (the step, as a weight), a matrix and a strided one, all on the device."""
    return monitored.TrainState(
        {
            "w": cupy.zeros((), dtype=cupy.float64),
            "m": cupy.zeros((2, 3), dtype=cupy.float32),
            "t": cupy.zeros((3, 2)).T,  # not contiguous
        }
    )


def _step(cupy: Any) -> Any:
    """Every entry holds the global step; the loss (a 0-d device value) follows LOSSES."""

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        for name in ("w", "m", "t"):
            state[name][...] = state.global_step
        return {"loss": cupy.asarray(np.float32(LOSSES[state.global_step - 1]))}

    return step


def _assert_step_5(cupy: Any, state: monitored.TrainState) -> None:
    assert state.global_step == 7
    for name, shape in (("w", ()), ("m", (2, 3)), ("t", (2, 3))):
        assert isinstance(state[name], cupy.ndarray)
        assert state[name].shape == shape
        np.testing.assert_array_equal(state[name].get(), np.full(shape, 5.0))


async def test_restore_best_puts_the_best_cupy_arrays_back(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    hook = EarlyStoppingHook("loss", patience=2, restore_best=True)
    state = _state(cupy)
    await run_session([hook], _step(cupy), state=state, max_steps=12)
    _assert_step_5(cupy, state)


async def test_restore_best_from_a_best_checkpoint_of_cupy_state(
    standin_cupy: StandinCupy, tmp_path: Path
) -> None:
    cupy = standin_cupy.module
    hook = EarlyStoppingHook(
        "loss", patience=2, restore_best=True, best_checkpoint_dir=tmp_path / "best"
    )
    state = _state(cupy)
    await run_session([hook], _step(cupy), state=state, max_steps=12)
    assert hook.best_checkpoint is not None
    _assert_step_5(cupy, state)


def _real_cupy() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA runtime missing or broken
        pytest.skip(f"no usable CUDA device: {exc}")
    return cupy


@pytest.mark.gpu
async def test_restore_best_puts_the_best_cupy_arrays_back_on_the_gpu() -> None:
    cupy = _real_cupy()
    hook = EarlyStoppingHook("loss", patience=2, restore_best=True)
    state = _state(cupy)
    await run_session([hook], _step(cupy), state=state, max_steps=12)
    _assert_step_5(cupy, state)


@pytest.mark.gpu
async def test_restore_best_from_a_best_checkpoint_of_cupy_state_on_the_gpu(
    tmp_path: Path,
) -> None:
    cupy = _real_cupy()
    hook = EarlyStoppingHook(
        "loss", patience=2, restore_best=True, best_checkpoint_dir=tmp_path / "best"
    )
    state = _state(cupy)
    await run_session([hook], _step(cupy), state=state, max_steps=12)
    _assert_step_5(cupy, state)
