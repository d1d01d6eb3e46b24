"""GPU staging with CuPy: on a real GPU (skipped without one), and the CuPy calls
the stager makes, checked everywhere with a stand-in CuPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

from monitored import data


def _cupy() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA runtime missing or broken
        pytest.skip(f"no usable CUDA device: {exc}")
    return cupy


@pytest.mark.gpu
async def test_batches_arrive_on_the_device_in_order() -> None:
    cupy = _cupy()
    source = [{"x": np.full((4, 3), i, np.float32), "y": np.arange(4) + i} for i in range(6)]
    pipeline = data.prefetch(source, buffer_size=3, device=True)
    async with pipeline:
        out = [b async for b in pipeline]
    assert all(isinstance(b["x"], cupy.ndarray) for b in out)
    assert [float(b["x"][0, 0]) for b in out] == list(range(6))
    assert cupy.asnumpy(out[5]["y"]).tolist() == [5, 6, 7, 8]


@pytest.mark.gpu
def test_clear_waits_for_copies_in_flight_on_the_gpu() -> None:
    cupy = _cupy()
    from monitored.data._staging import DeviceStager

    spin = cupy.RawKernel(
        r"""
        extern "C" __global__ void monitored_spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }
        """,
        "monitored_spin",
    )
    stager = DeviceStager(slots=4)
    spin((1,), (1,), (cupy.int64(300_000_000),))  # 0.1-0.3 s; the copies wait behind it
    for i in range(3):
        stager.start(i, {"x": np.full((256, 1024), i, np.float32)})
    events = [event for _, event in stager._pending.values()]
    assert not all(event.done for event in events)
    stager.clear()
    assert all(event.done for event in events)
    out = stager.take(3, {"x": np.full((4, 3), 3, np.float32)})
    assert float(out["x"][0, 0]) == 3.0


def test_without_cupy_device_staging_says_what_to_install() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"monitored\[gpu\]"):
            data.prefetch([np.zeros(1)], device=True)
    else:
        pytest.skip("CuPy is installed")


class _FakeCuda:
    """Just enough of ``cupy.cuda`` to follow what the stager asks of it."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.current = _FakeStream(log, "compute")

    def Stream(self, non_blocking: bool = False) -> _FakeStream:
        assert non_blocking
        return _FakeStream(self.log, "copy")

    def get_current_stream(self) -> _FakeStream:
        return self.current


class _FakeEvent:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def synchronize(self) -> None:
        self.log.append(f"host waits {self.name}")


class _FakeStream:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.events = log, name, 0

    def record(self) -> _FakeEvent:
        self.events += 1
        return _FakeEvent(self.log, f"{self.name}#{self.events}")

    def wait_event(self, event: _FakeEvent) -> None:
        self.log.append(f"{self.name} waits {event.name}")


class _FakeDeviceArray:
    def __init__(self, shape: Any, dtype: Any) -> None:
        self.value = np.empty(shape, dtype)

    def set(self, host: np.ndarray, stream: _FakeStream) -> None:
        assert stream.name == "copy"
        self.value[...] = host


def test_the_stager_copies_through_two_pinned_buffers_on_its_own_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CuPy calls the stager makes, and their order, with a stand-in CuPy."""
    import sys
    import types

    log: list[str] = []
    fake = types.ModuleType("cupy")
    fake.cuda = _FakeCuda(log)  # type: ignore[attr-defined]
    fake.ndarray = _FakeDeviceArray  # type: ignore[attr-defined]
    fake.empty = _FakeDeviceArray  # type: ignore[attr-defined]
    pinned: list[np.ndarray] = []
    fakex = types.ModuleType("cupyx")

    def empty_pinned(shape: Any, dtype: Any) -> np.ndarray:
        pinned.append(np.empty(shape, dtype))
        return pinned[-1]

    fakex.empty_pinned = empty_pinned  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupyx", fakex)
    from monitored.data._staging import DeviceStager

    stager = DeviceStager(slots=2)
    host = [{"x": np.full(3, i, np.float32)} for i in range(4)]
    stager.start(1, host[1])  # staged ahead, while "step 0" runs
    out = [stager.take(i, host[i])["x"].value.tolist() for i in range(4)]
    assert out == [[i] * 3 for i in range(4)]
    assert len(pinned) == 2  # double buffering: two pinned buffers, reused in turn
    assert "compute waits copy#1" in log  # the step waits for the copy on the device
    assert "host waits copy#1" in log  # a pinned buffer is reused after its copy ended
    assert log.index("compute waits copy#2") < log.index("compute waits copy#1")


# -- on the stand-in CuPy ----------------------------------------------------------------


def _batch(i: int) -> dict[str, Any]:
    return {"x": np.full((2, 3), i, np.float32), "y": np.arange(4) + i}


def test_clear_waits_for_the_copies_of_the_batches_it_forgets(standin_cupy: StandinCupy) -> None:
    from monitored.data._staging import DeviceStager

    stager = DeviceStager(slots=4)
    for i in range(3):
        stager.start(i, _batch(i))
    assert standin_cupy.pending() == 6  # two leaves a batch, copies still running
    stager.clear()  # a rollback's skip, or a restart
    assert standin_cupy.pending() == 0
    standin_cupy.check()  # no staged buffer was released under its copy


def test_the_host_waits_only_for_the_copy_that_last_used_a_pinned_set(
    standin_cupy: StandinCupy,
) -> None:
    """With ``slots`` sets the host queues ``slots`` copies before it waits for one."""
    from monitored.data._staging import DeviceStager

    stager = DeviceStager(slots=4)
    standin_cupy.transfers.reset()
    for i in range(4):
        stager.start(i, _batch(i))
    assert standin_cupy.transfers.syncs == 0
    assert standin_cupy.pending() == 8
    stager.start(4, _batch(4))  # reuses the set of batch 0: waits for that copy alone
    assert standin_cupy.transfers.syncs == 1
    assert standin_cupy.pending() == 8
    out = [stager.take(i, _batch(i)) for i in range(5)]
    assert [b["y"].get().tolist() for b in out] == [[i, i + 1, i + 2, i + 3] for i in range(5)]


def test_leaves_cupy_cannot_hold_stay_on_the_host(standin_cupy: StandinCupy) -> None:
    import ml_dtypes

    from monitored.data._staging import DeviceStager

    cupy = standin_cupy.module
    batch = {
        "x": np.ones(3, np.float32),
        "big_endian": np.arange(3, dtype=">i4"),
        "text": np.array(["a", "bc"]),
        "raw": np.array([b"a", b"bc"]),
        "objects": np.array([{"k": 1}, None], dtype=object),
        "bf16": np.ones(2, dtype=ml_dtypes.bfloat16),
        "wide": np.ones(2, dtype=np.longdouble),
    }
    staged = DeviceStager().take(0, batch)
    assert isinstance(staged["x"], cupy.ndarray)
    assert isinstance(staged["big_endian"], cupy.ndarray)
    assert staged["big_endian"].dtype == np.dtype("=i4")
    assert staged["big_endian"].get().tolist() == [0, 1, 2]
    for name in ("text", "raw", "objects", "bf16", "wide"):
        assert staged[name] is batch[name]


def test_a_pipeline_stages_through_buffer_size_plus_two_pinned_sets(
    standin_cupy: StandinCupy,
) -> None:
    pipeline = data.prefetch([_batch(i) for i in range(3)], buffer_size=3, device=True)
    assert pipeline._stager is not None
    assert len(pipeline._stager._pinned) == 5


async def test_batches_arrive_on_the_standin_device_in_order(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    pipeline = data.prefetch([_batch(i) for i in range(6)], buffer_size=3, device=True)
    async with pipeline:
        out = [b async for b in pipeline]
    assert all(isinstance(b["x"], cupy.ndarray) for b in out)
    assert [float(b["x"][0, 0]) for b in out] == list(range(6))
    standin_cupy.check()


def test_slots_must_be_at_least_two(standin_cupy: StandinCupy) -> None:
    from monitored.data._staging import DeviceStager

    for bad in (1, 0, True, 2.0):
        with pytest.raises(ValueError, match="slots >= 2"):
            DeviceStager(slots=bad)  # type: ignore[arg-type]
