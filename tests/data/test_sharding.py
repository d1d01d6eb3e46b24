"""shard: disjoint parts that together cover the input."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from monitored import data


async def drain(pipeline: data.Pipeline) -> list[Any]:
    async with pipeline:
        return [b async for b in pipeline]


def test_arrays_are_split_into_strided_views_that_cover_them() -> None:
    x = {"x": np.arange(10), "y": np.arange(10) * 2}
    parts = [data.shard(x, 3, i) for i in range(3)]
    assert parts[1]["x"].tolist() == [1, 4, 7]
    assert parts[1]["y"].tolist() == [2, 8, 14]
    assert sorted(np.concatenate([p["x"] for p in parts]).tolist()) == list(range(10))
    assert np.shares_memory(parts[0]["x"], x["x"])


def test_sequences_iterables_and_index_functions_are_sharded() -> None:
    assert list(data.shard(list("abcdefg"), 2, 1)) == ["b", "d", "f"]
    assert len(data.shard(list("abcdefg"), 2, 0)) == 4

    def stream() -> Iterator[int]:
        yield from range(7)

    assert list(data.shard(stream(), 3, 2)) == [2, 5]
    assert data.shard(lambda i: i, 4, 3)(2) == 11


def test_a_list_of_batches_is_split_by_batch_and_a_tuple_of_arrays_by_row() -> None:
    # prefetch reads a list item by item, so shard splits a list into its items even
    # when they are arrays; a structure of examples is a tuple (or a dict).
    batches = [np.full(4, i) for i in range(5)]
    part = data.shard(batches, 2, 1)
    assert [int(b[0]) for b in part] == [1, 3]
    assert all(b.shape == (4,) for b in part)
    x, y = np.arange(6), np.arange(6) * 10
    rows = data.shard((x, y), 2, 1)
    assert rows[0].tolist() == [1, 3, 5]
    assert rows[1].tolist() == [10, 30, 50]


async def test_sharded_shuffle_batches_of_two_processes_are_disjoint() -> None:
    seen = []
    for index in range(2):
        part = data.shard(np.arange(20), 2, index)
        pipeline = data.shuffle_batch(
            part, 5, capacity=10, min_after_dequeue=2, seed=0, enqueue_many=True, num_epochs=1
        )
        seen.append(set(np.concatenate(await drain(pipeline)).tolist()))
    assert seen[0].isdisjoint(seen[1])
    assert seen[0] | seen[1] == set(range(20))


def test_bad_shards_are_refused() -> None:
    with pytest.raises(ValueError, match=r"shard index must be in \[0, 2\), got 2"):
        data.shard(np.arange(4), 2, 2)
    with pytest.raises(ValueError, match="num_shards must be an int >= 1"):
        data.shard(np.arange(4), 0, 0)


def test_batching_a_shard_of_a_list_by_rows_says_to_shard_a_tuple() -> None:
    x, y = np.arange(6), np.arange(6) * 10
    with pytest.raises(TypeError, match=r"data.shard splits a list by item .* shard a tuple"):
        data.batch(data.shard([x, y], 2, 0), 2, enqueue_many=True)


def test_pipelines_of_the_shards_of_one_source_have_one_name_on_every_process() -> None:
    # A worker takes the chief's position by the pipeline's name: it must not
    # depend on the shard index.
    def load(i: int) -> np.ndarray:
        return np.full(2, i)

    def stream() -> Iterator[np.ndarray]:
        yield from (np.full(2, i) for i in range(4))

    class Stream:
        def __iter__(self) -> Iterator[np.ndarray]:
            return stream()

    for source, name in [([np.zeros(2)] * 4, "list"), (load, "load"), (Stream(), "Stream")]:
        names = {data.prefetch(data.shard(source, 3, i)).name for i in range(3)}
        assert names == {name}
