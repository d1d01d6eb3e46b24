"""CuPy arrays through a session: fetches come back as NumPy in one transfer.

Skipped unless CuPy is installed and a CUDA device is present (CI has none; the
``device`` tool runs this module where a GPU is lent).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import monitored

cupy = pytest.importorskip("cupy")
try:
    _devices = cupy.cuda.runtime.getDeviceCount()
except Exception:  # pragma: no cover - depends on the machine
    _devices = 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_devices == 0, reason="no CUDA device"),
]


def test_to_host_packs_mixed_dtypes_into_one_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    from monitored._core._backend import to_host

    transfers = []
    real = cupy.asnumpy

    def counting(array: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        transfers.append(array.nbytes)
        return real(array, *args, **kwargs)

    monkeypatch.setattr(cupy, "asnumpy", counting)
    values = [
        cupy.arange(6, dtype=cupy.float32).reshape(2, 3),
        cupy.asarray(3, dtype=cupy.int64),
        cupy.ones((4,), dtype=cupy.float16)[::2],  # not contiguous
        np.float64(1.5),
    ]
    host = to_host(values)
    assert len(transfers) == 1
    np.testing.assert_array_equal(host[0], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert host[1].dtype == np.int64
    assert host[1] == 3
    assert host[2].dtype == np.float16
    assert host[2].shape == (2,)
    assert host[3] == 1.5


async def test_a_session_trains_cupy_arrays_and_hooks_see_numpy() -> None:
    state = monitored.TrainState({"w": cupy.zeros(3, dtype=cupy.float32)})
    seen = []

    class Watch:
        def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
            return monitored.SessionRunArgs({"w": "w", "loss": "loss"})

        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append(run_values.results)

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        return {"loss": state["w"].sum()}

    hooks = [Watch(), monitored.StopAtStepHook(last_step=2)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert isinstance(seen[-1]["w"], np.ndarray)
    np.testing.assert_array_equal(seen[-1]["w"], [2, 2, 2])
    assert float(seen[-1]["loss"]) == 6.0
    assert isinstance(state["w"], cupy.ndarray)


def test_averages_of_values_and_zero_debias_stay_on_the_device() -> None:
    state = monitored.TrainState({"m": cupy.zeros(3, cupy.float32)})
    monitored.ensure_zero_debias(state, "m")
    for value in (2.0, 4.0):
        monitored.assign_moving_average(state, "m", cupy.full(3, value, cupy.float32), 0.5)
    assert isinstance(state["m/biased"], cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(state["m"]), np.full(3, 2.5 / 0.75), rtol=1e-6)
    ema = monitored.ExponentialMovingAverage(0.9, zero_debias=True, name="avg")
    ema.create_averages(state, values={"loss": cupy.zeros((), cupy.float32)})
    ema.apply(state, values={"loss": np.float32(3.0)})  # a host value is moved to the device
    assert isinstance(state["loss/avg"], cupy.ndarray)
    assert float(state["loss/avg"]) == pytest.approx(3.0)


def test_a_started_device_copy_is_a_snapshot_collected_later() -> None:
    from monitored._core._backend import start_device_copy

    w = cupy.arange(4, dtype=cupy.float32)
    loss = w.sum()  # a 0-d device array
    values: list[Any] = [w, loss]
    copy = start_device_copy(values, [0, 1])
    w += 100  # queued after the pack on the same stream: the copy does not see it
    copy.finish(values)
    np.testing.assert_array_equal(values[0], [0, 1, 2, 3])
    assert values[1].shape == ()
    assert float(values[1]) == 6.0


async def test_lagged_cupy_values_arrive_one_step_late_without_a_blocking_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocking = []
    real = cupy.asnumpy

    def counting(array: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        if kwargs.get("blocking", True):
            blocking.append(array.nbytes)
        return real(array, *args, **kwargs)

    monkeypatch.setattr(cupy, "asnumpy", counting)
    state = monitored.TrainState({"w": cupy.zeros(3, dtype=cupy.float32)})
    seen = []

    class Late:
        def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
            return monitored.SessionRunArgs({"w": "w", "loss": "loss"}, lag=1)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append(run_values.results)

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        return {"loss": state["w"].sum()}

    hooks = [Late(), monitored.StopAtStepHook(last_step=3)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert blocking == []
    assert seen[0] is None
    assert [float(r["loss"]) for r in seen[1:]] == [3.0, 6.0, 9.0]
    np.testing.assert_array_equal(seen[-1]["w"], [3, 3, 3])
    assert isinstance(seen[-1]["w"], np.ndarray)


def _spin(cycles: int = 300_000_000) -> None:
    """Queue a kernel that keeps the current stream busy ``cycles`` clock ticks (0.1-0.3 s)."""
    kernel = cupy.RawKernel(
        r"""
        extern "C" __global__ void monitored_spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }
        """,
        "monitored_spin",
    )
    kernel((1,), (1,), (cupy.int64(cycles),))


def test_to_host_keeps_0d_shapes_among_several_values() -> None:
    from monitored._core._backend import to_host

    values = [cupy.asarray(2.5, dtype=cupy.float32), cupy.arange(3, dtype=cupy.int8)]
    values.append(cupy.asarray(7, dtype=cupy.int64))
    host = to_host(values)
    assert [h.shape for h in host] == [(), (3,), ()]
    assert float(host[0]) == 2.5
    assert int(host[2]) == 7
    assert all(h.flags.aligned for h in host)


def test_discarding_a_copy_in_flight_waits_for_it() -> None:
    from monitored._core._backend import start_device_copy

    w = cupy.arange(1 << 20, dtype=cupy.float32)
    _spin()  # the pack, and so the copy, wait behind this
    copy = start_device_copy([w, w.sum()], [0, 1])
    events = [group[4] for group in copy._groups]
    assert not all(event.done for event in events)  # still in flight
    copy.discard()
    assert all(event.done for event in events)


async def test_a_failing_session_waits_for_its_copy_in_flight() -> None:
    state = monitored.TrainState({"w": cupy.zeros(1 << 20, dtype=cupy.float32)})
    seen: list[Any] = []

    class Late:
        def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
            return monitored.SessionRunArgs({"w": "w", "loss": "loss"}, lag=1)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append(run_values.results)

    def step(state: monitored.TrainState) -> dict[str, Any]:
        _spin()
        state["w"] += 1
        state.global_step += 1
        return {"loss": state["w"].sum()}

    events: list[Any] = []
    with pytest.raises(ZeroDivisionError):
        async with monitored.MonitoredSession(state, hooks=[Late()]) as sess:
            await sess.run(step)
            pending = sess._fetcher.pending
            assert pending is not None
            assert pending[2] is not None
            events = [group[4] for group in pending[2]._groups]
            1 / 0  # noqa: B018
    assert events
    assert all(event.done for event in events)
    assert seen == [None]
