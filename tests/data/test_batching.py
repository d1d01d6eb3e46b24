"""batch and shuffle_batch: TF1's argument meanings, determinism, epochs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import data


async def drain(pipeline: data.Pipeline) -> list[Any]:
    async with pipeline:
        return [b async for b in pipeline]


async def test_batch_groups_examples_in_order_and_drops_the_final_partial_batch() -> None:
    x, y = np.arange(10), np.arange(10) * 10
    out = await drain(data.batch((x, y), 4, enqueue_many=True, num_epochs=1))
    assert [b[0].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out[1][1].tolist() == [40, 50, 60, 70]


async def test_allow_smaller_final_batch_delivers_it_and_batches_cross_epochs() -> None:
    out = await drain(
        data.batch(np.arange(5), 3, enqueue_many=True, num_epochs=2, allow_smaller_final_batch=True)
    )
    assert [b.tolist() for b in out] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4]]


async def test_single_examples_are_stacked_on_a_new_axis() -> None:
    examples = [{"image": np.full((2, 2), i), "label": i} for i in range(6)]
    out = await drain(data.batch(examples, 3, num_epochs=1))
    assert out[0]["image"].shape == (3, 2, 2)
    assert out[1]["label"].tolist() == [3, 4, 5]


async def test_an_iterable_of_examples_is_batched_in_order() -> None:
    def stream() -> Iterator[np.ndarray]:
        for i in range(7):
            yield np.array([i, -i])

    out = await drain(data.batch(stream(), 3, num_epochs=1, allow_smaller_final_batch=True))
    assert [b[:, 0].tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("num_threads", [1, 4])
async def test_shuffle_batch_is_a_permutation_per_epoch_whatever_the_threads(
    num_threads: int,
) -> None:
    pipeline = data.shuffle_batch(
        np.arange(20),
        5,
        capacity=20,
        min_after_dequeue=5,
        num_threads=num_threads,
        seed=3,
        enqueue_many=True,
        num_epochs=2,
    )
    out = np.concatenate(await drain(pipeline))
    assert sorted(out[:20].tolist()) == list(range(20))
    assert sorted(out[20:].tolist()) == list(range(20))
    assert out[:20].tolist() != out[20:].tolist()
    reference = data.shuffle_batch(
        np.arange(20),
        5,
        capacity=20,
        min_after_dequeue=5,
        seed=3,
        enqueue_many=True,
        num_epochs=2,
    )
    assert np.concatenate(await drain(reference)).tolist() == out.tolist()


def test_tf1_argument_checks() -> None:
    with pytest.raises(ValueError, match="capacity 10 must be bigger than min_after_dequeue 10"):
        data.shuffle_batch(np.arange(4), 2, capacity=10, min_after_dequeue=10, enqueue_many=True)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        data.batch(np.arange(4), 0, enqueue_many=True)
    with pytest.raises(monitored.UnsupportedArgumentError, match="dynamic_pad"):
        data.batch(np.arange(4), 2, enqueue_many=True, dynamic_pad=True)
    with pytest.raises(ValueError, match=r"field \[1\] has 3, field \[0\] has 4"):
        data.batch((np.arange(4), np.arange(3)), 2, enqueue_many=True)
    with pytest.raises(TypeError, match="pass enqueue_many=True"):
        data.batch(np.arange(4), 2)
    with pytest.raises(TypeError, match="readable by index"):
        data.shuffle_batch(iter([np.zeros(1)]), 1, capacity=2, min_after_dequeue=1)
    with pytest.raises(ValueError, match="num_threads must be 1"):
        data.batch(iter([np.zeros(1)]), 1, num_threads=2)


def test_capacity_sets_the_buffer_in_batches() -> None:
    pipeline = data.batch(np.arange(100), 8, capacity=64, enqueue_many=True)
    assert "buffer_size=8" in repr(pipeline)


async def test_dict_examples_are_stacked_by_field_name_whatever_their_order() -> None:
    examples = [{"x": np.full(2, i), "y": np.int64(i)} for i in range(3)]
    examples[1] = {"y": np.int64(1), "x": np.full(2, 1)}
    (out,) = await drain(data.batch(examples, 3, num_epochs=1))
    assert out["x"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert out["y"].tolist() == [0, 1, 2]


async def test_an_example_with_other_fields_names_it() -> None:
    examples = [{"x": np.zeros(2)}, {"x": np.zeros(2), "z": np.zeros(2)}]
    with pytest.raises(data.ProducerError, match="example 1 of a batch has fields") as info:
        await drain(data.batch(examples, 2, num_epochs=1, name="recs"))
    assert isinstance(info.value.__cause__, TypeError)
