"""IndexedSlices: construction checks, densifying, duplicate rows summed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

from monitored.train.optimizers import IndexedSlices
from monitored.train.optimizers._indexed_slices import (
    check_rows,
    sum_duplicates,
    summed_rows,
    summed_rows_of,
)


def test_holds_values_indices_and_dense_shape() -> None:
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    grad = IndexedSlices(values, np.array([4, 1, 4]), dense_shape=(5, 2))
    assert grad.values is values
    assert grad.indices.tolist() == [4, 1, 4]
    assert grad.dense_shape == (5, 2)
    assert grad.dtype == np.float32
    assert repr(grad) == "IndexedSlices(values=float32 (3, 2), indices=(3,), dense_shape=(5, 2))"


def test_to_dense_sums_duplicate_rows() -> None:
    values = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    dense = IndexedSlices(values, [2, 0, 2]).to_dense((4, 2))
    np.testing.assert_array_equal(dense, [[10, 20], [0, 0], [101, 202], [0, 0]])
    assert IndexedSlices(values, [2, 0, 2], dense_shape=(3, 2)).to_dense().shape == (3, 2)


def test_sum_duplicates_sorts_rows_and_copies() -> None:
    values = np.array([[1.0], [2.0], [4.0]], dtype=np.float32)
    rows, summed = sum_duplicates(values, np.array([3, 1, 3], dtype=np.int32))
    assert rows.dtype == np.int64
    assert rows.tolist() == [1, 3]
    np.testing.assert_array_equal(summed, [[2.0], [5.0]])
    rows, summed = sum_duplicates(values, np.array([2, 0, 1]))
    assert rows.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(summed, [[2.0], [4.0], [1.0]])
    assert not np.shares_memory(summed, values)


@pytest.mark.parametrize(
    ("values", "indices", "kwargs", "error", "match"),
    [
        ([1.0], [0], {}, TypeError, "values must be a NumPy or CuPy array, got list"),
        (np.ones(()), [0], {}, ValueError, "at least one dimension"),
        (np.ones((2, 2)), np.array([[0, 1]]), {}, ValueError, "1-D integer array"),
        (np.ones((2, 2)), [0.5, 1.0], {}, ValueError, "1-D integer array, got float64"),
        (np.ones((2, 2)), [0], {}, ValueError, "1 indices but 2 rows"),
        (np.ones((2, 2)), [0, 1], {"dense_shape": (4, 3)}, ValueError, r"dense_shape \(4, 3\)"),
    ],
)
def test_bad_construction_is_rejected(
    values: Any, indices: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        IndexedSlices(values, indices, **kwargs)


def test_to_dense_checks_the_shape_and_the_rows() -> None:
    grad = IndexedSlices(np.ones((1, 2)), [3])
    with pytest.raises(ValueError, match="needs a shape"):
        grad.to_dense()
    with pytest.raises(ValueError, match=r"rows of shape \(2,\) into \(4, 3\)"):
        grad.to_dense((4, 3))
    with pytest.raises(IndexError, match="row index 3 is out of range for 2 rows"):
        grad.to_dense((2, 2))


def test_check_rows_accepts_empty_and_in_range() -> None:
    check_rows(np.zeros(0, np.int64), 0, "test")
    check_rows(np.array([0, 4]), 5, "test")
    with pytest.raises(IndexError, match="test: row index 5"):
        check_rows(np.array([0, 5]), 5, "test")


def test_uint64_indices_past_int64_are_refused() -> None:
    import numpy as np

    from monitored.train.optimizers import IndexedSlices

    with pytest.raises(IndexError, match="out of range"):
        IndexedSlices(np.ones((2, 1)), np.array([1, 2**64 - 1], np.uint64), dense_shape=(4, 1))


# -- on the stand-in CuPy: the device path, one host read per sparse gradient ---------------


@pytest.mark.parametrize(
    ("indices", "dtype"),
    [
        ([3, 1, 3, 0, 1, 3], np.int64),  # duplicates
        ([4, 0, 2], np.int32),  # none
        ([7], np.uint8),
        ([], np.int64),
    ],
)
def test_summed_rows_on_cupy_reads_the_host_once_and_matches_numpy(
    standin_cupy: StandinCupy, indices: list[int], dtype: Any
) -> None:
    cupy = standin_cupy.module
    rng = np.random.default_rng(0)
    values = rng.standard_normal((len(indices), 3)).astype(np.float32)
    index = np.array(indices, dtype=dtype)
    expected_rows, expected = sum_duplicates(values, index)
    standin_cupy.transfers.reset()
    rows, summed = summed_rows(cupy.asarray(values), cupy.asarray(index), 8, "test")
    assert standin_cupy.transfers.to_host == (1 if indices else 0)
    assert rows.dtype == np.int64
    assert rows.get().tolist() == expected_rows.tolist()
    np.testing.assert_allclose(summed.get(), expected, rtol=1e-6)


@pytest.mark.parametrize("bad", [[1, 8, 2], [-1, 3]])
def test_summed_rows_on_cupy_refuses_rows_out_of_range(
    standin_cupy: StandinCupy, bad: list[int]
) -> None:
    cupy = standin_cupy.module
    values = cupy.ones((len(bad), 2), dtype=np.float32)
    with pytest.raises(IndexError, match=rf"test: row index {max(bad) if -1 not in bad else -1} "):
        summed_rows(values, cupy.asarray(bad), 8, "test")


def test_to_dense_on_cupy_sums_duplicates_with_one_host_read(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    values = cupy.asarray(np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]]))
    grad = IndexedSlices(values, cupy.asarray([2, 0, 2]))
    standin_cupy.transfers.reset()
    dense = grad.to_dense((4, 2))
    assert standin_cupy.transfers.to_host == 1
    assert isinstance(dense, cupy.ndarray)
    np.testing.assert_array_equal(dense.get(), [[10, 20], [0, 0], [101, 202], [0, 0]])


def test_the_sparse_gradients_of_a_step_share_one_host_read(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    rng = np.random.default_rng(1)
    gradients = []
    for n in (5, 3, 0, 6):
        values = rng.standard_normal((n, 2)).astype(np.float32)
        gradients.append((values, rng.integers(0, 4, n)))
    device = [(cupy.asarray(v), cupy.asarray(i), 4, f"g{k}") for k, (v, i) in enumerate(gradients)]
    host = [(v, i, 4, f"h{k}") for k, (v, i) in enumerate(gradients)]
    standin_cupy.transfers.reset()
    results = summed_rows_of([*device, *host])
    assert standin_cupy.transfers.to_host == 1  # three non-empty device gradients, one read
    for (rows, summed), (expected_rows, expected) in zip(
        results[:4], [sum_duplicates(v, i) for v, i in gradients], strict=True
    ):
        assert rows.get().tolist() == expected_rows.tolist()
        np.testing.assert_allclose(summed.get(), expected, rtol=1e-6)
    for (rows, summed), (expected_rows, expected) in zip(
        results[4:], [sum_duplicates(v, i) for v, i in gradients], strict=True
    ):
        assert rows.tolist() == expected_rows.tolist()
        np.testing.assert_allclose(summed, expected, rtol=1e-6)
    bad = [device[0], (cupy.ones((1, 2), np.float32), cupy.asarray([9]), 4, "g-bad")]
    with pytest.raises(IndexError, match="g-bad: row index 9 is out of range for 4 rows"):
        summed_rows_of(bad)


def test_apply_gradients_on_cupy_reads_the_host_once_for_all_sparse_gradients(
    standin_cupy: StandinCupy,
) -> None:
    """float16 variables take the ufunc path, which the stand-in runs (no compiled kernel)."""
    from monitored import TrainState
    from monitored.train.optimizers import AdagradOptimizer

    cupy = standin_cupy.module
    start = np.ones((6, 2), np.float16)
    device = TrainState({"a": cupy.asarray(start), "b": cupy.asarray(start)})
    host = TrainState({"a": start.copy(), "b": start.copy()})
    grads = {
        "a": (np.ones((3, 2), np.float16), np.array([5, 1, 5])),
        "b": (np.full((2, 2), 2, np.float16), np.array([0, 3])),
    }
    on_device, on_host = AdagradOptimizer(0.1), AdagradOptimizer(0.1)
    for _ in range(2):
        standin_cupy.transfers.reset()
        on_device.apply_gradients(
            device,
            {n: IndexedSlices(cupy.asarray(v), cupy.asarray(i)) for n, (v, i) in grads.items()},
        )
        assert standin_cupy.transfers.to_host == 1
        on_host.apply_gradients(host, {n: IndexedSlices(v, i) for n, (v, i) in grads.items()})
    for name in host:
        np.testing.assert_allclose(device[name].get(), host[name], rtol=1e-3)
    with pytest.raises(IndexError, match="gradient of 'b': row index 6 is out of range"):
        on_device.apply_gradients(
            device,
            {
                "a": IndexedSlices(cupy.ones((1, 2), np.float16), cupy.asarray([0])),
                "b": IndexedSlices(cupy.ones((1, 2), np.float16), cupy.asarray([6])),
            },
        )
    np.testing.assert_allclose(device["a"].get(), host["a"], rtol=1e-3)  # nothing applied
