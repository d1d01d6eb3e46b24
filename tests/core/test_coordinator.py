"""Coordinator: stop requests, exceptions, background tasks and threads."""

from __future__ import annotations

import threading
import time

import anyio
import anyio.lowlevel
import pytest

import monitored


def test_request_stop_records_the_first_exception_only() -> None:
    coord = monitored.Coordinator()
    assert not coord.should_stop()
    first, second = ValueError("first"), ValueError("second")
    coord.request_stop(first)
    coord.request_stop(second)
    assert coord.should_stop()
    assert coord.exception is first
    with pytest.raises(ValueError, match="first"):
        coord.raise_requested_exception()


@pytest.mark.parametrize(
    "end", [monitored.OutOfRangeError(), StopIteration(), StopAsyncIteration()]
)
def test_end_of_input_stops_without_an_exception(end: BaseException) -> None:
    coord = monitored.Coordinator()
    coord.request_stop(end)
    assert coord.should_stop()
    assert coord.exception is None
    coord.raise_requested_exception()


def test_clear_stop_forgets_the_request_and_exception() -> None:
    coord = monitored.Coordinator()
    coord.request_stop(ValueError())
    coord.clear_stop()
    assert not coord.should_stop()
    assert coord.exception is None


def test_stop_on_exception_turns_errors_into_a_stop() -> None:
    coord = monitored.Coordinator()
    with coord.stop_on_exception():
        raise KeyError("k")
    assert isinstance(coord.exception, KeyError)


async def test_wait_for_stop_times_out_then_sees_a_stop_from_a_thread() -> None:
    coord = monitored.Coordinator()
    assert await coord.wait_for_stop(0.01) is False
    threading.Timer(0.05, coord.request_stop).start()
    assert await coord.wait_for_stop(5) is True


async def test_join_waits_for_threads_and_raises_their_exception() -> None:
    coord = monitored.Coordinator()

    def worker() -> None:
        time.sleep(0.02)
        raise OSError("reader failed")

    coord.start_thread(worker, name="reader")
    with pytest.raises(OSError, match="reader failed"):
        await coord.join(stop_grace_period_secs=5)


async def test_join_names_threads_that_outlive_the_grace_period() -> None:
    coord = monitored.Coordinator()
    release = threading.Event()
    coord.start_thread(release.wait, 5, name="stuck-reader")
    coord.request_stop()
    with pytest.raises(RuntimeError, match="threads still running after 0.05s: stuck-reader"):
        await coord.join(stop_grace_period_secs=0.05)
    release.set()


async def test_join_ignores_live_threads_when_asked() -> None:
    coord = monitored.Coordinator()
    release = threading.Event()
    extra = threading.Thread(target=release.wait, args=(5,), daemon=True)
    extra.start()
    coord.request_stop()
    await coord.join([extra], stop_grace_period_secs=0.01, ignore_live_threads=True)
    release.set()


def test_start_soon_needs_an_open_session() -> None:
    async def noop() -> None:
        pass

    with pytest.raises(RuntimeError, match="needs an open session"):
        monitored.Coordinator().start_soon(noop)


async def test_background_tasks_are_cancelled_when_the_session_closes() -> None:
    cancelled = []

    async def forever() -> None:
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    class Starter:
        def after_create_session(self, coord: monitored.Coordinator) -> None:
            coord.start_soon(forever, name="forever")
            assert coord.running_tasks == 1  # counted as soon as it is started

    sess = monitored.MonitoredSession(hooks=[Starter()])
    start = time.monotonic()
    async with sess:
        await anyio.lowlevel.checkpoint()
        assert sess.coord.running_tasks == 1
    assert cancelled == [True]
    assert sess.coord.running_tasks == 0
    assert time.monotonic() - start < 5


async def test_join_waits_for_tasks_when_called_explicitly() -> None:
    finished = []

    async def quick() -> None:
        await anyio.sleep(0.01)
        finished.append(True)

    async with monitored.MonitoredSession() as sess:
        sess.coord.start_soon(quick)
        await anyio.lowlevel.checkpoint()
        sess.coord.request_stop()
        await sess.coord.join(stop_grace_period_secs=5)
        assert finished == [True]


async def test_start_soon_is_refused_once_the_session_is_closing() -> None:
    async def noop() -> None:
        pass

    class LateStarter:
        def end(self, session: monitored.MonitoredSession) -> None:
            session.coord.start_soon(noop)

    with pytest.raises(RuntimeError, match="not once the session is closing"):
        async with monitored.MonitoredSession(hooks=[LateStarter()]):
            pass


async def test_a_cancelled_wait_for_stop_leaves_no_thread_behind() -> None:
    coord = monitored.Coordinator()
    before = threading.active_count()
    for _ in range(5):
        with anyio.move_on_after(0.01):
            await coord.wait_for_stop()
    assert threading.active_count() <= before


def test_wake_waiters_calls_the_waiters_and_a_first_stop_wakes_them_once() -> None:
    """Waits for input (a prefetch pipeline's) are woken by ``wake_waiters`` and by
    the first ``request_stop``, from whatever thread calls it; removed ones are not."""
    coord = monitored.Coordinator()
    woken: list[str] = []
    remove = coord._on_wake(lambda: woken.append(threading.current_thread().name))
    coord.wake_waiters()
    assert woken == ["MainThread"]
    thread = threading.Thread(target=coord.request_stop, name="stopper")
    thread.start()
    thread.join()
    coord.request_stop()  # not the first: nothing new to look at
    assert woken == ["MainThread", "stopper"]
    remove()
    remove()  # twice is harmless
    coord.wake_waiters()
    assert woken == ["MainThread", "stopper"]
