"""Gradient clipping: TF1's formulas, None entries, inf/NaN norms, and invariants."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from monitored.train.clipping import (
    clip_by_average_norm,
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
    global_norm,
)
from monitored.train.optimizers import IndexedSlices

F32 = np.float32


def _reference_norm(tensors: list[Any]) -> float:
    total = 0.0
    for t in tensors:
        if t is None:
            continue
        values = t.values if isinstance(t, IndexedSlices) else t
        total += float(np.sum(values.astype(np.float64) ** 2))
    return float(np.sqrt(total))


# -- strategies ---------------------------------------------------------------------------

_dtypes = st.sampled_from([np.float32, np.float64])


@st.composite
def _tensor(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(_dtypes)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    elements = st.floats(-100, 100, allow_nan=False, width=32)
    return draw(hnp.arrays(dtype, shape, elements=elements))


@st.composite
def _entry(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["none", "dense", "sparse"]))
    if kind == "none":
        return None
    if kind == "dense":
        return draw(_tensor())
    rows = draw(st.integers(0, 4))
    values = draw(hnp.arrays(F32, (rows, 2), elements=st.floats(-100, 100, width=32)))
    indices = draw(hnp.arrays(np.int64, (rows,), elements=st.integers(0, 5)))
    return IndexedSlices(values, indices, dense_shape=(6, 2))


_t_lists = st.lists(_entry(), max_size=5)
_clip_norms = st.floats(0.01, 500)


def _values(t: Any) -> np.ndarray:
    return t.values if isinstance(t, IndexedSlices) else t


# -- clip_by_global_norm ----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(t_list=_t_lists, clip_norm=_clip_norms)
def test_global_norm_clipping_invariants(t_list: list[Any], clip_norm: float) -> None:
    clipped, norm = clip_by_global_norm(t_list, clip_norm)
    expected_norm = _reference_norm(t_list)
    # Squares of float32 values below ~1e-19 underflow (TF1 computes in the
    # tensors' dtype too), so tiny norms are only known to within ~1e-18.
    assert float(norm) == pytest.approx(expected_norm, rel=1e-5, abs=1e-18)
    assert len(clipped) == len(t_list)
    for original, out in zip(t_list, clipped, strict=True):
        if original is None:
            assert out is None
            continue
        assert type(out) is type(original)
        if isinstance(original, IndexedSlices):
            assert out.indices is original.indices
            assert out.dense_shape == original.dense_shape
        before, after = _values(original), _values(out)
        assert after.shape == before.shape
        assert after.dtype == before.dtype
        if float(norm) <= clip_norm:
            np.testing.assert_array_equal(after, before)  # untouched, not merely close
        else:
            scale = clip_norm / float(norm)
            np.testing.assert_allclose(after, before * scale, rtol=2e-5, atol=1e-30)
    if float(norm) > clip_norm:
        assert _reference_norm(clipped) == pytest.approx(clip_norm, rel=1e-4)


@settings(max_examples=60, deadline=None)
@given(
    t_list=_t_lists.filter(lambda ts: any(_values(t).size for t in ts if t is not None)),
    poison=st.sampled_from([np.inf, -np.inf, np.nan]),
    clip_norm=_clip_norms,
)
def test_an_infinite_or_nan_norm_makes_everything_nan(
    t_list: list[Any], poison: float, clip_norm: float
) -> None:
    target = next(t for t in t_list if t is not None and _values(t).size)
    _values(target).reshape(-1)[0] = poison
    clipped, norm = clip_by_global_norm(t_list, clip_norm)
    assert not np.isfinite(float(norm))
    for out in clipped:
        if out is not None:
            assert np.all(np.isnan(_values(out)))


def test_clip_by_global_norm_by_hand() -> None:
    a = np.array([3.0, 0.0], F32)
    b = np.array([[4.0]], F32)
    (ca, cb, none), norm = clip_by_global_norm([a, b, None], 2.5)
    assert norm.dtype == F32
    assert float(norm) == 5.0
    np.testing.assert_allclose(ca, [1.5, 0.0])
    np.testing.assert_allclose(cb, [[2.0]])
    assert none is None
    np.testing.assert_array_equal(a, [3.0, 0.0])  # inputs are left alone


def test_use_norm_replaces_the_computed_norm() -> None:
    a = np.array([3.0, 4.0])
    (clipped,), norm = clip_by_global_norm([a], 1.0, use_norm=10.0)
    assert norm == 10.0
    np.testing.assert_allclose(clipped, a / 10)


def test_mappings_come_back_as_dicts() -> None:
    grads = {"w": np.array([6.0, 8.0]), "b": None}
    clipped, norm = clip_by_global_norm(grads, 5.0)
    assert list(clipped) == ["w", "b"]
    np.testing.assert_allclose(clipped["w"], [3.0, 4.0])
    assert clipped["b"] is None
    assert float(global_norm(grads)) == float(norm) == 10.0


def test_all_none_or_empty() -> None:
    clipped, norm = clip_by_global_norm([None, None], 1.0)
    assert clipped == [None, None]
    assert norm.dtype == F32
    assert float(norm) == 0.0
    assert float(global_norm([])) == 0.0


# -- global_norm -----------------------------------------------------------------------


def test_global_norm_dtype_and_half_precision() -> None:
    half = np.full(4, 300.0, np.float16)  # squares overflow float16
    assert float(global_norm([half])) == pytest.approx(600.0)
    assert global_norm([half]).dtype == np.float16
    assert global_norm([np.ones(2, F32), np.ones(2)]).dtype == np.float64


@pytest.mark.parametrize(
    ("t_list", "error", "match"),
    [
        (np.ones(3), TypeError, "must be a sequence"),
        ("ab", TypeError, "must be a sequence"),
        (3, TypeError, "must be a sequence"),
        ([[1.0, 2.0]], TypeError, "entry 0 must be an array, an IndexedSlices or None, got list"),
        ([np.ones(2, np.int32)], TypeError, r"\(entry 0\): t must be floating point"),
    ],
)
def test_global_norm_rejects_bad_lists(t_list: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        global_norm(t_list)
    with pytest.raises(error, match=match):
        clip_by_global_norm(t_list, 1.0)


@pytest.mark.parametrize(
    ("clip_norm", "error"),
    [
        (0.0, ValueError),
        (-1.0, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("1", TypeError),
        (True, TypeError),
    ],
)
def test_clip_norm_must_be_positive_and_finite(clip_norm: Any, error: type) -> None:
    with pytest.raises(error, match="clip_norm"):
        clip_by_global_norm([np.ones(2)], clip_norm)
    with pytest.raises(error, match="clip_norm"):
        clip_by_norm(np.ones(2), clip_norm)
    with pytest.raises(error, match="clip_norm"):
        clip_by_average_norm(np.ones(2), clip_norm)


def test_clip_norm_may_be_a_numpy_scalar() -> None:
    out = clip_by_norm(np.array([3.0, 4.0]), np.float32(1.0))
    np.testing.assert_allclose(out, [0.6, 0.8])


# -- clip_by_norm ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(t=_tensor(), clip_norm=_clip_norms)
def test_clip_by_norm_invariants(t: np.ndarray, clip_norm: float) -> None:
    out = clip_by_norm(t, clip_norm)
    assert out.shape == t.shape
    assert out.dtype == t.dtype
    norm = float(np.sqrt(np.sum(t.astype(np.float64) ** 2)))
    if norm <= clip_norm:
        # t * clip / clip: exact but for subnormal float32 values, which carry
        # fewer significant bits (hence the absolute tolerance below 1.2e-38).
        np.testing.assert_allclose(out, t, rtol=1e-6, atol=1e-40)
    else:
        assert float(np.sqrt(np.sum(out.astype(np.float64) ** 2))) == pytest.approx(
            clip_norm, rel=1e-5
        )
        np.testing.assert_allclose(out, t * (clip_norm / norm), rtol=1e-5, atol=1e-30)


def test_clip_by_norm_along_axes_clips_each_slice() -> None:
    t = np.array([[3.0, 4.0], [0.3, 0.4]], F32)
    np.testing.assert_allclose(clip_by_norm(t, 1.0, axes=1), [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
    np.testing.assert_allclose(
        clip_by_norm(t, 1.0, axes=[0]), [[0.99503719, 0.99503719], [0.09950372, 0.09950372]]
    )


def test_clip_by_norm_edge_values() -> None:
    np.testing.assert_array_equal(clip_by_norm(np.zeros(3, F32), 1.0), np.zeros(3, F32))
    with_inf = clip_by_norm(np.array([np.inf, 1.0]), 1.0)
    assert np.isnan(with_inf[0])  # TF1: t * clip / inf
    assert with_inf[1] == 0.0
    assert np.all(np.isnan(clip_by_norm(np.array([np.nan, 1.0]), 1.0)))


def test_clip_by_norm_of_indexed_slices_clips_the_values() -> None:
    grad = IndexedSlices(np.array([[3.0, 4.0]]), [2], dense_shape=(3, 2))
    out = clip_by_norm(grad, 1.0)
    assert isinstance(out, IndexedSlices)
    assert out.indices is grad.indices
    np.testing.assert_allclose(out.values, [[0.6, 0.8]])


# -- clip_by_average_norm --------------------------------------------------------------


def test_clip_by_average_norm() -> None:
    t = np.array([3.0, 4.0], F32)  # norm 5, average norm 2.5
    np.testing.assert_allclose(clip_by_average_norm(t, 1.0), t / 2.5, rtol=1e-6)
    np.testing.assert_allclose(clip_by_average_norm(t, 3.0), t, rtol=1e-6)
    np.testing.assert_array_equal(clip_by_average_norm(np.zeros(2, F32), 1.0), np.zeros(2))
    assert clip_by_average_norm(t, 1.0).dtype == F32
    sparse = clip_by_average_norm(IndexedSlices(t.reshape(1, 2), [0]), 1.0)
    np.testing.assert_allclose(sparse.values, [t / 2.5], rtol=1e-6)


# -- clip_by_value ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(t=_tensor(), low=st.floats(-50, 0), width=st.floats(0, 50))
def test_clip_by_value_invariants(t: np.ndarray, low: float, width: float) -> None:
    high = low + width
    out = clip_by_value(t, low, high)
    assert out.dtype == t.dtype
    assert out.shape == t.shape
    lo, hi = t.dtype.type(low), t.dtype.type(high)
    assert np.all((out >= lo) & (out <= hi))
    inside = (t >= lo) & (t <= hi)
    np.testing.assert_array_equal(out[inside], t[inside])


def test_clip_by_value_keeps_nan_and_accepts_array_bounds() -> None:
    out = clip_by_value(np.array([np.nan, -5.0, 5.0]), -1.0, 1.0)
    assert np.isnan(out[0])
    assert out[1:].tolist() == [-1.0, 1.0]
    t = np.array([[0.0, 10.0], [-10.0, 0.5]], F32)
    out = clip_by_value(t, np.array([-1.0, 0.0], F32), np.array([1.0, 2.0], F32))
    np.testing.assert_array_equal(out, [[0.0, 2.0], [-1.0, 0.5]])
    assert clip_by_value(np.arange(5), 1, 3).tolist() == [1, 1, 2, 3, 3]
    sparse = clip_by_value(IndexedSlices(np.array([[5.0]]), [1]), 0.0, 1.0)
    assert isinstance(sparse, IndexedSlices)
    assert sparse.values[0, 0] == 1.0


def test_clip_by_value_errors() -> None:
    with pytest.raises(ValueError, match="clip_value_min .* is greater than clip_value_max"):
        clip_by_value(np.ones(2), 1.0, 0.0)
    with pytest.raises(ValueError, match="must not change the shape"):
        clip_by_value(np.ones(2), np.zeros((3, 1)), 1.0)
    with pytest.raises(
        TypeError, match=r"or an IndexedSlices, got list; wrap it with numpy\.asarray\(\.\.\.\)$"
    ):
        clip_by_value([1.0], 0.0, 1.0)
    with pytest.raises(TypeError, match="must be numeric"):
        clip_by_value(np.array(["a"]), 0.0, 1.0)


def test_clip_by_norm_clips_float16_whose_squares_overflow() -> None:
    t = np.full(1000, 10, np.float16)
    out = clip_by_norm(t, 1.0)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), np.full(1000, 10 / np.sqrt(1e5)), rtol=1e-3)


def test_global_norm_is_a_0d_array() -> None:
    norm = global_norm([np.ones(4, np.float32)])
    assert isinstance(norm, np.ndarray)
    assert norm.shape == ()


def test_clipping_accepts_a_numpy_scalar_gradient_as_a_0d_array() -> None:
    """``err.mean()`` is an ``np.float32``: clipped like a 0-d array, on the way to an
    optimizer that takes it for a 0-d entry (issue 22)."""
    scalar = np.array([3.0, 5.0], F32).mean()  # np.float32(4.0)
    (w, b), norm = clip_by_global_norm([np.array([3.0], F32), scalar], 2.5)
    assert float(norm) == 5.0
    assert isinstance(b, np.ndarray)
    assert b.shape == ()
    assert b.dtype == F32
    np.testing.assert_allclose([w[0], b], [1.5, 2.0])
    assert float(global_norm({"b": scalar})) == 4.0
    clipped = clip_by_norm(scalar, 1.0)
    assert clipped.shape == ()
    assert float(clipped) == 1.0
    assert float(clip_by_value(np.float64(-2.0), -1.0, 1.0)) == -1.0
    with pytest.raises(TypeError, match="must be floating point, got int64"):
        clip_by_norm(np.int64(3), 1.0)
