"""The stand-in CuPy of ``tests/_standin_device.py``: it counts host conversions, and
follows CuPy where CuPy differs from NumPy (the library's CuPy paths are tested on it)."""

from __future__ import annotations

import numpy as np
import pytest
from _standin_device import StandinCupy

import monitored


def test_the_library_sees_standin_arrays_as_device_arrays(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    x = cupy.arange(6, dtype=np.float32).reshape(2, 3)
    assert monitored.is_device_array(x)
    assert not monitored.is_device_array(np.zeros(2))
    assert isinstance(x.sum(), cupy.ndarray)  # reductions stay on the device, 0-d
    assert x.sum().shape == ()
    assert isinstance(x[0, 1], cupy.ndarray)


def test_every_conversion_to_the_host_is_counted(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    x = cupy.asarray(np.array([1.5, 2.5]))
    assert standin_cupy.transfers.to_device == 1
    standin_cupy.transfers.reset()
    total = x.sum()
    assert standin_cupy.transfers.to_host == 0
    assert float(total) == 4.0
    assert int(total) == 4
    assert bool(total)
    assert total.item() == 4.0
    assert x.tolist() == [1.5, 2.5]
    assert f"{total:.1f}" == "4.0"
    np.testing.assert_array_equal(x.get(), [1.5, 2.5])
    np.testing.assert_array_equal(cupy.asnumpy(x), [1.5, 2.5])
    assert standin_cupy.transfers.to_host == 8
    assert standin_cupy.transfers.kinds["float"] == 1
    assert standin_cupy.transfers.kinds["asnumpy"] == 1


def test_cupy_refuses_what_numpy_allows(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    x = cupy.zeros(3)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(x)
    with pytest.raises(TypeError, match="Unsupported type"):
        x + np.ones(3)
    zero_d = cupy.asarray(np.float64(2.0))
    assert cupy.ascontiguousarray(zero_d).shape == (1,)
    with pytest.raises(ValueError, match="Shape mismatch"):
        cupy.asnumpy(cupy.ascontiguousarray(zero_d), out=np.empty((), np.float64))
    with pytest.raises(RuntimeError, match="non-contiguous"):
        cupy.zeros(4)[::2].set(np.zeros(2))


def test_a_copy_on_a_side_stream_happens_when_waited_for(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    stream = cupy.cuda.Stream(non_blocking=True)
    host = np.zeros(3)
    device = cupy.arange(3.0)  # kept until the copy is done
    device.get(stream=stream, out=host, blocking=False)
    event = stream.record()
    assert not event.done
    assert host.tolist() == [0, 0, 0]
    event.synchronize()
    assert event.done
    assert host.tolist() == [0, 1, 2]


def test_a_buffer_released_under_a_pending_copy_is_a_fault(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    stream = cupy.cuda.Stream(non_blocking=True)
    device = cupy.empty(3)
    device.set(np.ones(3), stream=stream)
    del device
    with pytest.raises(pytest.fail.Exception, match="released while the copy was still pending"):
        standin_cupy.check()


def test_the_backend_takes_its_cupy_path_on_the_standin(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    values = [cupy.arange(6, dtype=np.float32).reshape(2, 3), cupy.ones(4, dtype=np.int64)[::2]]
    standin_cupy.transfers.reset()
    host = monitored.to_host(values)
    assert standin_cupy.transfers.to_host == 1  # packed: one transfer for both
    assert all(type(h) is np.ndarray for h in host)
    np.testing.assert_array_equal(host[0], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(host[1], [1, 1])


def test_a_device_value_of_another_shape_is_not_stored(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    zero_d = cupy.zeros(())
    with pytest.raises(ValueError, match="Out shape is mismatched"):
        zero_d[...] = cupy.ones(1)  # NumPy would store it
    zero_d[...] = cupy.asarray(np.float64(3.0))
    row = cupy.zeros((2, 3))
    row[...] = cupy.arange(3.0)  # broadcasting to the target's shape is fine
    assert row.get().tolist() == [[0, 1, 2], [0, 1, 2]]


def test_allow_synchronize_false_refuses_any_transfer(standin_cupy: StandinCupy) -> None:
    cupy, cupyx = standin_cupy.module, standin_cupy.cupyx
    x = cupy.arange(3.0)
    with cupyx.allow_synchronize(False):
        y = (x * 2).sum()  # device work only
        with pytest.raises(cupyx.DeviceSynchronized):
            float(y)
        with pytest.raises(cupyx.DeviceSynchronized):
            cupy.bincount(cupy.asarray([0, 1]))
        with cupyx.allow_synchronize(True):
            assert float(y) == 6.0
    assert float(y) == 6.0
