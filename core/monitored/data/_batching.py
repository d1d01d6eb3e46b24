"""TF1's ``tf.train.batch`` and ``tf.train.shuffle_batch`` on the prefetch pipeline.

TF1 put single examples into a queue from reader threads and dequeued batches.
Here the examples are read by index: the batch with global index ``b`` holds the
examples at stream positions ``[b * batch_size, (b + 1) * batch_size)``, where the
stream is the dataset repeated ``num_epochs`` times, each epoch in the order of a
permutation drawn from ``(seed, epoch)`` for ``shuffle_batch``. A batch's content
is a function of its index only, so ``num_threads`` workers make batches in
parallel without changing the stream, and the position is one integer.
"""

from __future__ import annotations

import collections.abc
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .._core._backend import array_module, is_array
from .._core._errors import UnsupportedArgumentError
from ._prefetch import FeedingPipeline, Pipeline
from ._sharding import _ShardView
from ._structure import flatten, map_leaves

__all__ = ["batch", "shuffle_batch"]

#: How many epochs' permutations are kept (workers near an epoch boundary need two).
_PERMUTATIONS_KEPT = 4


def batch(
    tensors: Any,
    batch_size: int,
    num_threads: int = 1,
    capacity: int = 32,
    enqueue_many: bool = False,
    shapes: None = None,
    dynamic_pad: bool = False,
    allow_smaller_final_batch: bool = False,
    shared_name: None = None,
    name: str | None = None,
    *,
    num_epochs: int | None = None,
    feed: str | bool | None = False,
    device: bool = False,
) -> Pipeline:
    """Batches of ``batch_size`` examples, in order (TF1's ``tf.train.batch``).

    Args:
        tensors: the examples. With ``enqueue_many=False`` (TF's default) a
            sequence of examples (each an array, or a tuple/dict of arrays or
            scalars) or an iterable of them; with ``enqueue_many=True`` an array
            or a tuple/list/dict of arrays whose first axis indexes examples (the
            in-memory dataset TF1 fed through ``slice_input_producer``).
        batch_size: examples per batch; a new leading axis of that size.
        num_threads: workers making batches in parallel (read-by-index inputs).
        capacity: examples buffered ahead (``capacity // batch_size`` batches, at least 1).
        allow_smaller_final_batch: deliver the last, incomplete batch (else dropped).
        num_epochs: passes over the examples (``None``: forever, as TF1's producers).
        name: the pipeline's name in errors and checkpoints.
        feed: as for :func:`~monitored.data.prefetch`.
        device: as for :func:`~monitored.data.prefetch`.

    ``shapes``, ``dynamic_pad`` and ``shared_name`` have no meaning here.
    """
    return _make(
        "batch",
        tensors,
        batch_size,
        num_threads=num_threads,
        capacity=capacity,
        enqueue_many=enqueue_many,
        allow_smaller_final_batch=allow_smaller_final_batch,
        name=name,
        num_epochs=num_epochs,
        feed=feed,
        device=device,
        shuffle=False,
        seed=None,
        unsupported={"shapes": shapes, "dynamic_pad": dynamic_pad, "shared_name": shared_name},
    )


def shuffle_batch(
    tensors: Any,
    batch_size: int,
    capacity: int,
    min_after_dequeue: int,
    num_threads: int = 1,
    seed: int | None = None,
    enqueue_many: bool = False,
    shapes: None = None,
    allow_smaller_final_batch: bool = False,
    shared_name: None = None,
    name: str | None = None,
    *,
    num_epochs: int | None = None,
    feed: str | bool | None = False,
    device: bool = False,
) -> Pipeline:
    """Batches of randomly shuffled examples (TF1's ``tf.train.shuffle_batch``).

    Arguments as for :func:`batch`, plus:

    Args:
        capacity: examples buffered ahead; must be larger than ``min_after_dequeue``.
        min_after_dequeue: TF1's mixing level: the examples left in its shuffle
            queue after a dequeue. Each epoch here is a full permutation, which
            mixes at least as well as any queue, so it only has to be valid
            (``0 <= min_after_dequeue < capacity``).
        seed: the shuffle seed. ``None`` draws one, which is saved with
            checkpoints so a resumed run shuffles as the interrupted one did.

    The examples must be readable by index (a sequence or arrays, not a
    one-pass iterable): that is what makes the order reproducible with several
    threads and the resume exact.
    """
    if isinstance(min_after_dequeue, bool) or not isinstance(min_after_dequeue, int):
        raise TypeError(f"min_after_dequeue must be an int, got {min_after_dequeue!r}")
    if min_after_dequeue < 0:
        raise ValueError(f"min_after_dequeue must be >= 0, got {min_after_dequeue}")
    if capacity <= min_after_dequeue:
        raise ValueError(
            f"capacity {capacity} must be bigger than min_after_dequeue {min_after_dequeue}"
        )
    explicit = seed is not None
    if seed is None:
        seed = int(np.random.SeedSequence().entropy) % 2**63  # type: ignore[arg-type]
    return _make(
        "shuffle_batch",
        tensors,
        batch_size,
        num_threads=num_threads,
        capacity=capacity,
        enqueue_many=enqueue_many,
        allow_smaller_final_batch=allow_smaller_final_batch,
        name=name,
        num_epochs=num_epochs,
        feed=feed,
        device=device,
        shuffle=True,
        seed=seed,
        explicit_seed=explicit,
        min_after_dequeue=min_after_dequeue,
        unsupported={"shapes": shapes, "shared_name": shared_name},
    )


def _make(
    kind: str,
    tensors: Any,
    batch_size: int,
    *,
    num_threads: int,
    capacity: int,
    enqueue_many: bool,
    allow_smaller_final_batch: bool,
    name: str | None,
    num_epochs: int | None,
    feed: str | bool | None,
    device: bool,
    shuffle: bool,
    seed: int | None,
    unsupported: Mapping[str, Any],
    explicit_seed: bool = False,
    min_after_dequeue: int = 0,
) -> Pipeline:
    for argument, value in unsupported.items():
        if value not in (None, False):
            raise UnsupportedArgumentError(
                f"{kind}({argument}=...) has no meaning here: shapes come from the arrays, "
                "batches are not padded, and pipelines are not shared between sessions"
            )
    for argument, value in (("batch_size", batch_size), ("num_threads", num_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{argument} must be an int >= 1, got {value!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    if num_epochs is not None and (isinstance(num_epochs, bool) or num_epochs < 1):
        raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs!r}")
    label = name or kind
    examples = _examples(tensors, enqueue_many, label)
    config: dict[str, Any] = {
        "kind": kind,
        "batch_size": batch_size,
        "num_epochs": num_epochs,
        "allow_smaller_final_batch": allow_smaller_final_batch,
    }
    if shuffle:
        config["seed"] = seed if explicit_seed else "drawn"
        config["min_after_dequeue"] = min_after_dequeue
    common: dict[str, Any] = {
        "name": label,
        "buffer_size": max(1, capacity // batch_size),
        "num_workers": num_threads,
        "threads": True,
        "device": device,
        "seed": seed,
        "config": config,
    }
    if isinstance(examples, _Examples):
        config["examples"] = len(examples)
        maker = _BatchMaker(
            examples, batch_size, num_epochs, allow_smaller_final_batch, seed if shuffle else None
        )
        common |= {
            "load": maker,
            "length": maker.num_batches,
            "epoch_length": len(examples),
            "batch_size": batch_size,
        }
        pipeline_class = _BatchPipeline
    else:
        if shuffle:
            raise TypeError(
                f"shuffle_batch {label!r}: the examples must be readable by index (a sequence, "
                f"or arrays with enqueue_many=True), not a one-pass {type(tensors).__name__}; "
                "that is what makes the shuffle reproducible and the resume exact"
            )
        if num_threads > 1:
            raise ValueError(
                f"batch {label!r} reads an iterable in order: num_threads must be 1, got "
                f"{num_threads}; pass a sequence for parallel batching"
            )
        common["open_iter"] = _grouper(examples, batch_size, num_epochs, allow_smaller_final_batch)
        pipeline_class = _BatchPipeline
    if feed is False:
        return pipeline_class(**common)
    return _FeedingBatchPipeline(feed="batch" if feed is True else feed, **common)


class _BatchPipeline(Pipeline):
    """A pipeline whose batches group ``batch_size`` examples (for position reports)."""

    def __init__(self, *, batch_size: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._batch_size = batch_size
        self._maker = kwargs.get("load")

    def plugin_state(self) -> dict[str, Any]:
        saved = super().plugin_state()
        if self._epoch_length:
            examples = self._next * self._batch_size
            saved["epoch"], saved["index_in_epoch"] = divmod(examples, self._epoch_length)
        return saved

    def _reseed(self) -> None:
        if isinstance(self._maker, _BatchMaker) and self._maker.seed is not None:
            self._maker.reseed(self._seed)


class _FeedingBatchPipeline(_BatchPipeline, FeedingPipeline):
    """A batching pipeline that also feeds the step."""


class _Examples:
    """Examples read by index: ``take(rows)`` stacks the rows into a batch."""

    def __init__(self, size: int, take: Callable[[np.ndarray], Any]) -> None:
        self._size = size
        self.take = take

    def __len__(self) -> int:
        return self._size


def _examples(tensors: Any, enqueue_many: bool, label: str) -> _Examples | Iterable[Any]:
    leaves = flatten(tensors)
    arrays = bool(leaves) and all(is_array(leaf) for _, leaf in leaves)
    if enqueue_many:
        if not arrays:
            hint = (
                "; data.shard splits a list by item (its batches): to shard arrays by rows, "
                "shard a tuple, data.shard((x, y), num_shards, index)"
                if isinstance(tensors, _ShardView)
                else ""
            )
            raise TypeError(
                f"{label}: with enqueue_many=True, tensors must be an array or a tuple/list/"
                f"dict of arrays whose first axis indexes examples{hint}"
            )
        sizes = {path: leaf.shape[0] if leaf.ndim else None for path, leaf in leaves}
        size = next(iter(sizes.values()))
        for path, n in sizes.items():
            if n is None or n != size:
                raise ValueError(
                    f"{label}: every field needs the same number of examples on axis 0; field "
                    f"{path} has {n}, field {next(iter(sizes))} has {size}"
                )
        assert size is not None
        return _Examples(size, lambda rows: map_leaves(lambda leaf: leaf[rows], tensors))
    if is_array(tensors) or isinstance(tensors, Mapping):
        raise TypeError(
            f"{label}: with enqueue_many=False, tensors is a sequence or iterable of single "
            f"examples; for a {type(tensors).__name__} of examples along axis 0 pass "
            "enqueue_many=True"
        )
    if isinstance(tensors, collections.abc.Sequence) and not isinstance(tensors, str | bytes):
        sequence: Sequence[Any] = tensors
        return _Examples(
            len(sequence), lambda rows: _stack([sequence[int(r)] for r in rows], label)
        )
    if isinstance(tensors, Iterable):
        return tensors
    raise TypeError(f"{label}: cannot batch a {type(tensors).__name__}")


def _stack(examples: list[Any], label: str) -> Any:
    """One batch from single examples: each field stacked on a new leading axis."""
    first = [path for path, _ in flatten(examples[0])]
    columns: list[list[Any]] = [[] for _ in first]
    for number, example in enumerate(examples):
        leaves = dict(flatten(example))  # by path: a dict's fields may come in any order
        if len(leaves) != len(first) or not all(path in leaves for path in first):
            raise TypeError(
                f"{label}: example {number} of a batch has fields {list(leaves)}, "
                f"the first has {first}"
            )
        for column, path in zip(columns, first, strict=True):
            column.append(leaves[path])
    stacked = iter(
        [
            array_module(column[0]).stack(column) if is_array(column[0]) else np.asarray(column)
            for column in columns
        ]
    )
    return map_leaves(lambda _: next(stacked), examples[0])


class _BatchMaker:
    """Batch ``b`` of the (shuffled, repeated) example stream, a function of ``b`` only."""

    def __init__(
        self,
        examples: _Examples,
        batch_size: int,
        num_epochs: int | None,
        allow_smaller: bool,
        seed: int | None,
    ) -> None:
        self._examples = examples
        self._size = len(examples)
        self._batch_size = batch_size
        self._total = None if num_epochs is None else self._size * num_epochs
        self.seed = seed
        self._lock = threading.Lock()
        self._orders: dict[int, np.ndarray] = {}
        if self._size == 0:
            self.num_batches: int | None = 0
        elif self._total is None:
            self.num_batches = None
        elif allow_smaller:
            self.num_batches = math.ceil(self._total / batch_size)
        else:
            self.num_batches = self._total // batch_size

    def reseed(self, seed: int | None) -> None:
        with self._lock:
            self.seed = seed
            self._orders.clear()

    def _order(self, epoch: int) -> np.ndarray:
        with self._lock:
            order = self._orders.get(epoch)
            seed = self.seed
        if order is None:
            assert seed is not None
            bits = np.random.PCG64(np.random.SeedSequence([seed, epoch]))
            order = np.random.Generator(bits).permutation(self._size)
            with self._lock:
                self._orders[epoch] = order
                while len(self._orders) > _PERMUTATIONS_KEPT:
                    del self._orders[min(self._orders)]
        return order

    def __call__(self, index: int) -> Any:
        if self.num_batches is not None and index >= self.num_batches:
            raise IndexError(index)
        start = index * self._batch_size
        stop = start + self._batch_size
        if self._total is not None:
            stop = min(stop, self._total)
        positions = np.arange(start, stop, dtype=np.int64)
        epochs, rows = np.divmod(positions, self._size)
        if self.seed is not None:
            for epoch in np.unique(epochs):
                mask = epochs == epoch
                rows[mask] = self._order(int(epoch))[rows[mask]]
        return self._examples.take(rows)


def _grouper(
    examples: Iterable[Any], batch_size: int, num_epochs: int | None, allow_smaller: bool
) -> Callable[[int], Iterator[Any]]:
    def batches_from(start: int) -> Iterator[Any]:
        skip = start * batch_size
        group: list[Any] = []
        epoch = 0
        while num_epochs is None or epoch < num_epochs:
            seen = False
            for example in examples:
                seen = True
                if skip:
                    skip -= 1
                    continue
                group.append(example)
                if len(group) == batch_size:
                    yield _stack(group, "batch")
                    group = []
            if not seen:
                break
            epoch += 1
        if group and allow_smaller:
            yield _stack(group, "batch")

    return batches_from
