"""``shard``: each process of a distributed job reads its own disjoint part.

Process ``index`` of ``num_shards`` keeps every ``num_shards``-th element starting
at ``index`` (rows of arrays, or of a tuple or dict of arrays; items of a list,
another sequence or an iterable; batch indices of an index function). The
shards are disjoint and together cover the input; their sizes differ by at
most one element. In a job of several processes, a pipeline whose shard ends
first stops every process after the same step (see ``Pipeline``), so the
longer shards' last batches are not read; size the data to a multiple to read
them all.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

import numpy as np

from .._core._backend import is_array
from ._structure import flatten, map_leaves

__all__ = ["shard"]

T = TypeVar("T")


def shard(source: Any, num_shards: int, index: int) -> Any:
    """The part of ``source`` that process ``index`` of ``num_shards`` reads.

    ``source`` may be an array or a tuple or dict of arrays (rows are examples:
    strided views, no copy), a sequence such as a list of batches or of file
    names (its items are split, as ``prefetch`` reads a list item by item), an
    iterable (every process reads it all and keeps its items) or a function of
    the batch index (``i`` becomes ``i * num_shards + index``).
    """
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_shards:
        raise ValueError(f"shard index must be in [0, {num_shards}), got {index!r}")
    leaves = [] if isinstance(source, list) else flatten(source)
    if leaves and all(is_array(leaf) for _, leaf in leaves):
        return map_leaves(lambda leaf: leaf[index::num_shards], source)
    if isinstance(source, collections.abc.Sequence) and not isinstance(source, str | bytes):
        return _ShardView(source, num_shards, index)
    if isinstance(source, Iterable):
        return _ShardedIterable(source, num_shards, index)
    if callable(source):
        function: Callable[[int], Any] = source
        sharded = lambda i: function(i * num_shards + index)  # noqa: E731
        # The same name on every process: a pipeline is known by it (its plugin
        # state, which a worker takes from the chief's).
        sharded.__name__ = getattr(source, "__name__", "source")
        sharded._monitored_shard_of = source  # type: ignore[attr-defined]
        return sharded
    raise TypeError(f"cannot shard a {type(source).__name__}")


class _ShardView(Sequence[T]):
    """Elements ``index, index + n, index + 2n, ...`` of a sequence."""

    def __init__(self, base: Sequence[T], num_shards: int, index: int) -> None:
        #: What this is a shard of (a pipeline takes its name from it).
        self._monitored_shard_of = base
        self._base = base
        self._num = num_shards
        self._index = index
        self._len = len(range(index, len(base), num_shards))

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if isinstance(i, int | np.integer) and -self._len <= i < self._len:
            return self._base[self._index + (int(i) % self._len) * self._num]
        raise IndexError(f"shard index {i} out of range for a shard of {self._len}")


class _ShardedIterable(Iterable[T]):
    """Every ``num_shards``-th element of an iterable; re-iterable if it is."""

    def __init__(self, base: Iterable[T], num_shards: int, index: int) -> None:
        #: What this is a shard of (a pipeline takes its name from it).
        self._monitored_shard_of = base
        self._base = base
        self._num = num_shards
        self._index = index

    def __iter__(self) -> Iterator[T]:
        for position, item in enumerate(self._base):
            if position % self._num == self._index:
                yield item
