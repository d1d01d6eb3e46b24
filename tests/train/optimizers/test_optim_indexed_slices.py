"""IndexedSlices: construction checks, densifying, duplicate rows summed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

from monitored.train.optimizers import IndexedSlices
from monitored.train.optimizers._indexed_slices import check_rows, sum_duplicates, summed_rows


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
