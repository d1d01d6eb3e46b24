"""TensorFlow's ``queue_runner_test.py``, ported to ``monitored.data.QueueRunner``.

TF's enqueue ops become enqueue functions: ``var.count_up_to(3)`` is a counter
that raises ``OutOfRangeError`` once it reaches 3; an op not in the graph is a
function raising ``ValueError("Operation not in the graph")``. TF's session
becomes a :class:`~monitored.MonitoredSession` (its coordinator is the default
one, as TF's threads have none); TF's ``q0.dequeue()`` read by a runner thread
is a standard-library queue, closed by a sentinel.
"""

from __future__ import annotations

import queue as stdlib_queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import monitored
from monitored import Coordinator, MonitoredSession, OutOfRangeError, TrainState
from monitored.data import (
    FIFOQueue,
    QueueRunner,
    _queue_runner,
    add_queue_runner,
    start_queue_runners,
)


@pytest.fixture(autouse=True)
def _empty_collection() -> Iterator[None]:
    """TF's tests each build a graph: its ``QUEUE_RUNNERS`` collection starts empty."""
    _queue_runner._collections.clear()
    yield
    _queue_runner._collections.clear()


class CountUpTo:
    """TF's ``var.count_up_to(limit)``: returns the value and adds one; at ``limit``,
    ``OutOfRangeError``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.value = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            if self.value >= self.limit:
                raise OutOfRangeError(f"Reached limit of {self.limit}")
            self.value += 1
            return self.value - 1


def mock_op(name: str) -> Callable[[], Any]:
    """TF's ``_MockOp(name)``: an op not in the graph."""

    def run() -> Any:
        raise ValueError(f"Operation not in the graph: {name}")

    return run


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()


def session() -> MonitoredSession:
    return MonitoredSession(TrainState())


def test_QueueRunnerTest_testBasic() -> None:
    var = CountUpTo(3)
    qr = QueueRunner(FIFOQueue(10), [var])
    threads = qr.create_threads(session())
    assert len(threads) == 1
    for t in threads:
        t.start()
    join(threads)
    assert len(qr.exceptions_raised) == 0
    assert var.value == 3


def test_QueueRunnerTest_testTwoOps() -> None:
    """A runner always enqueues what its function returns (a deliberate difference:
    TF's ``count_up_to`` ops enqueue nothing), so the queue holds the 33 values."""
    var0, var1 = CountUpTo(3), CountUpTo(30)
    qr = QueueRunner(FIFOQueue(33), [var0, var1])
    threads = qr.create_threads(session())
    assert len(threads) == 2
    for t in threads:
        t.start()
    join(threads)
    assert len(qr.exceptions_raised) == 0
    assert var0.value == 3
    assert var1.value == 30


def test_QueueRunnerTest_testExceptionsCaptured() -> None:
    """Deliberate difference: the runners share the session's coordinator, and the
    first failure stops the others (TF's threads without a coordinator run on): a
    thread that sees the stop first ends without calling its function. Each failure
    is captured, as in TF."""
    qr = QueueRunner(FIFOQueue(10), [mock_op("i fail"), mock_op("so fail")])
    sess = session()
    threads = qr.create_threads(sess)
    for t in threads:
        t.start()
    join(threads)
    exceptions = qr.exceptions_raised
    assert 1 <= len(exceptions) <= 2
    assert all("Operation not in the graph" in str(e) for e in exceptions)
    assert sess.coord.exception is exceptions[0]


async def test_QueueRunnerTest_testRealDequeueEnqueue() -> None:
    q0: stdlib_queue.Queue[float | None] = stdlib_queue.Queue(3)
    closed = None  # q0.close()

    def enqueue1() -> float:
        item = q0.get()
        if item is closed:
            raise OutOfRangeError("queue q0 is closed")
        return item

    q1 = FIFOQueue(30)
    qr = QueueRunner(q1, [enqueue1])
    threads = qr.create_threads(session())
    for t in threads:
        t.start()
    # Enqueue 2 values, then close q0.
    q0.put(10.0)
    q0.put(10.0)
    q0.put(closed)
    join(threads)
    # It terminated cleanly.
    assert len(qr.exceptions_raised) == 0
    # The 2 values are in q1.
    assert await q1.dequeue() == 10.0
    assert await q1.dequeue() == 10.0
    # And q1 is now closed.
    with pytest.raises(OutOfRangeError, match="is closed"):
        await q1.dequeue()


async def test_QueueRunnerTest_testRespectCoordShouldStop() -> None:
    var = CountUpTo(3)
    qr = QueueRunner(FIFOQueue(10), [var])
    # The coordinator is asked to stop: the runner ends at once.
    coord = Coordinator()
    coord.request_stop()
    threads = qr.create_threads(session(), coord)
    for t in threads:
        t.start()
    await coord.join()
    assert len(qr.exceptions_raised) == 0
    assert var.value == 0


async def test_QueueRunnerTest_testRequestStopOnException() -> None:
    qr = QueueRunner(FIFOQueue(10), [mock_op("not an op")])
    coord = Coordinator()
    threads = qr.create_threads(session(), coord)
    for t in threads:
        t.start()
    # The exception is raised again by join.
    with pytest.raises(ValueError, match="Operation not in the graph"):
        await coord.join()


async def test_QueueRunnerTest_testGracePeriod() -> None:
    # The enqueue blocks quickly.
    queue = FIFOQueue(2)
    qr = QueueRunner(queue, [lambda: 10.0])
    coord = Coordinator()
    qr.create_threads(session(), coord, start=True)
    # Dequeue one element, then request a stop.
    await queue.dequeue()
    coord.request_stop()
    # join returns: the stop closes the queue and ends the blocked enqueue.
    await coord.join(stop_grace_period_secs=1.0)


def test_QueueRunnerTest_testMultipleSessions() -> None:
    qr = QueueRunner(FIFOQueue(10), [CountUpTo(3)])
    coord = Coordinator()
    # The threads are not started.
    threads = qr.create_threads(session(), coord=coord)
    other_threads = qr.create_threads(session(), coord=coord)
    assert len(threads) == len(other_threads)


def test_QueueRunnerTest_testIgnoreMultiStarts() -> None:
    qr = QueueRunner(FIFOQueue(10), [CountUpTo(3)])
    coord = Coordinator()
    sess = session()
    threads = []
    # The threads are not started.
    threads.extend(qr.create_threads(sess, coord=coord))
    new_threads = qr.create_threads(sess, coord=coord)
    assert new_threads == []


def test_QueueRunnerTest_testThreads() -> None:
    """TF's thread names (``QueueRunnerThread-fifo_queue-CountUpTo:0``) name ops; here
    they name the runner and the function's index."""
    var = CountUpTo(3)
    qr = QueueRunner(FIFOQueue(10), [var, mock_op("bad_op")])
    sess = session()
    threads = qr.create_threads(sess, start=True)
    assert sorted(t.name for t in threads) == [
        "QueueRunner fifo_queue thread 0",
        "QueueRunner fifo_queue thread 1",
    ]
    join(threads)
    exceptions = qr.exceptions_raised
    assert len(exceptions) == 1
    assert "Operation not in the graph" in str(exceptions[0])

    threads = qr.create_threads(sess, start=True)
    join(threads)
    exceptions = qr.exceptions_raised
    assert len(exceptions) == 1
    assert "Operation not in the graph" in str(exceptions[0])


def test_QueueRunnerTest_testName() -> None:
    queue = FIFOQueue(10, name="scope/queue")
    qr = QueueRunner(queue, [lambda: None])
    assert qr.name == "scope/queue"
    add_queue_runner(qr)
    assert len(_queue_runner._collections[_queue_runner.QUEUE_RUNNERS]) == 1


def test_QueueRunnerTest_testStartQueueRunners() -> None:
    var = CountUpTo(3)
    qr = QueueRunner(FIFOQueue(10), [var])
    add_queue_runner(qr)
    threads = start_queue_runners(session())
    join(threads)
    assert len(qr.exceptions_raised) == 0
    assert var.value == 3


def test_QueueRunnerTest_testStartQueueRunnersRaisesIfNotASession() -> None:
    add_queue_runner(QueueRunner(FIFOQueue(10), [CountUpTo(3)]))
    with pytest.raises(TypeError, match="sess must be a monitored session.*got str"):
        start_queue_runners("NotASession")  # type: ignore[arg-type]


def test_QueueRunnerTest_testStartQueueRunnersIgnoresMonitoredSession() -> None:
    """Deliberate difference: a ``MonitoredSession`` here does not start the collection's
    runners itself (TF's did, so its ``start_queue_runners`` returns ``[]`` for one);
    ``start_queue_runners(sess)`` on it is how they start."""
    var = CountUpTo(3)
    add_queue_runner(QueueRunner(FIFOQueue(10), [var]))
    threads = start_queue_runners(monitored.MonitoredSession(TrainState()))
    assert len(threads) == 1
    join(threads)
    assert var.value == 3
