"""TensorFlow's ``coordinator_test.py``, ported to ``monitored.Coordinator``.

One test per TF test, named ``test_<TFClass>_<method>``, with TF's scenario and
assertions. ``Coordinator.join`` and ``wait_for_stop`` are coroutines here, so
the tests are async; the threads are real threads, as in TF.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

import monitored
from monitored import Coordinator, LooperThread


def stop_on_event(
    coord: Coordinator, wait_for_stop: threading.Event, done: threading.Event
) -> None:
    wait_for_stop.wait()
    coord.request_stop()
    done.set()


def raise_on_event(
    coord: Coordinator,
    wait_for_stop: threading.Event,
    done: threading.Event | None,
    ex: BaseException,
    report_exception: bool,
) -> None:
    try:
        wait_for_stop.wait()
        raise ex
    except (RuntimeError, ValueError, monitored.OutOfRangeError) as e:
        if report_exception:
            coord.request_stop(e)
        else:
            coord.request_stop(sys.exc_info())  # type: ignore[arg-type]
    finally:
        if done is not None:
            done.set()


def raise_on_event_using_context_handler(
    coord: Coordinator,
    wait_for_stop: threading.Event,
    done: threading.Event | None,
    ex: BaseException,
) -> None:
    with coord.stop_on_exception():
        wait_for_stop.wait()
        raise ex
    if done is not None:
        done.set()


def sleep_a_bit(n_secs: float, coord: Coordinator | None = None) -> None:
    if coord is not None:
        coord.register_thread(threading.current_thread())
    time.sleep(n_secs)


def wait_for_threads_to_register(coord: Coordinator, num_threads: int) -> None:
    while len(coord.registered_threads) != num_threads:
        time.sleep(0.001)


def start(threads: list[threading.Thread], daemon: bool = False) -> None:
    for t in threads:
        t.daemon = daemon
        t.start()


async def test_CoordinatorTest_testStopAPI() -> None:
    coord = Coordinator()
    assert not coord.should_stop()
    assert not await coord.wait_for_stop(0.01)
    coord.request_stop()
    assert coord.should_stop()
    assert await coord.wait_for_stop(0.01)


async def test_CoordinatorTest_testStopAsync() -> None:
    coord = Coordinator()
    assert not coord.should_stop()
    assert not await coord.wait_for_stop(0.1)
    wait_for_stop_ev, has_stopped_ev = threading.Event(), threading.Event()
    t = threading.Thread(target=stop_on_event, args=(coord, wait_for_stop_ev, has_stopped_ev))
    t.start()
    assert not coord.should_stop()
    assert not await coord.wait_for_stop(0.01)
    wait_for_stop_ev.set()
    has_stopped_ev.wait()
    assert await coord.wait_for_stop(0.05)
    assert coord.should_stop()


async def test_CoordinatorTest_testJoin() -> None:
    coord = Coordinator()
    threads = [threading.Thread(target=sleep_a_bit, args=(s,)) for s in (0.01, 0.02, 0.01)]
    start(threads)
    await coord.join(threads)
    assert not any(t.is_alive() for t in threads)


async def test_CoordinatorTest_testJoinAllRegistered() -> None:
    coord = Coordinator()
    threads = [threading.Thread(target=sleep_a_bit, args=(s, coord)) for s in (0.01, 0.02, 0.01)]
    start(threads)
    wait_for_threads_to_register(coord, 3)
    await coord.join()
    assert not any(t.is_alive() for t in threads)


async def test_CoordinatorTest_testJoinSomeRegistered() -> None:
    coord = Coordinator()
    threads = [
        threading.Thread(target=sleep_a_bit, args=(0.01, coord)),
        threading.Thread(target=sleep_a_bit, args=(0.02,)),
        threading.Thread(target=sleep_a_bit, args=(0.01, coord)),
    ]
    start(threads)
    wait_for_threads_to_register(coord, 2)
    # threads[1] is not registered: it must be passed in.
    await coord.join([threads[1]])
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("stop_grace_period", [1e-10, 0.002, 0.05])
async def test_CoordinatorTest_testJoinGraceExpires(stop_grace_period: float) -> None:
    # TF's last grace period is 1.0 s; 0.05 s keeps the suite fast, same scenario.
    coord = Coordinator()
    wait_for_stop_ev, has_stopped_ev = threading.Event(), threading.Event()
    release = threading.Event()
    threads = [
        threading.Thread(target=stop_on_event, args=(coord, wait_for_stop_ev, has_stopped_ev)),
        threading.Thread(target=release.wait, args=(10.0,)),
    ]
    start(threads, daemon=True)
    wait_for_stop_ev.set()
    has_stopped_ev.wait()
    try:
        with pytest.raises(RuntimeError, match="threads still running"):
            await coord.join(threads, stop_grace_period_secs=stop_grace_period)
    finally:
        release.set()


async def test_CoordinatorTest_testJoinWithoutGraceExpires() -> None:
    coord = Coordinator()
    wait_for_stop_ev, has_stopped_ev = threading.Event(), threading.Event()
    release = threading.Event()
    threads = [
        threading.Thread(target=stop_on_event, args=(coord, wait_for_stop_ev, has_stopped_ev)),
        threading.Thread(target=release.wait, args=(10.0,)),
    ]
    start(threads, daemon=True)
    wait_for_stop_ev.set()
    has_stopped_ev.wait()
    try:
        await coord.join(threads, stop_grace_period_secs=0.05, ignore_live_threads=True)
    finally:
        release.set()


def _two_raisers(coord: Coordinator, report_exception: bool) -> list[threading.Thread]:
    ev_1, ev_2 = threading.Event(), threading.Event()
    threads = [
        threading.Thread(
            target=raise_on_event,
            args=(coord, ev_1, ev_2, RuntimeError("First"), report_exception),
        ),
        threading.Thread(
            target=raise_on_event,
            args=(coord, ev_2, None, RuntimeError("Too late"), report_exception),
        ),
    ]
    start(threads)
    ev_1.set()
    return threads


async def test_CoordinatorTest_testJoinRaiseReportExcInfo() -> None:
    coord = Coordinator()
    threads = _two_raisers(coord, report_exception=False)
    with pytest.raises(RuntimeError, match="First"):
        await coord.join(threads)


async def test_CoordinatorTest_testJoinRaiseReportException() -> None:
    coord = Coordinator()
    threads = _two_raisers(coord, report_exception=True)
    with pytest.raises(RuntimeError, match="First"):
        await coord.join(threads)


async def test_CoordinatorTest_testJoinIgnoresOutOfRange() -> None:
    coord = Coordinator()
    ev_1 = threading.Event()
    threads = [
        threading.Thread(
            target=raise_on_event,
            args=(coord, ev_1, None, monitored.OutOfRangeError("First"), True),
        )
    ]
    start(threads)
    ev_1.set()
    await coord.join(threads)


async def test_CoordinatorTest_testJoinIgnoresMyExceptionType() -> None:
    coord = Coordinator(clean_stop_exception_types=(ValueError,))
    ev_1 = threading.Event()
    threads = [
        threading.Thread(
            target=raise_on_event, args=(coord, ev_1, None, ValueError("Clean stop"), True)
        )
    ]
    start(threads)
    ev_1.set()
    await coord.join(threads)


async def test_CoordinatorTest_testJoinRaiseReportExceptionUsingHandler() -> None:
    coord = Coordinator()
    ev_1, ev_2 = threading.Event(), threading.Event()
    threads = [
        threading.Thread(
            target=raise_on_event_using_context_handler,
            args=(coord, ev_1, ev_2, RuntimeError("First")),
        ),
        threading.Thread(
            target=raise_on_event_using_context_handler,
            args=(coord, ev_2, None, RuntimeError("Too late")),
        ),
    ]
    start(threads)
    ev_1.set()
    with pytest.raises(RuntimeError, match="First"):
        await coord.join(threads)


async def test_CoordinatorTest_testClearStopClearsExceptionToo() -> None:
    coord = Coordinator()
    ev_1 = threading.Event()
    threads = [
        threading.Thread(
            target=raise_on_event, args=(coord, ev_1, None, RuntimeError("First"), True)
        )
    ]
    start(threads)
    with pytest.raises(RuntimeError, match="First"):
        ev_1.set()
        await coord.join(threads)
    coord.clear_stop()
    threads = [
        threading.Thread(
            target=raise_on_event, args=(coord, ev_1, None, RuntimeError("Second"), True)
        )
    ]
    start(threads)
    with pytest.raises(RuntimeError, match="Second"):
        ev_1.set()
        await coord.join(threads)


async def _request_stop_raises_if_joined(report: Any) -> None:
    coord = Coordinator()
    await coord.join([])  # join right away
    reported = False
    with pytest.raises(RuntimeError, match="Too late"):
        try:
            raise RuntimeError("Too late")
        except RuntimeError as e:
            reported = True
            coord.request_stop(report(e))
    assert reported
    # After clear_stop, exceptions are handled normally again.
    coord.clear_stop()
    try:
        raise RuntimeError("After clear")
    except RuntimeError as e:
        coord.request_stop(report(e))
    with pytest.raises(RuntimeError, match="After clear"):
        await coord.join([])


async def test_CoordinatorTest_testRequestStopRaisesIfJoined() -> None:
    await _request_stop_raises_if_joined(lambda e: e)


async def test_CoordinatorTest_testRequestStopRaisesIfJoined_ExcInfo() -> None:
    await _request_stop_raises_if_joined(lambda e: sys.exc_info())


def _stop_at_0(coord: Coordinator, n: list[int]) -> None:
    if n[0] == 0:
        coord.request_stop()
    else:
        n[0] -= 1


async def test_LooperTest_testTargetArgs() -> None:
    n = [3]
    coord = Coordinator()
    thread = LooperThread.loop(coord, 0, target=_stop_at_0, args=(coord, n))
    await coord.join([thread])
    assert n[0] == 0


async def test_LooperTest_testTargetKwargs() -> None:
    n = [3]
    coord = Coordinator()
    thread = LooperThread.loop(coord, 0, target=_stop_at_0, kwargs={"coord": coord, "n": n})
    await coord.join([thread])
    assert n[0] == 0


async def test_LooperTest_testTargetMixedArgs() -> None:
    n = [3]
    coord = Coordinator()
    thread = LooperThread.loop(coord, 0, target=_stop_at_0, args=(coord,), kwargs={"n": n})
    await coord.join([thread])
    assert n[0] == 0
