"""The training toolkit on CuPy: fused kernels give NumPy's results, on the device.

Skipped unless CuPy is installed and a CUDA device is present (CI has none; the
``device`` tool runs this module where a GPU is lent). Every optimizer runs the
same steps on NumPy and on CuPy, dense and row-sparse, and must agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.clipping import clip_by_global_norm, clip_by_norm, clip_by_value, global_norm
from monitored.train.gradient_checker import compute_gradient_error
from monitored.train.moving_averages import ExponentialMovingAverage
from monitored.train.optimizers import (
    AdadeltaOptimizer,
    AdagradDAOptimizer,
    AdagradOptimizer,
    AdamOptimizer,
    AdamWOptimizer,
    FtrlOptimizer,
    GradientDescentOptimizer,
    IndexedSlices,
    LazyAdamOptimizer,
    MomentumOptimizer,
    Optimizer,
    ProximalAdagradOptimizer,
    ProximalGradientDescentOptimizer,
    RMSPropOptimizer,
)
from monitored.train.optimizers import _elementwise as engine
from monitored.train.optimizers._indexed_slices import sum_duplicates, summed_rows

cupy = pytest.importorskip("cupy")
try:
    _devices = cupy.cuda.runtime.getDeviceCount()
except Exception:  # pragma: no cover - depends on the machine
    _devices = 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_devices == 0, reason="no CUDA device"),
]

OPTIMIZERS: list[Callable[[], Optimizer]] = [
    lambda: GradientDescentOptimizer(0.1),
    lambda: MomentumOptimizer(0.1, 0.9),
    lambda: MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    lambda: AdagradOptimizer(0.1),
    lambda: AdagradDAOptimizer(
        0.1, l1_regularization_strength=0.001, l2_regularization_strength=0.1
    ),
    lambda: AdadeltaOptimizer(1.0, epsilon=1e-6),
    lambda: AdamOptimizer(0.01),
    lambda: LazyAdamOptimizer(0.01),
    lambda: AdamWOptimizer(0.01, 0.01),
    lambda: AdamWOptimizer(0.01, 0.01, lazy=True),
    lambda: RMSPropOptimizer(0.01, momentum=0.5),
    lambda: RMSPropOptimizer(0.01, momentum=0.5, centered=True),
    lambda: FtrlOptimizer(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.1),
    lambda: FtrlOptimizer(0.1, learning_rate_power=-0.3, l2_shrinkage_regularization_strength=0.1),
    lambda: ProximalGradientDescentOptimizer(0.1, 0.01, 0.1),
    lambda: ProximalAdagradOptimizer(0.1, 0.1, 0.01, 0.1),
]

SHAPE = (50, 7)


def _gradients(dtype: Any, sparse: bool) -> list[Any]:
    rng = np.random.default_rng(1)
    grads: list[Any] = []
    for _ in range(10):
        if sparse:
            rows = rng.integers(0, SHAPE[0], size=12)
            values = rng.standard_normal((12, SHAPE[1])).astype(dtype)
            grads.append(IndexedSlices(values, rows))
        else:
            grads.append(rng.standard_normal(SHAPE).astype(dtype))
    return grads


def _to_device(grad: Any) -> Any:
    if isinstance(grad, IndexedSlices):
        return IndexedSlices(cupy.asarray(grad.values), cupy.asarray(grad.indices))
    return cupy.asarray(grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("make", OPTIMIZERS)
def test_cupy_matches_numpy(make: Callable[[], Optimizer], sparse: bool, dtype: Any) -> None:
    w0 = np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)
    host = TrainState({"w": w0.copy()})
    device = TrainState({"w": cupy.asarray(w0)})
    host_opt, device_opt = make(), make()
    for grad in _gradients(dtype, sparse):
        host_opt.apply_gradients(host, {"w": grad})
        device_opt.apply_gradients(device, {"w": _to_device(grad)})
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    for name in host:
        value = device[name]
        if name.endswith("_power"):
            assert isinstance(value, np.ndarray)  # per-optimizer scalars stay on the host
        else:
            assert isinstance(value, cupy.ndarray), name
            assert value.dtype == np.dtype(dtype)
        np.testing.assert_allclose(cupy.asnumpy(value), host[name], rtol=rtol, atol=rtol)


def test_updates_run_as_fused_kernels() -> None:
    engine._KERNELS.clear()
    state = TrainState({"w": cupy.zeros((8, 4), cupy.float32)})
    opt = AdamOptimizer(0.1)
    opt.apply_gradients(state, {"w": cupy.ones((8, 4), cupy.float32)})
    opt.apply_gradients(
        state, {"w": IndexedSlices(cupy.ones((2, 4), cupy.float32), cupy.asarray([1, 5]))}
    )
    LazyAdamOptimizer(0.1).apply_gradients(
        state, {"w": IndexedSlices(cupy.ones((2, 4), cupy.float32), [0, 0])}
    )
    assert {
        ("adam", "dense"),
        ("adam_decay_moments", "dense"),
        ("adam_add_moments", "rows"),
    } <= set(engine._KERNELS)
    assert ("adam_step", "dense") in engine._KERNELS
    assert ("adam", "rows") in engine._KERNELS


def test_half_precision_uses_the_ufunc_path() -> None:
    w0 = np.linspace(-1, 1, 12, dtype=np.float16).reshape(3, 4)
    host = TrainState({"w": w0.copy()})
    device = TrainState({"w": cupy.asarray(w0)})
    grad = np.full((3, 4), 0.5, np.float16)
    for state, g in ((host, grad), (device, cupy.asarray(grad))):
        AdamOptimizer(0.01).apply_gradients(state, {"w": g})
    assert device["w"].dtype == cupy.float16
    np.testing.assert_allclose(cupy.asnumpy(device["w"]), host["w"], rtol=1e-3)


def test_non_contiguous_device_variable_with_sparse_gradient() -> None:
    base = cupy.arange(40, dtype=cupy.float32).reshape(5, 8)
    view = base[:, ::2]  # rows of a strided view
    state = TrainState({"w": view})
    grad = IndexedSlices(cupy.ones((2, 4), cupy.float32), cupy.asarray([4, 1]))
    MomentumOptimizer(1.0, 0.0).apply_gradients(state, {"w": grad})
    expected = np.arange(40, dtype=np.float32).reshape(5, 8)[:, ::2].copy()
    expected[[1, 4]] -= 1
    np.testing.assert_array_equal(cupy.asnumpy(base[:, ::2]), expected)


def test_host_gradient_for_a_device_variable_is_refused() -> None:
    state = TrainState({"w": cupy.zeros(3, cupy.float32)})
    with pytest.raises(TypeError, match="both must be NumPy or both CuPy"):
        GradientDescentOptimizer(0.1).apply_gradients(state, {"w": np.zeros(3, np.float32)})


def test_moving_average_on_the_device() -> None:
    state = TrainState({"w": cupy.ones(4, cupy.float32)})
    ema = ExponentialMovingAverage(0.5)
    ema.apply(state)
    state["w"][...] = 3.0
    ema.apply(state)
    shadow = state["w/ExponentialMovingAverage"]
    assert isinstance(shadow, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(shadow), np.full(4, 2.0, np.float32))
    with ema.averaged(state):
        np.testing.assert_array_equal(cupy.asnumpy(state["w"]), np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(cupy.asnumpy(state["w"]), np.full(4, 3.0, np.float32))


def test_clipping_on_the_device() -> None:
    a = cupy.asarray([3.0, 0.0], dtype=cupy.float32)
    b = cupy.asarray([[4.0]], dtype=cupy.float32)
    (ca, cb, none), norm = clip_by_global_norm([a, b, None], 2.5)
    assert isinstance(norm, cupy.ndarray)
    assert norm.dtype == cupy.float32
    assert float(norm) == 5.0
    assert isinstance(ca, cupy.ndarray)
    assert ca.dtype == cupy.float32
    np.testing.assert_allclose(cupy.asnumpy(ca), [1.5, 0.0])
    np.testing.assert_allclose(cupy.asnumpy(cb), [[2.0]])
    assert none is None
    (poisoned,), _ = clip_by_global_norm([cupy.asarray([np.inf, 1.0])], 1.0)
    assert bool(cupy.all(cupy.isnan(poisoned)))
    np.testing.assert_allclose(
        cupy.asnumpy(clip_by_norm(cupy.asarray([3.0, 4.0]), 1.0)), [0.6, 0.8]
    )
    np.testing.assert_array_equal(
        cupy.asnumpy(clip_by_value(cupy.asarray([-2.0, 0.5, 2.0]), -1.0, 1.0)), [-1.0, 0.5, 1.0]
    )
    assert float(global_norm([IndexedSlices(cupy.ones((1, 4)), [0])])) == 2.0
    with pytest.raises(TypeError, match="mixes NumPy and CuPy"):
        global_norm([np.ones(2), cupy.ones(2)])


def test_indexed_slices_on_the_device() -> None:
    grad = IndexedSlices(cupy.ones((3, 2), cupy.float32), [2, 0, 2])
    assert isinstance(grad.indices, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(grad.to_dense((3, 2))), [[1, 1], [0, 0], [2, 2]])
    state = TrainState({"w": cupy.zeros((3, 2), cupy.float32)})
    with pytest.raises(IndexError, match="row index 3 is out of range"):
        GradientDescentOptimizer(0.1).apply_gradients(
            state, {"w": IndexedSlices(cupy.ones((1, 2), cupy.float32), [3])}
        )


def test_gradient_check_on_the_device() -> None:
    x = cupy.asarray(np.random.default_rng(0).standard_normal(5))
    error = compute_gradient_error(lambda x: cupy.sin(x), x, lambda x, dy: cupy.cos(x) * dy)
    assert error < 1e-6


@pytest.mark.parametrize(
    ("indices", "dtype"),
    [([3, 1, 3, 0, 1, 3], np.int64), ([4, 0, 2], np.int32), ([7], np.uint8), ([], np.int64)],
)
def test_summed_rows_match_numpy_with_one_synchronization(indices: list[int], dtype: Any) -> None:
    import cupyx

    values = np.random.default_rng(0).standard_normal((len(indices), 3)).astype(np.float32)
    index = np.array(indices, dtype=dtype)
    expected_rows, expected = sum_duplicates(values, index)
    device_values, device_index = cupy.asarray(values), cupy.asarray(index)
    summed_rows(device_values, device_index, 8, "warm-up")
    if not indices:
        with cupyx.allow_synchronize(False):
            rows, summed = summed_rows(device_values, device_index, 8, "test")
    else:
        rows, summed = summed_rows(device_values, device_index, 8, "test")
    assert cupy.asnumpy(rows).tolist() == expected_rows.tolist()
    np.testing.assert_allclose(cupy.asnumpy(summed), expected, rtol=1e-6)
    with pytest.raises(IndexError, match="row index 9 is out of range"):
        summed_rows(cupy.ones((2, 3), cupy.float32), cupy.asarray([1, 9]), 8, "test")
