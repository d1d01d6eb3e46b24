"""The array backend on the CPU (NumPy only, CuPy never imported), and its CuPy paths
run on the stand-in CuPy of ``tests/_standin_device.py``."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

import monitored
from monitored import SessionRunArgs
from monitored._core import _backend
from monitored._core._backend import (
    array_module,
    is_array,
    is_device_array,
    start_device_copy,
    to_host,
)


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


# -- CuPy paths, on the stand-in ---------------------------------------------------------


def _mixed(cupy: Any) -> list[Any]:
    """Device values of every awkward kind: 0-d, odd-sized, strided, empty."""
    return [
        cupy.asarray(np.float32(2.5)),  # 0-d
        cupy.arange(3, dtype=np.int8),  # 3 bytes: what follows is misaligned unless padded
        cupy.arange(4, dtype=np.float64),
        cupy.ones((4, 2), dtype=np.float16)[::2],  # not contiguous
        cupy.asarray(np.int64(7)),  # 0-d after an odd size
        cupy.zeros((0, 3), dtype=np.float32),
    ]


def _check_mixed(host: list[Any]) -> None:
    assert [h.shape for h in host] == [(), (3,), (4,), (2, 2), (), (0, 3)]
    assert [h.dtype for h in host] == [
        np.float32,
        np.int8,
        np.float64,
        np.float16,
        np.int64,
        np.float32,
    ]
    assert float(host[0]) == 2.5
    assert int(host[4]) == 7
    np.testing.assert_array_equal(host[2], [0, 1, 2, 3])
    np.testing.assert_array_equal(host[3], np.ones((2, 2)))
    assert all(type(h) is np.ndarray and h.flags.aligned for h in host)
    assert all(h.ctypes.data % h.dtype.alignment == 0 for h in host if h.size)


def test_to_host_keeps_0d_shapes_and_aligns_values_in_one_transfer(
    standin_cupy: StandinCupy,
) -> None:
    values = _mixed(standin_cupy.module)
    standin_cupy.transfers.reset()
    host = to_host(values)
    assert standin_cupy.transfers.to_host == 1
    _check_mixed(host)


def test_a_single_0d_device_value_reaches_the_host_as_0d(standin_cupy: StandinCupy) -> None:
    [host] = to_host([standin_cupy.module.asarray(np.float32(1.5))])
    assert host.shape == ()
    assert float(host) == 1.5


def test_a_late_copy_keeps_0d_shapes_aligns_and_waits_only_in_finish(
    standin_cupy: StandinCupy,
) -> None:
    values = _mixed(standin_cupy.module)
    standin_cupy.transfers.reset()
    copy = start_device_copy(values, range(len(values)))
    assert standin_cupy.transfers.syncs == 0  # issued, not waited for
    assert standin_cupy.pending() == 1
    out: list[Any] = [None] * len(values)
    copy.finish(out)
    assert standin_cupy.pending() == 0
    assert standin_cupy.transfers.to_host == 1
    _check_mixed(out)


def test_a_late_copy_is_a_snapshot_of_the_values_when_it_started(
    standin_cupy: StandinCupy,
) -> None:
    w = standin_cupy.module.zeros(3)
    copy = start_device_copy([w], [0])
    w += 1  # the next step's in-place update, queued after the copy
    out: list[Any] = [None]
    copy.finish(out)
    np.testing.assert_array_equal(out[0], [0, 0, 0])


def test_discarding_a_late_copy_waits_for_it_before_its_buffers_go(
    standin_cupy: StandinCupy,
) -> None:
    values = _mixed(standin_cupy.module)
    copy = start_device_copy(values, range(len(values)))
    copy.discard()
    del copy
    assert standin_cupy.pending() == 0
    standin_cupy.check()  # no buffer released under the running copy


def test_a_late_copy_dropped_without_waiting_is_what_the_standin_reports(
    standin_cupy: StandinCupy,
) -> None:
    """The fault :meth:`DeviceCopy.discard` prevents, seen by the stand-in."""
    copy = start_device_copy(_mixed(standin_cupy.module), [0, 1])
    del copy
    with pytest.raises(pytest.fail.Exception, match="released while the copy was still pending"):
        standin_cupy.check()


def test_a_failed_wait_keeps_the_buffers_and_logs_instead_of_raising(
    standin_cupy: StandinCupy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    copy = start_device_copy([standin_cupy.module.ones(2)], [0])
    [group] = copy._groups

    def broken() -> None:
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setattr(group[4], "synchronize", broken)
    monkeypatch.setattr(_backend, "_abandoned", [])
    with caplog.at_level(logging.ERROR, logger="monitored"):
        copy.discard()
    assert _backend._abandoned == [group]
    assert "its buffers are kept" in caplog.text
    assert "cudaErrorIllegalAddress" in caplog.text
    _backend._abandoned.clear()
    group[4]._complete()  # let the stand-in's copy end before its buffers go


class _Watch(monitored.SessionRunHook):
    def __init__(self, fetches: Any, lag: int = 0) -> None:
        self.args = SessionRunArgs(fetches, lag=lag)
        self.results: list[Any] = []

    def before_run(self, run_context: Any) -> Any:
        return self.args

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.results.append(run_values.results)


def _device_step(state: monitored.TrainState) -> dict[str, Any]:
    state["w"] += 1
    state.global_step += 1
    return {"loss": state["w"].sum(), "acc": state["w"][0]}


async def test_0d_device_values_reach_hooks_as_0d_now_and_one_step_late(
    standin_cupy: StandinCupy,
) -> None:
    cupy = standin_cupy.module
    state = monitored.TrainState({"w": cupy.zeros(3, dtype=np.float32)})
    now = _Watch({"loss": "loss", "acc": "acc"})
    late = _Watch({"loss": "loss", "acc": "acc"}, lag=1)
    async with monitored.MonitoredSession(state, hooks=[now, late]) as sess:
        for _ in range(3):
            await sess.run(_device_step)
    assert [float(r["loss"]) for r in now.results] == [3.0, 6.0, 9.0]
    assert [float(r["loss"]) for r in late.results[1:]] == [3.0, 6.0, 9.0]
    for result in now.results + late.results[1:]:
        assert result["loss"].shape == ()
        assert result["acc"].shape == ()


async def test_a_failing_session_waits_for_its_late_copy_before_dropping_it(
    standin_cupy: StandinCupy,
) -> None:
    state = monitored.TrainState({"w": standin_cupy.module.zeros(3, dtype=np.float32)})
    late = _Watch("loss", lag=1)
    with pytest.raises(ZeroDivisionError):
        async with monitored.MonitoredSession(state, hooks=[late]) as sess:
            await sess.run(_device_step)
            assert standin_cupy.pending() == 1  # the copy of step 1 is running
            1 / 0  # noqa: B018
    assert standin_cupy.pending() == 0
    standin_cupy.check()


def test_to_scalar_takes_one_element_arrays_and_numbers_and_names_what_is_not() -> None:
    assert monitored.to_scalar(np.array([[2.5]], np.float32), "loss", 3) == 2.5
    assert monitored.to_scalar(np.float64(1.0), "loss", 3) == 1.0
    assert monitored.to_scalar(7, "loss", 3) == 7.0

    class PluginError(Exception):
        pass

    with pytest.raises(
        PluginError,
        match=r"^Hook: monitor 'm' must be a scalar, but at step 4 it has shape \(2,\)$",
    ):
        monitored.to_scalar(np.zeros(2), "Hook: monitor 'm'", 4, PluginError)
    with pytest.raises(ValueError, match=r"must be a number, but at step 5 it is str"):
        monitored.to_scalar("x", "Hook: monitor 'm'", 5)
