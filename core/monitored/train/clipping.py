"""Gradient clipping, TF1's ``tf.clip_by_*`` and ``tf.global_norm``.

Each function returns new arrays of the input's shape, dtype and array module
and leaves its input alone; an :class:`~monitored.train.optimizers.IndexedSlices` is
clipped through its values (same indices). ``clip_by_global_norm`` keeps
``None`` entries as ``None`` and, as TF1, turns every tensor into NaN when the
global norm is infinite or NaN, so a diverging step is visible rather than
silently rescaled to zero. The lists may also be mappings ``name -> gradient``
(as :meth:`Optimizer.apply_gradients` takes), returned as dicts.

Norms are reduced on the arrays' own device (no transfer to the host); an
integer or Python-float norm argument is accepted wherever TF1 takes a scalar
tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, TypeVar, overload

import numpy as np

from .._core._backend import array_module, is_array, is_device_array
from .optimizers._indexed_slices import IndexedSlices
from .optimizers._types import Array

__all__ = [
    "clip_by_average_norm",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "global_norm",
]

_T = TypeVar("_T")


def clip_by_value(t: _T, clip_value_min: Any, clip_value_max: Any) -> _T:
    """``t`` with each element clipped to ``[clip_value_min, clip_value_max]``.

    The bounds are numbers or arrays that broadcast to ``t``'s shape without
    changing it; NaN stays NaN (TF1's ``minimum`` then ``maximum``).
    """
    if isinstance(t, IndexedSlices):
        values = clip_by_value(t.values, clip_value_min, clip_value_max)
        return IndexedSlices(values, t.indices, t.dense_shape)  # type: ignore[return-value]
    values = _check_array(t, "clip_by_value", floating=False)
    if (
        _is_number(clip_value_min)
        and _is_number(clip_value_max)
        and float(clip_value_min) > float(clip_value_max)
    ):
        raise ValueError(
            f"clip_by_value: clip_value_min ({clip_value_min}) is greater than "
            f"clip_value_max ({clip_value_max})"
        )
    shape = np.broadcast_shapes(
        tuple(values.shape), np.shape(clip_value_min), np.shape(clip_value_max)
    )
    if shape != tuple(values.shape):
        raise ValueError(
            f"clip_by_value: the bounds broadcast {tuple(values.shape)} to {shape}; "
            "they must not change the shape of t"
        )
    xp = array_module(values)
    out = xp.asarray(xp.maximum(xp.minimum(values, clip_value_max), clip_value_min))
    if out.dtype != values.dtype:
        out = out.astype(values.dtype)
    return out  # type: ignore[no-any-return]


def clip_by_norm(t: _T, clip_norm: float, axes: int | Sequence[int] | None = None) -> _T:
    """``t * clip_norm / max(l2norm(t), clip_norm)``, the L2 norm taken over ``axes``.

    ``axes=None`` uses the whole tensor; with axes, each slice along the other
    dimensions is clipped separately (e.g. ``axes=1`` clips each row).
    """
    clip = _check_clip_norm(clip_norm, "clip_by_norm")
    if isinstance(t, IndexedSlices):
        values = clip_by_norm(t.values, clip, axes)
        return IndexedSlices(values, t.indices, t.dense_shape)  # type: ignore[return-value]
    values = _check_array(t, "clip_by_norm")
    xp = array_module(values)
    axis = tuple(axes) if isinstance(axes, Sequence) else axes
    # Squares of float16 values overflow float16 long before the norm does.
    wide = values.astype(np.float32) if values.dtype.itemsize < 4 else values
    with np.errstate(invalid="ignore", over="ignore"):
        l2sum = xp.sum(wide * wide, axis=axis, keepdims=True)
        positive = l2sum > 0
        l2norm = xp.where(positive, xp.sqrt(xp.where(positive, l2sum, 1)), l2sum)
        out = wide * clip / xp.maximum(l2norm, clip)
    return xp.asarray(out, dtype=values.dtype)  # type: ignore[no-any-return]


def clip_by_average_norm(t: _T, clip_norm: float) -> _T:
    """``t * min(clip_norm / (l2norm(t) / t.size), 1)``: clip the norm per element.

    TF1's (deprecated in TF2, equal to ``clip_by_norm(t, clip_norm * t.size)``).
    """
    clip = _check_clip_norm(clip_norm, "clip_by_average_norm")
    if isinstance(t, IndexedSlices):
        values = clip_by_average_norm(t.values, clip)
        return IndexedSlices(values, t.indices, t.dense_shape)  # type: ignore[return-value]
    values = _check_array(t, "clip_by_average_norm")
    xp = array_module(values)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inverse = 1.0 / xp.sqrt(_sum_squares(values))
        scale = clip * xp.minimum(inverse * values.size, 1.0 / clip)
        out = values * scale.astype(values.dtype)
    return xp.asarray(out)  # type: ignore[no-any-return]


@overload
def global_norm(t_list: Mapping[str, Any]) -> Array: ...
@overload
def global_norm(t_list: Sequence[Any]) -> Array: ...
def global_norm(t_list: Sequence[Any] | Mapping[str, Any]) -> Array:
    """``sqrt(sum(l2norm(t)**2 for t in t_list))`` as a 0-d array; ``None`` entries skipped.

    The squares are summed per tensor in its own dtype (``float16`` in
    ``float32``) and across tensors in ``float64``; the result has the
    tensors' common dtype (``float32`` for an empty list, as TF1) and their
    array module.
    """
    values = [v for v in _values(t_list, "global_norm") if v is not None]
    if not values:
        return np.zeros((), dtype=np.float32)
    xp = _common_module(values, "global_norm")
    dtype = np.result_type(*[v.dtype for v in values])
    total = xp.zeros((), dtype=np.float64)
    for v in values:
        total += _sum_squares(v).astype(np.float64)
    return xp.asarray(xp.sqrt(total), dtype=dtype)


@overload
def clip_by_global_norm(
    t_list: Mapping[str, Any], clip_norm: float, use_norm: Any = None
) -> tuple[dict[str, Any], Array]: ...
@overload
def clip_by_global_norm(
    t_list: Sequence[Any], clip_norm: float, use_norm: Any = None
) -> tuple[list[Any], Array]: ...
def clip_by_global_norm(
    t_list: Sequence[Any] | Mapping[str, Any], clip_norm: float, use_norm: Any = None
) -> tuple[list[Any] | dict[str, Any], Array]:
    """Scale every tensor by ``clip_norm / max(global_norm, clip_norm)``.

    Returns ``(clipped, global_norm)``: ``clipped`` has ``t_list``'s entries in
    order (``None`` stays ``None``; a mapping gives a dict) and ``global_norm``
    is :func:`global_norm` of ``t_list`` or ``use_norm`` when given. When the
    norm is at most ``clip_norm`` the tensors come back unchanged (equal
    values); when it is infinite or NaN every element becomes NaN (TF1).
    This is the clipping of Pascanu et al. (2013): one scale for all gradients
    keeps the update's direction.
    """
    clip = _check_clip_norm(clip_norm, "clip_by_global_norm")
    entries = _values(t_list, "clip_by_global_norm")
    present = [v for v in entries if v is not None]
    norm = global_norm(list(entries)) if use_norm is None else use_norm
    xp = _common_module(present, "clip_by_global_norm") if present else np
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        n = xp.asarray(norm, dtype=np.float64)
        # clip / max(n, clip) is 1 exactly when n <= clip; (n - n) is 0 for a
        # finite norm and NaN for an infinite or NaN one, which poisons the scale.
        scale = clip / xp.maximum(n, clip) + (n - n)
        clipped_values = [
            None if v is None else xp.asarray(v * scale.astype(v.dtype)) for v in entries
        ]
    clipped = [_rewrap(t, c) for t, c in zip(_items(t_list), clipped_values, strict=True)]
    if isinstance(t_list, Mapping):
        return dict(zip(t_list, clipped, strict=True)), norm
    return clipped, norm


# -- helpers -------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_clip_norm(clip_norm: object, what: str) -> float:
    if not _is_number(clip_norm) and not (
        isinstance(clip_norm, np.ndarray | np.generic) and np.ndim(clip_norm) == 0
    ):
        raise TypeError(f"{what}: clip_norm must be a number, got {clip_norm!r}")
    clip = float(clip_norm)  # type: ignore[arg-type]
    if not (clip > 0 and math.isfinite(clip)):
        raise ValueError(f"{what}: clip_norm must be a positive finite number, got {clip}")
    return clip


def _check_array(t: Any, what: str, *, floating: bool = True) -> Array:
    if isinstance(t, np.generic):
        t = np.asarray(t)  # a NumPy scalar (``err.mean()``) is a 0-d value, as for optimizers
    if not is_array(t):
        raise TypeError(
            f"{what}: t must be a NumPy or CuPy array or an IndexedSlices, got "
            f"{type(t).__name__}; wrap it with numpy.asarray(...)"
        )
    kind = np.floating if floating else np.number
    if not np.issubdtype(t.dtype, kind):
        raise TypeError(
            f"{what}: t must be {'floating point' if floating else 'numeric'}, got {t.dtype}"
        )
    return t


def _items(t_list: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    return list(t_list.values()) if isinstance(t_list, Mapping) else list(t_list)


def _values(t_list: Sequence[Any] | Mapping[str, Any], what: str) -> list[Array | None]:
    """The arrays to reduce or scale: the values of IndexedSlices, None kept."""
    if not isinstance(t_list, Sequence | Mapping) or isinstance(t_list, str | bytes):
        raise TypeError(
            f"{what}: t_list must be a sequence (or a mapping) of arrays, got "
            f"{type(t_list).__name__}"
        )
    out: list[Array | None] = []
    for i, t in enumerate(_items(t_list)):
        if t is None:
            out.append(None)
        elif isinstance(t, IndexedSlices):
            out.append(t.values)
        elif is_array(t) or isinstance(t, np.generic):
            out.append(_check_array(t, f"{what} (entry {i})"))
        else:
            raise TypeError(
                f"{what}: entry {i} must be an array, an IndexedSlices or None, got "
                f"{type(t).__name__}"
            )
    return out


def _common_module(values: Sequence[Array], what: str) -> Any:
    kinds = {is_device_array(v) for v in values}
    if len(kinds) > 1:
        raise TypeError(f"{what}: t_list mixes NumPy and CuPy arrays")
    return array_module(values[0])


def _sum_squares(v: Array) -> Array:
    """The sum of squares of ``v`` as a 0-d array, accumulated in float32 or wider."""
    xp = array_module(v)
    if v.dtype.itemsize < 4:
        v = v.astype(np.float32)
    flat = v.reshape(-1)
    return xp.asarray(xp.dot(flat, flat))


def _rewrap(original: Any, values: Array | None) -> Any:
    if isinstance(original, IndexedSlices):
        return IndexedSlices(values, original.indices, original.dense_shape)
    return values
