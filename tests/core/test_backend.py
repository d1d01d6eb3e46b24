"""The array backend on the CPU: NumPy only, CuPy never imported."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from monitored._core._backend import array_module, is_array, is_device_array, to_host


def test_to_host_copies_numpy_and_converts_scalars() -> None:
    w = np.arange(3.0)
    [copy, scalar, step] = to_host([w, 2.5, np.int64(7)])
    w[0] = 100
    np.testing.assert_array_equal(copy, [0, 1, 2])
    assert isinstance(scalar, np.ndarray)
    assert scalar == 2.5
    assert step == 7


def test_numpy_is_the_module_of_numpy_arrays() -> None:
    assert array_module(np.zeros(1)) is np
    assert is_array(np.zeros(1))
    assert not is_array([1.0])
    assert not is_device_array(np.zeros(1))


def test_a_cpu_session_never_imports_cupy() -> None:
    code = """
import sys, anyio, numpy as np, monitored
async def main():
    state = monitored.TrainState({"w": np.zeros(2)})
    class H:
        def before_run(self, run_context):
            return monitored.SessionRunArgs(["w", "loss"])
    async with monitored.MonitoredSession(state, hooks=[H()]) as sess:
        await sess.run(lambda s: {"loss": s["w"].sum()})
anyio.run(main)
assert "cupy" not in sys.modules, "cupy was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True)
