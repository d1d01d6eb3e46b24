"""TF1's QueueRunner, FIFOQueue, add_queue_runner and start_queue_runners."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

import monitored
from monitored import data


def own_threads() -> set[threading.Thread]:
    """Threads other than anyio's idle worker pool (the coordinator joins through it)."""
    return {t for t in threading.enumerate() if not t.name.startswith("AnyIO worker")}


def counter(stop: int) -> Callable[[], np.ndarray]:
    lock = threading.Lock()
    values = iter(range(stop))

    def next_value() -> np.ndarray:
        with lock:
            return np.full(1, next(values))

    return next_value


async def test_queue_runner_threads_fill_the_queue_until_the_input_ends() -> None:
    before = own_threads()
    queue = data.FIFOQueue(capacity=3)
    fn = counter(10)
    data.add_queue_runner(data.QueueRunner(queue, [fn, fn]))
    got: list[int] = []

    def step(state: monitored.TrainState, item: np.ndarray) -> None:
        got.append(int(item[0]))
        state.global_step += 1

    async with monitored.MonitoredSession() as sess:
        threads = data.start_queue_runners(sess)
        assert len(threads) == 2
        while not sess.should_stop():
            await sess.run(step, await queue.dequeue())  # OutOfRangeError ends the session
    assert sorted(got) == list(range(10))
    assert own_threads() - before == set()
    assert data.start_queue_runners(sess) == []  # the collection was emptied


async def test_an_enqueue_error_stops_the_session_and_is_raised() -> None:
    def broken() -> np.ndarray:
        raise OSError("disk gone")

    queue = data.FIFOQueue(capacity=2)
    runner = data.QueueRunner(queue, [broken])
    with pytest.raises(OSError, match="disk gone"):
        async with monitored.MonitoredSession() as sess:
            runner.create_threads(sess, start=True)
            await sess.coord.wait_for_stop()
            await sess.run(lambda state: None)
    assert isinstance(runner.exceptions_raised[0], OSError)


async def test_a_closed_queue_refuses_items_and_drains() -> None:
    queue = data.FIFOQueue(capacity=2, name="q")
    queue.enqueue(1)
    queue.close()
    with pytest.raises(data.QueueClosedError, match="queue 'q' is closed"):
        queue.enqueue(2)
    assert await queue.dequeue() == 1
    with pytest.raises(monitored.OutOfRangeError):
        await queue.dequeue()
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        data.FIFOQueue(0)
