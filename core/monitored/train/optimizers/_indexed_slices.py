"""``IndexedSlices``: a row-sparse gradient, as TF1 produces for embedding lookups.

``IndexedSlices(values, indices)`` stands for the dense gradient whose row
``indices[i]`` is ``values[i]`` and whose other rows are zero. An index may
appear more than once; its rows are then summed (TF1's optimizers deduplicate
sparse gradients the same way before applying them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import numpy as np

from ..._core._backend import array_module, is_array, is_device_array, to_host
from ._types import Array

__all__ = ["IndexedSlices", "sum_duplicates", "summed_rows", "summed_rows_of"]


@final
class IndexedSlices:
    """A sparse gradient: ``values[i]`` is the gradient of row ``indices[i]``.

    ``values`` has shape ``(len(indices), *row_shape)``; ``indices`` is a 1-D
    integer array (a Python sequence is converted with the values' array module);
    ``dense_shape`` is the shape of the variable it is a gradient of, when known.
    The arrays are kept as given (not copied).
    """

    __slots__ = ("_dense_shape", "_indices", "_values")

    def __init__(
        self,
        values: Array,
        indices: Array | Sequence[int],
        dense_shape: Sequence[int] | None = None,
    ) -> None:
        if not is_array(values):
            raise TypeError(
                f"IndexedSlices values must be a NumPy or CuPy array, got {type(values).__name__}"
            )
        if values.ndim < 1:
            raise ValueError("IndexedSlices values must have at least one dimension (the rows)")
        xp = array_module(values)
        if is_array(indices):
            index: Array = indices
        else:
            listed = list(indices)
            index = xp.asarray(listed) if listed else xp.zeros(0, dtype=np.int64)
        if is_device_array(index) != is_device_array(values):
            raise TypeError("IndexedSlices values and indices must both be NumPy or both be CuPy")
        if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
            raise ValueError(
                f"IndexedSlices indices must be a 1-D integer array, got {index.dtype} "
                f"with shape {tuple(index.shape)}"
            )
        if index.shape[0] != values.shape[0]:
            raise ValueError(
                f"IndexedSlices has {index.shape[0]} indices but {values.shape[0]} rows of values"
            )
        if index.dtype == np.uint64 and index.shape[0]:
            largest = int(index.max())
            if largest > np.iinfo(np.int64).max:  # would wrap to a negative row
                raise IndexError(f"IndexedSlices row index {largest} is out of range")
        shape: tuple[int, ...] | None = None
        if dense_shape is not None:
            shape = tuple(int(d) for d in dense_shape)
            if len(shape) != values.ndim or shape[1:] != tuple(values.shape[1:]):
                raise ValueError(
                    f"IndexedSlices dense_shape {shape} does not match rows of shape "
                    f"{tuple(values.shape[1:])}"
                )
        self._values = values
        self._indices = index
        self._dense_shape = shape

    @property
    def values(self) -> Array:
        """The rows, shape ``(len(indices), *row_shape)``."""
        return self._values

    @property
    def indices(self) -> Array:
        """The row index of each row of :attr:`values` (1-D, integer)."""
        return self._indices

    @property
    def dense_shape(self) -> tuple[int, ...] | None:
        """The shape of the dense gradient, when it was given."""
        return self._dense_shape

    @property
    def dtype(self) -> Any:
        """The dtype of :attr:`values`."""
        return self._values.dtype

    def to_dense(self, shape: Sequence[int] | None = None) -> Array:
        """The dense gradient (duplicate rows summed), of ``shape`` or :attr:`dense_shape`."""
        if shape is None:
            if self._dense_shape is None:
                raise ValueError("IndexedSlices.to_dense needs a shape: no dense_shape was given")
            shape = self._dense_shape
        shape = tuple(int(d) for d in shape)
        if len(shape) != self._values.ndim or shape[1:] != tuple(self._values.shape[1:]):
            raise ValueError(
                f"cannot densify rows of shape {tuple(self._values.shape[1:])} into {shape}"
            )
        xp = array_module(self._values)
        dense = xp.zeros(shape, dtype=self._values.dtype)
        if self._indices.shape[0]:
            rows, summed = summed_rows(
                self._values, self._indices, shape[0], "IndexedSlices.to_dense"
            )
            dense[rows] = summed
        return dense

    def __repr__(self) -> str:
        shape = "" if self._dense_shape is None else f", dense_shape={self._dense_shape}"
        return (
            f"IndexedSlices(values={self._values.dtype} {tuple(self._values.shape)}, "
            f"indices={tuple(self._indices.shape)}{shape})"
        )


def summed_rows(values: Array, indices: Array, n_rows: int, what: str) -> tuple[Array, Array]:
    """:func:`sum_duplicates`, with every row index checked to lie in ``[0, n_rows)``."""
    [result] = summed_rows_of([(values, indices, n_rows, what)])
    return result


def summed_rows_of(
    gradients: Sequence[tuple[Array, Array, int, str]],
) -> list[tuple[Array, Array]]:
    """:func:`summed_rows` of each ``(values, indices, n_rows, what)``, reading the host once.

    On CuPy, ``cupy.unique`` reads the number of distinct rows on the host (a
    boolean mask) and a range check reads the extremes: two synchronizations per
    sparse gradient. Here each gradient's rows are sorted and segmented on the
    device, and the counts and extremes of all of them come back in one transfer:
    one synchronization per step, which a data-dependent row count cannot avoid
    (TF1's ``unique`` has one too).
    """
    results: list[tuple[Array, Array] | None] = [None] * len(gradients)
    plans: list[tuple[int, _RowPlan]] = []
    for i, (values, indices, n_rows, what) in enumerate(gradients):
        if not is_device_array(values):
            rows, summed = sum_duplicates(values, indices)
            check_rows(rows, n_rows, what)
            results[i] = rows, summed
        elif indices.shape[0] == 0:
            xp = array_module(values)
            results[i] = (
                xp.zeros((0,), dtype=np.int64),
                xp.empty(values.shape, dtype=values.dtype),
            )
        else:
            plans.append((i, _RowPlan(values, indices)))
    if plans:
        summaries = to_host([plan.summary for _, plan in plans])
        for (i, plan), summary in zip(plans, summaries, strict=True):
            count, low, high = (int(x) for x in summary)
            _values, _indices, n_rows, what = gradients[i]
            _check_extremes(low, high, n_rows, what)
            results[i] = plan.finish(count)
    return [result for result in results if result is not None]


class _RowPlan:
    """One sparse gradient's rows sorted and segmented on the device, awaiting its count."""

    __slots__ = ("_order", "_ordered", "_segment", "_values", "_xp", "summary")

    def __init__(self, values: Array, indices: Array) -> None:
        xp = self._xp = array_module(values)
        n = indices.shape[0]
        self._values = values
        self._order = xp.argsort(indices)
        self._ordered = indices[self._order].astype(np.int64, copy=False)
        first = xp.empty((n,), dtype=bool)
        first[:1] = True
        xp.not_equal(self._ordered[1:], self._ordered[:-1], out=first[1:])
        self._segment = xp.cumsum(first, dtype=np.int64) - 1
        #: On the device: the number of distinct rows, the smallest and the largest.
        self.summary = xp.stack([self._segment[-1] + 1, self._ordered[0], self._ordered[-1]])

    def finish(self, count: int) -> tuple[Array, Array]:
        """The distinct rows (sorted, ``int64``) and each one's summed values."""
        xp, values = self._xp, self._values
        n = values.shape[0]
        rows = xp.empty((count,), dtype=np.int64)
        rows[self._segment] = self._ordered  # a segment's members all write the same index
        inverse = xp.empty((n,), dtype=np.int64)
        inverse[self._order] = self._segment
        if count == n:
            summed = xp.empty(values.shape, dtype=values.dtype)
            summed[inverse] = values
        else:
            summed = xp.zeros((count, *values.shape[1:]), dtype=values.dtype)
            _scatter_add(xp, summed, inverse, values)
        return rows, summed


def sum_duplicates(values: Array, indices: Array) -> tuple[Array, Array]:
    """Sorted unique row indices (``int64``) and the summed rows of each.

    The returned values are a new contiguous array even when no index repeats,
    so updating them never writes through to the caller's gradient.
    """
    xp = array_module(values)
    rows, inverse = xp.unique(indices, return_inverse=True)
    inverse = inverse.reshape(-1)
    if rows.shape[0] == indices.shape[0]:
        summed = xp.empty(values.shape, dtype=values.dtype)
        summed[inverse] = values
    else:
        summed = xp.zeros((rows.shape[0], *values.shape[1:]), dtype=values.dtype)
        _scatter_add(xp, summed, inverse, values)
    return rows.astype(np.int64, copy=False), summed


def check_rows(rows: Array, n_rows: int, what: str) -> None:
    """Raise unless every (sorted) row index lies in ``[0, n_rows)``."""
    if rows.shape[0] == 0:
        return
    # rows is sorted: its ends are its extremes (one transfer on a GPU).
    low, high = (int(x) for x in array_module(rows).stack([rows[0], rows[-1]]).tolist())
    _check_extremes(low, high, n_rows, what)


def _check_extremes(low: int, high: int, n_rows: int, what: str) -> None:
    if low < 0 or high >= n_rows:
        bad = low if low < 0 else high
        raise IndexError(f"{what}: row index {bad} is out of range for {n_rows} rows")


def _scatter_add(xp: Any, out: Array, index: Array, values: Array) -> None:
    if xp is np:
        np.add.at(out, index, values)
        return
    add_at = getattr(xp.add, "at", None)
    if add_at is not None:
        add_at(out, index, values)
    else:  # pragma: no cover - older CuPy
        import cupyx

        cupyx.scatter_add(out, index, values)
