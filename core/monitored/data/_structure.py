"""Batches as structures: an array, or tuples, lists and dicts of them.

The pipeline checks every batch against the first one (same fields, same dtypes,
same shape after the batch axis) so a malformed record fails where it is made,
with its batch index and field, not three layers down in a step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._core._backend import is_array
from ._errors import BatchError

__all__ = ["check_batch", "flatten", "map_leaves", "signature"]

Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


def flatten(batch: Any, path: str = "") -> list[tuple[str, Any]]:
    """``[(path, leaf), ...]`` in a fixed order (dict keys in insertion order)."""
    if isinstance(batch, dict):
        out: list[tuple[str, Any]] = []
        for key, value in batch.items():
            out += flatten(value, f"{path}[{key!r}]")
        return out
    if isinstance(batch, tuple | list):
        out = []
        for i, value in enumerate(batch):
            out += flatten(value, f"{path}[{i}]")
        return out
    return [(path or "<batch>", batch)]


def map_leaves(fn: Callable[[Any], Any], batch: Any) -> Any:
    """The same structure with ``fn`` applied to every leaf."""
    if isinstance(batch, dict):
        return {key: map_leaves(fn, value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        items = [map_leaves(fn, value) for value in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else tuple(items)
    if isinstance(batch, list):
        return [map_leaves(fn, value) for value in batch]
    return fn(batch)


def signature(leaves: list[tuple[str, Any]]) -> Signature:
    """Fields, dtypes and per-example shapes: what must not change between batches.

    Sorted by path: a dict's fields are named, so two dicts listing the same
    fields in another order (``safetensors.numpy.load`` does not keep one) match.
    """
    return tuple(sorted((path, str(leaf.dtype), tuple(leaf.shape[1:])) for path, leaf in leaves))


def quick_signature(batch: Any) -> Any:
    """A cheap comparable summary of a NumPy batch, or ``None`` (use the full check).

    The per-batch check is on the hot path of every pipeline; this covers the
    common case (NumPy arrays in tuples, lists and dicts) in about a microsecond.
    """
    kind = type(batch)
    if kind is np.ndarray:
        # Tagged, so a dtype is only ever compared with a dtype (``np.dtype("f8") ==
        # None`` is true, and other comparisons go through dtype conversion).
        return ("array", batch.dtype, batch.shape[1:]) if batch.ndim else None
    if kind is tuple or kind is list:
        items = tuple(quick_signature(value) for value in batch)
        return None if None in items else (kind, items)
    if kind is dict:
        entries = tuple((key, quick_signature(value)) for key, value in batch.items())
        return None if any(sig is None for _, sig in entries) else (dict, entries)
    return None


def check_batch(
    batch: Any, index: int, source: str, first: Signature | None, first_index: int = 0
) -> Signature:
    """Raise :class:`BatchError` unless ``batch`` is arrays shaped like ``first``
    (the signature of batch ``first_index``, the first one checked)."""
    leaves = flatten(batch)
    for path, leaf in leaves:
        if not is_array(leaf):
            raise BatchError(
                f"source {source!r}: batch {index}, field {path} is {type(leaf).__name__}, "
                "not a NumPy or CuPy array (wrap it with numpy.asarray)",
                source=source,
                index=index,
                field=path,
            )
        if leaf.ndim == 0:
            raise BatchError(
                f"source {source!r}: batch {index}, field {path} is a 0-d array; a batch "
                "field needs a leading batch axis",
                source=source,
                index=index,
                field=path,
            )
    sig = signature(leaves)
    if first is None or sig == first:
        return sig
    had = {path: (dtype, shape) for path, dtype, shape in first}
    has = {path: (dtype, shape) for path, dtype, shape in sig}
    for path in list(had) + list(has):
        if path not in has or path not in had:
            raise BatchError(
                f"source {source!r}: batch {index} has fields {', '.join(has)}, but batch "
                f"{first_index} had {', '.join(had)} (field {path} differs)",
                source=source,
                index=index,
                field=path,
            )
        if had[path] != has[path]:
            (d0, s0), (d1, s1) = had[path], has[path]
            raise BatchError(
                f"source {source!r}: batch {index}, field {path} is {d1} with per-example "
                f"shape {s1}, but batch {first_index} had {d0} with {s0}",
                source=source,
                index=index,
                field=path,
            )
    raise AssertionError("unreachable: sorted signatures that differ differ in a field")
