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


async def test_threads_created_unstarted_run_once_started_and_are_not_created_twice() -> None:
    queue = data.FIFOQueue(capacity=4)
    items = iter(range(3))

    def next_item() -> int:
        return next(items)  # StopIteration ends the thread, as OutOfRangeError does

    runner = data.QueueRunner(queue, [next_item], name="r")
    async with monitored.MonitoredSession() as sess:
        threads = runner.create_threads(sess, daemon=True)
        assert [t.name for t in threads] == ["QueueRunner r thread 0"]
        assert threads[0].daemon
        assert not threads[0].is_alive()
        assert runner.create_threads(sess, start=True) == []  # already made for this session
        threads[0].start()
        assert await queue.dequeue_many(3) == [0, 1, 2]
        with pytest.raises(monitored.OutOfRangeError, match="closed and empty"):
            await queue.dequeue()
        assert threads[0] in sess.coord.registered_threads
    assert not threads[0].is_alive()


async def test_a_runner_can_run_again_under_another_coordinator() -> None:
    queue = data.FIFOQueue(capacity=8)
    runner = data.QueueRunner(queue, [counter(2)])
    first, second = monitored.Coordinator(), monitored.Coordinator()
    (thread,) = runner.create_threads(coord=first, start=True)
    thread.join()
    assert runner.create_threads(coord=first) != []  # the first run has ended
    assert runner.create_threads(coord=second) != []


def test_bad_queue_runner_arguments_are_refused() -> None:
    queue = data.FIFOQueue(capacity=1)
    with pytest.raises(ValueError, match="at least one enqueue function"):
        data.QueueRunner(queue, [])
    with pytest.raises(ValueError, match="needs a session or a coordinator"):
        data.QueueRunner(queue, [counter(1)]).create_threads()


def test_an_enqueue_on_a_full_queue_gives_up_on_a_stop_request() -> None:
    queue = data.FIFOQueue(capacity=1, name="full")
    queue.enqueue(0)
    with pytest.raises(data.QueueClosedError, match="queue 'full': stop requested"):
        queue.enqueue(1, stop=lambda: True)
    assert queue.size() == 1


async def test_closing_with_cancel_pending_enqueues_drops_the_waiting_items() -> None:
    queue = data.FIFOQueue(capacity=3)
    queue.enqueue(1)
    queue.enqueue(2)
    queue.close(cancel_pending_enqueues=True)
    assert queue.closed
    assert queue.size() == 0
    with pytest.raises(monitored.OutOfRangeError):
        await queue.dequeue_many(1)
