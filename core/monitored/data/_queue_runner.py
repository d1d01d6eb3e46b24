"""TF1's ``QueueRunner``, ``add_queue_runner`` and ``start_queue_runners``.

For code ported from TF1 that fills a queue from threads: a ``FIFOQueue`` that
threads enqueue into (blocking when full) and the step loop dequeues from with
``await``; a ``QueueRunner`` runs one thread per enqueue function under the
session's :class:`~monitored.Coordinator`. New code is better served by
:func:`~monitored.data.prefetch`, which orders batches by index and resumes
exactly; a queue's order depends on thread timing.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.from_thread
import anyio.lowlevel

from .._core._coordinator import END_OF_INPUT
from .._core._errors import OutOfRangeError
from ._errors import QueueClosedError
from ._wake import LoopWaker

if TYPE_CHECKING:
    from .._core._coordinator import Coordinator
    from .._core._session import MonitoredSession

__all__ = ["FIFOQueue", "QueueRunner", "add_queue_runner", "start_queue_runners"]

#: TF1's ``tf.GraphKeys.QUEUE_RUNNERS``.
QUEUE_RUNNERS: Final = "queue_runners"
#: How often a thread blocked on a full queue checks for a stop request.
_STOP_POLL_SECS: Final = 0.05

_collections: dict[str, list[QueueRunner]] = collections.defaultdict(list)


class FIFOQueue:
    """A bounded first-in first-out queue between producer threads and the step loop.

    ``enqueue`` (from threads) blocks while the queue is full; ``await dequeue()``
    waits while it is empty. Once closed, enqueues raise
    :class:`~monitored.data.QueueClosedError` and dequeues drain what is left,
    then raise ``OutOfRangeError`` (an end of input for the session).
    """

    def __init__(self, capacity: int, name: str = "fifo_queue") -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.name = name
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        #: The dequeuing task's event, and how to set it from a thread.
        self._waiter: tuple[anyio.Event, LoopWaker] | None = None

    def size(self) -> int:
        """How many items wait."""
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def enqueue(self, item: Any, stop: Callable[[], bool] | None = None) -> None:
        """Put ``item`` at the end, waiting while full (until ``stop()`` is true)."""
        with self._cond:
            while len(self._items) >= self.capacity and not self._closed:
                if stop is not None and stop():
                    raise QueueClosedError(f"queue {self.name!r}: stop requested")
                self._cond.wait(_STOP_POLL_SECS)
            if self._closed:
                raise QueueClosedError(f"queue {self.name!r} is closed")
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        _wake(waiter)

    def close(self, cancel_pending_enqueues: bool = False) -> None:
        """Refuse further items; ``cancel_pending_enqueues`` also drops waiting ones."""
        with self._cond:
            self._closed = True
            if cancel_pending_enqueues:
                self._items.clear()
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        _wake(waiter)

    async def dequeue(self) -> Any:
        """The first item, waiting for one; ``OutOfRangeError`` once closed and empty."""
        while True:
            with self._cond:
                if self._items:
                    item = self._items.popleft()
                    self._cond.notify()
                    return item
                if self._closed:
                    raise OutOfRangeError(f"queue {self.name!r} is closed and empty")
                event = anyio.Event()
                self._waiter = (event, LoopWaker())
            await event.wait()

    async def dequeue_many(self, n: int) -> list[Any]:
        """The next ``n`` items (``OutOfRangeError`` if the queue closes before)."""
        return [await self.dequeue() for _ in range(n)]


def _wake(waiter: tuple[anyio.Event, LoopWaker] | None) -> None:
    if waiter is not None:
        waiter[1].set(waiter[0])


class QueueRunner:
    """Runs ``enqueue_fns`` in threads, each putting what it returns into ``queue``.

    TF1's ``tf.train.QueueRunner(queue, enqueue_ops)``: an enqueue function
    returns the next item; ``OutOfRangeError`` or ``StopIteration`` ends its
    thread, and the queue is closed when every thread has ended (so the step
    loop sees the end of input). Any other exception requests a stop of the
    coordinator, carrying it (raised from the next step), and is kept in
    :attr:`exceptions_raised`.
    """

    def __init__(
        self, queue: FIFOQueue, enqueue_fns: Iterable[Callable[[], Any]], name: str | None = None
    ) -> None:
        self.queue = queue
        self.enqueue_fns = list(enqueue_fns)
        if not self.enqueue_fns:
            raise ValueError("QueueRunner needs at least one enqueue function")
        self.name = name or queue.name
        self.exceptions_raised: list[BaseException] = []
        self._lock = threading.Lock()
        self._running = 0
        #: Threads of this runner still running, per session (TF1's key), else per
        #: coordinator when only one is given.
        self._runs: dict[object, int] = {}

    def create_threads(
        self,
        sess: MonitoredSession | None = None,
        coord: Coordinator | None = None,
        daemon: bool = False,
        start: bool = False,
    ) -> list[threading.Thread]:
        """One thread per enqueue function, registered with ``coord`` (default:
        the session's), started when ``start``.

        As in TF1, ``[]`` when this runner's threads already run for that
        session (a second call does not start them twice); another session
        gets threads of its own, even under the same coordinator.
        """
        _check_session(sess, "QueueRunner.create_threads")
        if coord is None:
            if sess is None:
                raise ValueError("create_threads needs a session or a coordinator")
            coord = sess.coord
        key: object = sess if sess is not None else coord
        with self._lock:
            if self._runs.get(key):
                return []
            self._runs[key] = len(self.enqueue_fns)
            self._running += len(self.enqueue_fns)
        threads = []
        for i, fn in enumerate(self.enqueue_fns):
            thread = threading.Thread(
                target=self._run,
                args=(coord, fn, key),
                name=f"QueueRunner {self.name} thread {i}",
                daemon=daemon,
            )
            coord.register_thread(thread)
            threads.append(thread)
            if start:
                thread.start()
        return threads

    def _run(self, coord: Coordinator, fn: Callable[[], Any], key: object) -> None:
        try:
            while not coord.should_stop():
                try:
                    item = fn()
                except END_OF_INPUT:
                    return
                try:
                    self.queue.enqueue(item, stop=coord.should_stop)
                except QueueClosedError:
                    return
        except Exception as exc:
            self.exceptions_raised.append(exc)
            coord.request_stop(exc)
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
                left = self._runs.pop(key) - 1
                if left:
                    self._runs[key] = left
            if last or coord.should_stop():
                self.queue.close(cancel_pending_enqueues=coord.should_stop())


def add_queue_runner(qr: QueueRunner, collection: str = QUEUE_RUNNERS) -> None:
    """Add ``qr`` to ``collection``, for :func:`start_queue_runners` (TF1's graph collection)."""
    _collections[collection].append(qr)


def start_queue_runners(
    sess: MonitoredSession | None = None,
    coord: Coordinator | None = None,
    daemon: bool = True,
    start: bool = True,
    collection: str = QUEUE_RUNNERS,
) -> list[threading.Thread]:
    """Start the threads of every queue runner added to ``collection``; return them.

    The runners are taken out of the collection, so a second session does not
    start them twice. ``sess`` is the :class:`~monitored.MonitoredSession` to
    feed (a ``TypeError`` otherwise), or ``None`` with a ``coord``.
    """
    _check_session(sess, "start_queue_runners")
    runners = _collections.pop(collection, [])
    threads: list[threading.Thread] = []
    for qr in runners:
        threads += qr.create_threads(sess, coord=coord, daemon=daemon, start=start)
    return threads


def _check_session(sess: object, where: str) -> None:
    """Refuse what is not a session (TF1: ``sess must be a tf.Session``), naming it."""
    if sess is not None and not hasattr(sess, "coord"):
        raise TypeError(
            f"{where}: sess must be a monitored session (MonitoredSession, "
            f"MonitoredTrainingSession, a Supervisor's managed session) or None with a "
            f"coord; got {type(sess).__name__}"
        )
