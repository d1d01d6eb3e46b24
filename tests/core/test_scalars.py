"""``scalar_outputs``: the one rule by which every summary sink picks scalar step outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

import monitored
from monitored import scalar_outputs


def test_numbers_and_one_element_numeric_arrays_are_scalars_as_they_are() -> None:
    one = np.array([2.0])
    outputs = {
        "int": 3,
        "float": 0.5,
        "np_float": np.float32(1.5),
        "np_int": np.int64(7),
        "np_uint": np.uint8(1),
        "zero_d": np.array(4.0),
        "one": one,
        "flag": True,
        "np_flag": np.bool_(False),
        "bool_array": np.array([True]),
        "vector": np.arange(3.0),
        "empty": np.zeros(0),
        "complex": np.complex64(1j),
        "text": "x",
        "nested": {"a": 1.0},
        "none": None,
    }
    picked = scalar_outputs(outputs)
    assert list(picked) == ["int", "float", "np_float", "np_int", "np_uint", "zero_d", "one"]
    assert picked["one"] is one, "values as they are (a device array stays on its device)"


def test_outputs_that_are_not_a_mapping_have_no_scalars() -> None:
    assert scalar_outputs(None) == {}
    assert scalar_outputs(np.float32(1.0)) == {}
    assert scalar_outputs({1: 2.0}) == {}, "only named outputs"


def test_an_array_like_with_a_numeric_dtype_and_one_element_is_a_scalar() -> None:
    class DeviceArray:  # what a CuPy array offers the rule
        dtype = np.dtype("float32")
        size = 1

    value = DeviceArray()
    assert scalar_outputs({"loss": value}) == {"loss": value}


# -- the SCALAR_OUTPUTS fetch ------------------------------------------------------------------


class Late(monitored.SessionRunHook):
    """Asks for every scalar output of each step, one step late; records what arrives."""

    def __init__(self) -> None:
        self.got: list[tuple[int, dict[str, Any]]] = []

    def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
        return monitored.SessionRunArgs(monitored.SCALAR_OUTPUTS, lag=1)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_values.results is not None:
            self.got.append((run_context.session.state.global_step, run_values.results))


def changing_step(state: monitored.TrainState) -> dict[str, Any]:
    """Outputs whose scalar names change from step to step."""
    state.global_step += 1
    step = state.global_step
    outputs: dict[str, Any] = {"loss": np.float32(step), "w": np.arange(3.0)}
    if step % 2 == 0:
        outputs["acc"] = np.array([step / 10])
    return outputs


async def test_the_scalar_outputs_fetch_names_each_steps_scalars_after_the_step() -> None:
    hook = Late()
    async with monitored.MonitoredSession(monitored.TrainState(), hooks=[hook]) as sess:
        for _ in range(3):
            await sess.run(changing_step)
        now = sess.fetch(monitored.SCALAR_OUTPUTS)
    # Step k's outputs arrive in step k + 1's after_run; the last ones at the close.
    assert [step for step, _ in hook.got] == [2, 3, 3]
    assert [sorted(results) for _, results in hook.got] == [["loss"], ["acc", "loss"], ["loss"]]
    assert [float(results["loss"]) for _, results in hook.got] == [1.0, 2.0, 3.0]
    assert float(hook.got[1][1]["acc"][0]) == pytest.approx(0.2)
    assert sorted(now) == ["loss"]
    assert float(now["loss"]) == 3.0
    assert repr(monitored.SCALAR_OUTPUTS) == "monitored.SCALAR_OUTPUTS"


async def test_a_step_without_scalar_outputs_answers_an_empty_mapping() -> None:
    hook = Late()

    def no_scalars(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"w": np.arange(3.0)}

    async with monitored.MonitoredSession(monitored.TrainState(), hooks=[hook]) as sess:
        await sess.run(no_scalars)
        await sess.run(no_scalars)
    assert hook.got == [(2, {}), (2, {})]


async def test_scalar_outputs_on_a_device_are_copied_without_waiting_in_the_step(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    hook = Late()

    def device_step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": cupy.asarray(np.float32(state.global_step)), "lr": 0.1}

    async with monitored.MonitoredSession(monitored.TrainState(), hooks=[hook]) as sess:
        await sess.run(device_step)
        standin_cupy.transfers.reset()
        await sess.run(device_step)
        # Step 2 started its copy, and waited only for step 1's (which it delivers).
        assert standin_cupy.transfers.to_host == 1
        assert standin_cupy.transfers.kinds == {"asnumpy": 1}
    assert [float(results["loss"]) for _, results in hook.got] == [1.0, 2.0]
    assert all(type(results["loss"]) is np.ndarray for _, results in hook.got)
