"""prefetch: sources, order, backpressure, end of input, failures, closing."""

from __future__ import annotations

import logging
import queue
import random
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import monitored
from monitored import data


def batches(n: int) -> list[np.ndarray]:
    return [np.full(2, i, dtype=np.int64) for i in range(n)]


async def collect(pipeline: data.Pipeline) -> list[int]:
    async with pipeline:
        return [int(b[0]) async for b in pipeline]


def left_over(before: set[threading.Thread]) -> list[str]:
    """Threads started since ``before`` and still alive (anyio's idle worker pool,
    which other tests may have started, excepted)."""
    return [
        t.name for t in set(threading.enumerate()) - before if not t.name.startswith("AnyIO worker")
    ]


async def drain(pipeline: data.Pipeline) -> list[Any]:
    async with pipeline:
        return [b async for b in pipeline]


class Reiterable:
    """A source that can be read several times (one epoch per read)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(batches(self.n))


async def test_a_list_is_read_in_order_by_several_workers() -> None:
    assert await collect(data.prefetch(batches(7), num_workers=3)) == list(range(7))


async def test_order_does_not_depend_on_which_worker_is_faster() -> None:
    jitter = random.Random(0)

    def load(i: int) -> np.ndarray:
        if i >= 30:
            raise monitored.OutOfRangeError
        time.sleep(jitter.random() / 1000)
        return np.full(1, i)

    pipeline = data.prefetch(load, buffer_size=4, num_workers=4)
    assert await collect(pipeline) == list(range(30))


@pytest.mark.parametrize("threads", [True, False])
async def test_an_iterable_is_read_once_per_epoch(threads: bool) -> None:
    pipeline = data.prefetch(Reiterable(3), num_epochs=2, threads=threads)
    assert await collect(pipeline) == [0, 1, 2, 0, 1, 2]


async def test_an_async_iterable_runs_in_a_task() -> None:
    async def source() -> AsyncIterator[np.ndarray]:
        for b in batches(4):
            await anyio.lowlevel.checkpoint()
            yield b

    assert await collect(data.prefetch(source())) == [0, 1, 2, 3]


async def test_a_function_of_the_index_ends_with_index_error() -> None:
    table = batches(5)
    assert await collect(data.prefetch(lambda i: table[i], num_workers=2)) == list(range(5))


async def test_the_buffer_bounds_how_far_producers_run_ahead() -> None:
    made: list[int] = []

    def load(i: int) -> np.ndarray:
        made.append(i)
        return np.full(1, i)

    pipeline = data.prefetch(load, buffer_size=3, num_workers=2)
    async with pipeline:
        for consumed in range(1, 20):
            await pipeline.take()
            await anyio.sleep(0.001)  # give producers every chance to overrun
            assert max(made) < consumed + 3 + 2
    assert len(made) < 20 + 5


async def test_end_of_input_ends_the_session_normally_and_calls_end() -> None:
    ended: list[int] = []

    class Recorder:
        def end(self, session: monitored.MonitoredSession) -> None:
            ended.append(session.state.global_step)

    def step(state: monitored.TrainState, batch: np.ndarray) -> None:
        state.global_step += 1

    state = monitored.TrainState({"w": np.zeros(1)})
    pipeline = data.prefetch(batches(5), feed="batch")
    async with monitored.MonitoredSession(state, hooks=[pipeline, Recorder()]) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert state.global_step == 5
    assert ended == [5]


async def test_async_for_in_a_session_ends_the_loop_at_the_end_of_input() -> None:
    seen: list[int] = []

    def step(state: monitored.TrainState, batch: np.ndarray) -> None:
        seen.append(int(batch[0]))
        state.global_step += 1

    pipeline = data.prefetch(batches(4), num_epochs=2)
    async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
        async for batch in pipeline:
            await sess.run(step, batch)
    assert seen == [0, 1, 2, 3, 0, 1, 2, 3]


async def test_feed_none_spreads_dict_batches_as_keyword_arguments() -> None:
    got: list[tuple[int, int]] = []

    def step(state: monitored.TrainState, x: np.ndarray, y: np.ndarray) -> None:
        got.append((int(x[0]), int(y[0])))
        state.global_step += 1

    source = [{"x": np.full(1, i), "y": np.full(1, -i)} for i in range(3)]
    async with monitored.MonitoredSession(hooks=[data.prefetch(source, feed=None)]) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert got == [(0, 0), (1, -1), (2, -2)]


@pytest.mark.parametrize("threads", [True, False])
async def test_a_producer_error_is_raised_from_the_step_naming_source_and_batch(
    threads: bool, caplog: pytest.LogCaptureFixture
) -> None:
    def load(i: int) -> np.ndarray:
        if i == 3:
            raise KeyError("corrupt record")
        return np.full(1, i)

    steps: list[int] = []

    def step(state: monitored.TrainState, batch: np.ndarray) -> None:
        steps.append(int(batch[0]))
        state.global_step += 1

    pipeline = data.prefetch(load, num_workers=2 if threads else 1, threads=threads, feed="batch")
    with pytest.raises(data.ProducerError, match=r"'load'.*KeyError.*batch 3") as info:
        async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
            while not sess.should_stop():
                await sess.run(step)
    assert steps == [0, 1, 2]  # the batches before the failed one are not lost
    assert "before any step needed it" not in caplog.text
    assert info.value.index == 3
    assert info.value.source == "load"
    assert isinstance(info.value.__cause__, KeyError)


def test_closing_joins_the_worker_threads_no_thread_is_left() -> None:
    before = set(threading.enumerate())

    def load(i: int) -> np.ndarray:
        return np.full(1, i)  # never ends: the producers block on the full buffer

    async def main() -> None:
        pipeline = data.prefetch(load, buffer_size=2, num_workers=3, feed="batch")
        hooks: list[object] = [pipeline, monitored.StopAtStepHook(last_step=4)]
        async with monitored.MonitoredSession(hooks=hooks) as sess:
            while not sess.should_stop():
                await sess.run(
                    lambda state, batch: setattr(state, "global_step", 1 + int(batch[0]))
                )
            assert any(
                t.name.startswith("monitored.data load worker") for t in threading.enumerate()
            )

    anyio.run(main)
    assert left_over(before) == []


def test_a_failing_step_also_joins_the_worker_threads() -> None:
    before = set(threading.enumerate())

    async def main() -> None:
        pipeline = data.prefetch(lambda i: np.full(1, i), num_workers=2, feed="batch")
        async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
            await sess.run(lambda state, batch: None)
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        anyio.run(main)
    assert left_over(before) == []


async def test_a_producer_that_hangs_at_close_is_warned_with_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release, entered = threading.Event(), threading.Event()

    def stuck(i: int) -> np.ndarray:
        if i == 1:
            entered.set()
            release.wait()
        return np.full(1, i)

    pipeline = data.prefetch(stuck, name="stuck", stop_grace_period_secs=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="monitored"):
            async with pipeline:
                await pipeline.take()
                while not entered.is_set():  # noqa: ASYNC110 (set by a thread)
                    await anyio.sleep(0.001)
        assert "monitored.data stuck worker 0" in caplog.text
        assert "grace period" in caplog.text
    finally:
        release.set()


async def test_skipped_ranges_are_never_delivered() -> None:
    pipeline = data.prefetch(batches(10), num_workers=2)
    pipeline.skip(2, 4)
    async with pipeline:
        first = [int((await pipeline.take())[0]) for _ in range(3)]
        pipeline.skip(6, 8)  # batches already prefetched are dropped
        rest = [int(b[0]) async for b in pipeline]
    assert first + rest == [0, 1, 4, 5, 8, 9]
    assert pipeline.plugin_state()["skips"] == [[2, 4], [6, 8]]


async def test_a_batch_skipped_while_it_is_made_is_never_delivered() -> None:
    # The NaN guard's rollback: it skips batches a worker may be making.
    making_2, release, made = threading.Event(), threading.Event(), []

    def load(i: int) -> np.ndarray:
        made.append(i)
        if i == 2:
            making_2.set()
            release.wait()
        return np.full(1, i)

    pipeline = data.prefetch(load, buffer_size=2, name="race")
    async with pipeline:
        got = [int((await pipeline.take())[0])]
        while not making_2.is_set():  # noqa: ASYNC110 (set by the thread)
            await anyio.sleep(0.001)
        pipeline.skip(2, 3)
        release.set()
        while 3 not in made:  # noqa: ASYNC110 (batch 2 is deposited before 3 is claimed)
            await anyio.sleep(0.001)
        got += [int((await pipeline.take())[0]) for _ in range(3)]
    assert got == [0, 1, 3, 4]


async def test_skipping_the_batch_whose_producer_failed_resumes_after_it() -> None:
    def load(i: int) -> np.ndarray:
        if i == 2:
            raise RuntimeError("bad record")
        if i >= 6:
            raise IndexError(i)
        return np.full(1, i)

    pipeline = data.prefetch(load, buffer_size=2, name="bad")
    async with pipeline:
        got = [int((await pipeline.take())[0])]
        # The worker retires after the failure: nothing makes the batches after it.
        while any(t.name == "monitored.data bad worker 0" for t in threading.enumerate()):  # noqa: ASYNC110
            await anyio.sleep(0.001)
        pipeline.skip(2, 3)
        with anyio.fail_after(10):  # a hang guard, not a speed check
            got += [int(b[0]) async for b in pipeline]
    assert got == [0, 1, 3, 4, 5]


class CountingLock:
    """A lock that counts how often it is taken."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.taken += 1
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


async def test_a_long_skipped_range_is_passed_in_one_step() -> None:
    arrays = batches(4)
    pipeline = data.prefetch(lambda i: arrays[i % 4], name="long", threads=False)
    lock = CountingLock()
    pipeline._lock, pipeline._space = lock, threading.Condition(lock)  # type: ignore[assignment]
    pipeline.skip(0, 10**6)
    async with pipeline:
        assert int((await pipeline.take())[0]) == 10**6 % 4
        assert pipeline.next_index == 10**6 + 1
    assert lock.taken < 100  # not once per skipped index


async def test_taking_from_a_pipeline_that_was_not_started_says_how() -> None:
    with pytest.raises(RuntimeError, match=r"hooks=\[\.\.\.\] or use `async with pipeline:`"):
        await data.prefetch(batches(2)).take()


@pytest.mark.parametrize(
    ("batch", "field", "message"),
    [
        ([1, 2], "[0]", "is int, not a NumPy or CuPy array"),
        ({"x": np.zeros(2), "y": "label"}, "['y']", "is str"),
        (np.float32(1.0), "<batch>", "is float32"),
    ],
)
async def test_a_batch_that_is_not_arrays_names_batch_and_field(
    batch: Any, field: str, message: str
) -> None:
    pipeline = data.prefetch([batch], name="bad")
    with pytest.raises(data.BatchError, match=message) as info:
        await drain(pipeline)
    assert info.value.field == field
    assert info.value.index == 0
    assert "source 'bad': batch 0" in str(info.value)


async def test_a_batch_whose_structure_changes_names_batch_and_field() -> None:
    good = {"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int64)}
    dtype = {"x": np.zeros((2, 3), np.float64), "y": np.zeros(2, np.int64)}
    with pytest.raises(data.BatchError, match=r"batch 1, field \['x'\] is float64") as info:
        await drain(data.prefetch([good, dtype]))
    assert info.value.field == "['x']"
    with pytest.raises(
        data.BatchError,
        match=r"batch 2 has fields \['x'\], but batch 0 had \['x'\], \['y'\] \(field \['y'\]",
    ):
        await drain(data.prefetch([good, good, {"x": good["x"]}]))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="buffer_size must be an int >= 1, got 0"):
        data.prefetch(batches(2), buffer_size=0)
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        data.prefetch(batches(2), num_workers=0)
    with pytest.raises(ValueError, match="num_workers must be 1"):
        data.prefetch(Reiterable(2), num_workers=2)
    with pytest.raises(ValueError, match="iterator, which can be read only once"):
        data.prefetch(iter(batches(2)), num_epochs=2)
    with pytest.raises(TypeError, match="prefetch needs an iterable"):
        data.prefetch(3)  # type: ignore[arg-type]


def test_plugin_state_holds_the_position_and_detects_another_configuration() -> None:
    pipeline = data.prefetch(batches(4), num_epochs=3, name="p")
    assert pipeline.plugin_name == "input:p"
    saved = pipeline.plugin_state()
    assert saved["next"] == 0
    other = data.prefetch(batches(5), num_epochs=3, name="p")
    with pytest.raises(data.ResumeMismatchError, match=r"length=4 \(now 5\)"):
        other.load_plugin_state(saved)
    same = data.prefetch(batches(4), num_epochs=3, name="p")
    same.load_plugin_state({**saved, "next": 6})
    assert same.next_index == 6
    assert same.plugin_state()["epoch"] == 1
    assert same.plugin_state()["index_in_epoch"] == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("threads", [True, False])
def test_both_backends_feed_a_session_from_threads_and_tasks(backend: str, threads: bool) -> None:
    before = set(threading.enumerate())
    seen: list[int] = []

    def load(i: int) -> np.ndarray:
        if i >= 50:
            raise monitored.OutOfRangeError
        time.sleep(0.0005 if threads and i % 7 == 0 else 0)
        return np.full(1, i)

    def step(state: monitored.TrainState, batch: np.ndarray) -> None:
        seen.append(int(batch[0]))
        state.global_step += 1

    async def main() -> None:
        pipeline = data.prefetch(load, num_workers=3, threads=threads, feed="batch")
        async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
            while not sess.should_stop():
                await sess.run(step)

    anyio.run(main, backend=backend)
    assert seen == list(range(50))
    assert left_over(before) == []


async def test_loading_a_position_while_running_restarts_the_producers_there() -> None:
    pipeline = data.prefetch(batches(20), num_workers=2)
    async with pipeline:
        assert [int((await pipeline.take())[0]) for _ in range(3)] == [0, 1, 2]
        saved = pipeline.plugin_state()
        assert [int((await pipeline.take())[0]) for _ in range(4)] == [3, 4, 5, 6]
        pipeline.load_plugin_state(saved)  # a rollback to the earlier position
        pipeline.skip(3, 5)
        assert [int((await pipeline.take())[0]) for _ in range(3)] == [5, 6, 7]


async def test_a_recreated_session_restarts_the_pipeline_where_it_was() -> None:
    seen: list[int] = []
    failed = False

    def step(state: monitored.TrainState, batch: np.ndarray) -> None:
        nonlocal failed
        if int(batch[0]) == 4 and not failed:
            failed = True
            raise monitored.AbortedError("worker lost")
        seen.append(int(batch[0]))
        state.global_step += 1

    pipeline = data.prefetch(batches(8), num_workers=2, feed="batch")
    async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
        while not sess.should_stop():
            await sess.run(step)
    # The step that failed consumed batch 4; the retry takes the next one (as
    # TF1's dequeue would), and nothing is delivered twice.
    assert seen == [0, 1, 2, 3, 5, 6, 7]


async def test_a_failure_no_step_reached_is_logged_at_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def load(i: int) -> np.ndarray:
        if i == 2:
            raise OSError("bad sector")
        return np.full(1, i)

    pipeline = data.prefetch(load, name="disk", buffer_size=3)
    with caplog.at_level(logging.WARNING, logger="monitored"):
        async with pipeline:
            await pipeline.take()
            while pipeline._error is None:  # noqa: ASYNC110 (set by a thread)
                await anyio.sleep(0.001)
    assert "'disk': the source failed making batch 2 (OSError: bad sector)" in caplog.text


async def test_a_one_shot_iterator_cannot_be_rolled_back() -> None:
    pipeline = data.prefetch(iter(batches(6)), name="once")
    async with pipeline:
        assert int((await pipeline.take())[0]) == 0
        pipeline.load_plugin_state({**pipeline.plugin_state(), "next": 0})
        with pytest.raises(data.ProducerError, match="cannot go back to batch 0"):
            await pipeline.take()


async def test_a_feeding_pipeline_cannot_also_be_iterated() -> None:
    pipeline = data.prefetch(batches(3), feed="batch")
    async with pipeline:
        with pytest.raises(TypeError, match="feeds the step itself"):
            await pipeline.__anext__()


async def test_a_batch_turning_into_another_container_is_caught() -> None:
    first = (np.zeros(2), np.zeros(2))
    with pytest.raises(data.BatchError, match="batch 1 has fields"):
        await drain(data.prefetch([first, {"a": np.zeros(2)}], threads=False))
    with pytest.raises(data.BatchError, match=r"batch 1, field \[1\] is float32"):
        await drain(data.prefetch([first, (np.zeros(2), np.zeros(2, np.float32))]))


class Interrupt(BaseException):
    """Not an ``Exception``: like ``KeyboardInterrupt``, without stopping pytest."""


@pytest.mark.parametrize("threads", [True, False])
async def test_skipped_ranges_of_an_iterable_are_read_and_dropped(threads: bool) -> None:
    pipeline = data.prefetch(Reiterable(8), threads=threads)
    pipeline.skip(2, 4)
    assert await collect(pipeline) == [0, 1, 4, 5, 6, 7]


async def test_skipped_ranges_of_an_async_iterable_are_read_and_dropped() -> None:
    async def source() -> AsyncIterator[np.ndarray]:
        for b in batches(8):
            yield b

    pipeline = data.prefetch(source())
    pipeline.skip(0, 1)
    pipeline.skip(5, 7)
    assert await collect(pipeline) == [1, 2, 3, 4, 7]


async def test_a_bad_batch_from_an_async_iterable_names_batch_and_field() -> None:
    async def source() -> AsyncIterator[Any]:
        yield np.zeros(2)
        yield [np.zeros(2)]

    with pytest.raises(data.BatchError, match="batch 1 has fields") as info:
        await drain(data.prefetch(source(), name="aio"))
    assert info.value.index == 1


@pytest.mark.parametrize("kind", ["iterable", "function"])
async def test_thread_producers_of_a_fast_source_keep_order_and_bounds(kind: str) -> None:
    """The consumer makes a cheap batch itself when no thread has claimed it;
    threads and consumer share the claims, so nothing is made twice or out of
    order, and nothing runs ahead of the window."""
    n, buffer_size = 3000, 2
    made: list[int] = []

    def load(i: int) -> np.ndarray:
        if i >= n:
            raise IndexError(i)
        made.append(i)
        return np.full(1, i)

    source: Any = Reiterable(n) if kind == "iterable" else load
    workers = 1 if kind == "iterable" else 3
    pipeline = data.prefetch(source, buffer_size=buffer_size, num_workers=workers)
    got = []
    async with pipeline:
        async for batch in pipeline:
            got.append(int(batch[0]))
            if kind == "function":
                assert max(made) < len(got) + buffer_size + workers
    assert got == list(range(n))
    if kind == "function":
        assert sorted(made) == list(range(n))


async def test_a_batch_the_threads_have_not_reached_is_made_in_place_when_allowed() -> None:
    # The source is declared cheap, and the worker thread, once woken, cannot
    # take the GIL before the consumer blocks: batch 2 is the consumer's to make.
    made_by: dict[int, str] = {}
    arrays = batches(6)

    def load(i: int) -> np.ndarray:
        made_by[i] = threading.current_thread().name
        return arrays[i]

    pipeline = data.prefetch(load, buffer_size=1, name="cheap", in_place=True)
    async with pipeline:
        # Batches 0 and 1 fill the window; the thread then sleeps until space frees.
        while pipeline._sleepers == 0:  # noqa: ASYNC110 (set by the thread)
            await anyio.sleep(0.001)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(60.0)
        try:
            got = [int((await pipeline.take())[0]) for _ in range(3)]
        finally:
            sys.setswitchinterval(interval)
        rest = [int(b[0]) async for b in pipeline]
    assert got + rest == list(range(6))
    assert made_by[0] == made_by[1] == "monitored.data cheap worker 0"
    assert made_by[2] == threading.current_thread().name


async def test_a_slow_batch_is_never_made_on_the_event_loops_thread() -> None:
    made_by: set[str] = set()

    def load(i: int) -> np.ndarray:
        if i >= 40:
            raise IndexError(i)
        made_by.add(threading.current_thread().name)
        time.sleep(0.0002)  # far above the hand-off cost: worth a thread
        return np.full(1, i)

    got = await collect(data.prefetch(load, buffer_size=1, num_workers=2, name="slow"))
    assert got == list(range(40))
    assert made_by <= {"monitored.data slow worker 0", "monitored.data slow worker 1"}


class Indexed:
    """A sequence of the user's own: its items may be slow to make."""

    def __init__(self, load: Any, n: int) -> None:
        self.load, self.n = load, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.load(i)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["function", "iterable", "sequence"])
async def test_a_source_in_threads_is_never_called_on_the_event_loops_thread(kind: str) -> None:
    # Cheap batches, then a slow one: how long the next call takes cannot be
    # known from the last, so the step never makes one itself.
    loop_thread = threading.current_thread()
    on_loop: list[int] = []
    arrays = batches(200)

    def load(i: int) -> np.ndarray:
        if i >= 200:
            raise IndexError(i)
        if threading.current_thread() is loop_thread:
            on_loop.append(i)
        if i % 50 == 49:
            time.sleep(0.001)
        return arrays[i]

    def generate() -> Iterator[np.ndarray]:
        for i in range(200):
            yield load(i)

    class Source:
        def __iter__(self) -> Iterator[np.ndarray]:
            return generate()

    source: Any = {"function": load, "iterable": Source(), "sequence": Indexed(load, 200)}[kind]
    assert await collect(data.prefetch(source, name="cheap")) == list(range(200))
    assert on_loop == []


async def test_a_source_that_waits_for_the_event_loop_does_not_deadlock_it() -> None:
    # The source reads a queue that a task of the event loop fills, in bursts.
    items: queue.Queue[np.ndarray | None] = queue.Queue()

    class Source:
        def __iter__(self) -> Iterator[np.ndarray]:
            while (item := items.get(timeout=30)) is not None:  # never more than a hang guard
                yield item

    async def feed() -> None:
        for i in range(100):
            items.put(np.full(1, i))
            if i % 10 == 9:
                await anyio.sleep(0.001)
        items.put(None)

    got: list[int] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(feed)
        got = await collect(data.prefetch(Source(), name="queue"))
    assert got == list(range(100))


@pytest.mark.parametrize(
    ("source", "in_place"),
    [
        ([np.zeros(1)], True),
        ((np.zeros(1),), True),
        (np.zeros((3, 2)), True),
        (type("ListOfMine", (list,), {})([np.zeros(1)]), False),  # its [i] may do anything
        (Indexed(np.zeros, 3), False),
    ],
)
def test_only_sources_known_to_be_cheap_are_made_in_place_by_default(
    source: Any, in_place: bool
) -> None:
    assert data.prefetch(source)._in_place is in_place
    assert data.prefetch(source, in_place=not in_place)._in_place is not in_place


def test_in_place_does_not_apply_to_an_async_iterable() -> None:
    async def source() -> AsyncIterator[np.ndarray]:
        yield np.zeros(1)

    with pytest.raises(
        ValueError, match="source 'async_generator' is an async iterable.*in_place does not apply"
    ):
        data.prefetch(source(), in_place=True)


async def test_an_interrupt_raised_by_a_source_in_a_thread_is_its_failure() -> None:
    def load(i: int) -> np.ndarray:
        time.sleep(0.0002)  # made by the thread, not the consumer
        if i == 2:
            raise Interrupt("stop")
        return np.full(1, i)

    pipeline = data.prefetch(load, name="intr")
    got: list[int] = []
    with pytest.raises(data.ProducerError, match="'intr'.*Interrupt.*batch 2") as info:
        async with pipeline:
            async for batch in pipeline:
                got.append(int(batch[0]))
    assert got == [0, 1]
    assert isinstance(info.value.__cause__, Interrupt)


async def test_an_interrupt_on_the_event_loops_thread_propagates_and_is_recorded() -> None:
    def load(i: int) -> np.ndarray:
        if i == 1:
            raise Interrupt("ctrl-c")
        return np.full(1, i)

    pipeline = data.prefetch(load, threads=False, name="loop")
    async with pipeline:
        assert int((await pipeline.take())[0]) == 0
        with pytest.raises(Interrupt):
            await pipeline.take()
        # A loop that goes on anyway is told which batch was lost, not left hanging.
        with pytest.raises(data.ProducerError, match="batch 1") as info, anyio.fail_after(10):
            await pipeline.take()
    assert isinstance(info.value.__cause__, Interrupt)


async def test_an_interrupt_on_the_event_loops_thread_is_not_reported_as_the_sources_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def load(i: int) -> np.ndarray:
        if i == 1:
            raise Interrupt("ctrl-c")
        return np.full(1, i)

    pipeline = data.prefetch(load, threads=False, name="loop")
    with caplog.at_level(logging.WARNING, logger="monitored"), pytest.raises(Interrupt):
        async with pipeline:
            await pipeline.take()
            await pipeline.take()
    assert "failed making batch 1" not in caplog.text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"next": "3"}, "'next' is '3', not an index >= 0"),
        ({"next": -3}, "'next' is -3"),
        ({"next": True}, "'next' is True"),
        ({"next": 2.5}, "'next' is 2.5"),
        ({"next": None}, "'next' is None"),
        ({"skips": {"a": 1}}, "'skips' is a dict, not a list"),
        ({"skips": [[1]]}, r"the skipped range \[1\] is not \[start, stop\]"),
        ({"skips": [[5, 2]]}, r"the skipped range \[5, 2\]"),
        ({"skips": [[0, "9"]]}, r"the skipped range \[0, '9'\]"),
        ({"seed": -1}, "'seed' is -1, not an int >= 0"),
        ({"config": [1]}, "'config' is a list, not a mapping"),
        ({"next": "x" * 500}, r"'next' is 'xxx.*\.\.\., not"),
    ],
)
def test_a_damaged_saved_position_is_a_clear_error(change: dict[str, Any], message: str) -> None:
    saved = {**data.prefetch(batches(4), name="p").plugin_state(), **change}
    pipeline = data.prefetch(batches(4), name="p")
    with pytest.raises(data.InputStateError, match=rf"pipeline 'p'.*damaged: {message}"):
        pipeline.load_plugin_state(saved)
    assert pipeline.next_index == 0


def test_a_saved_position_without_next_or_not_a_mapping_is_a_clear_error() -> None:
    pipeline = data.prefetch(batches(4), name="p")
    saved = pipeline.plugin_state()
    del saved["next"]
    with pytest.raises(data.InputStateError, match="'next' .* is missing"):
        pipeline.load_plugin_state(saved)
    with pytest.raises(data.InputStateError, match="a list, not a mapping"):
        pipeline.load_plugin_state([0])  # type: ignore[arg-type]


async def test_a_damaged_position_in_a_checkpoint_stops_the_restore() -> None:
    pipeline = data.prefetch(batches(4), name="p", feed="batch")
    async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
        saved = await sess.plugin_states()
        saved["input:p"]["state"]["next"] = -1
        with pytest.raises(data.InputStateError, match="pipeline 'p'.*'next' is -1"):
            await sess.load_plugin_states(saved)
        assert pipeline.next_index == 0


async def test_dict_batches_may_list_their_fields_in_any_order() -> None:
    xy = {"x": np.zeros((2, 3)), "y": np.zeros(2, np.int64)}
    yx = {"y": np.ones(2, np.int64), "x": np.ones((2, 3))}
    got = await drain(data.prefetch([xy, yx, xy], name="st"))
    assert [int(b["y"][0]) for b in got] == [0, 1, 0]
    with pytest.raises(data.BatchError, match=r"batch 1, field \['x'\] is float32"):
        await drain(data.prefetch([xy, {"y": xy["y"], "x": xy["x"].astype(np.float32)}]))


async def test_one_worker_thread_means_one_call_of_the_source_at_a_time() -> None:
    # The source is declared cheap, so the consumer makes batches too; a loader
    # written for one worker (a shared file handle, say) must still never be
    # entered twice at once.
    active, most = 0, 0
    arrays = batches(300)

    def load(i: int) -> np.ndarray:
        nonlocal active, most
        active += 1
        most = max(most, active)
        time.sleep(0)  # lets the other thread run, were it inside too
        active -= 1
        return arrays[i]

    got = await collect(data.prefetch(load, buffer_size=2, name="one", in_place=True))
    assert got == list(range(300))
    assert most == 1


class _TwoProcesses:
    """A stand-in cluster of two: records this process's votes; the other process
    asks to stop once the global step reaches ``other_stops_at``."""

    is_chief = True

    def __init__(self, other_stops_at: int = 10**9) -> None:
        self.votes: list[tuple[int, bool]] = []
        self.other_stops_at = other_stops_at
        self.session: Any = None

    def agree_to_stop(self, local: bool) -> bool:
        step = self.session.state.global_step
        self.votes.append((step, local))
        return local or step >= self.other_stops_at

    async def share_state(self, session: Any, max_wait_secs: float) -> None:
        self.session = session
        session.state.initialized = True

    def fail(self, failure: BaseException) -> None:
        raise AssertionError(f"no process fails here: {failure!r}")

    def merge_metrics(self, metrics: Any) -> None:
        return None


def _count(state: monitored.TrainState, batch: np.ndarray) -> None:
    state.global_step += 1


@pytest.mark.parametrize("source", ["list", "generator", "async", "in_place", "tasks"])
async def test_with_other_processes_the_last_batchs_step_votes_to_stop(source: str) -> None:
    # The other processes would already be inside the next step (and its collectives)
    # when this one found no batch for it: the step of the last batch votes to stop.
    async def agen() -> AsyncIterator[np.ndarray]:
        for b in batches(5):
            yield b

    made = {
        "list": lambda: data.prefetch(batches(5), feed="batch"),
        "generator": lambda: data.prefetch((b for b in batches(5)), feed="batch"),
        "async": lambda: data.prefetch(agen(), feed="batch"),
        "in_place": lambda: data.prefetch((b for b in batches(5)), feed="batch", in_place=True),
        "tasks": lambda: data.prefetch(
            (b for b in batches(5)), feed="batch", threads=False, buffer_size=1
        ),
    }
    pipeline = made[source]()
    cluster = _TwoProcesses()
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        while not sess.should_stop():
            await sess.run(_count)
    assert sess.state.global_step == 5
    # One vote once the session is created, one before the first batch, then one at
    # the end of each step.
    assert cluster.votes == [
        (0, False),
        (0, False),
        (1, False),
        (2, False),
        (3, False),
        (4, False),
        (5, True),
    ]


async def test_with_other_processes_a_skipped_tail_is_the_end_too() -> None:
    pipeline = data.prefetch(batches(6), feed="batch")
    pipeline.skip(4, 6)
    cluster = _TwoProcesses()
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        while not sess.should_stop():
            await sess.run(_count)
    assert cluster.votes[-1] == (4, True)


async def test_with_other_processes_the_position_saved_is_the_next_steps_batch() -> None:
    # Looking ahead consumes nothing: a checkpoint after step 2 resumes at batch 2.
    pipeline = data.prefetch(batches(5), feed="batch")
    cluster = _TwoProcesses(other_stops_at=2)
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        while not sess.should_stop():
            await sess.run(_count)
        assert pipeline.plugin_state()["next"] == 2
    assert sess.state.global_step == 2


async def test_with_other_processes_a_producer_error_is_still_raised_by_the_next_step() -> None:
    def load(i: int) -> np.ndarray:
        if i == 2:
            raise OSError("disk gone")
        return np.zeros(2)

    pipeline = data.prefetch(load, feed="batch")
    cluster = _TwoProcesses()
    cluster.fail = lambda failure: None  # type: ignore[method-assign]
    with pytest.raises(data.ProducerError, match="disk gone"):
        async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
            while not sess.should_stop():
                await sess.run(_count)
    assert cluster.votes == [(0, False), (0, False), (1, False), (2, False)]


async def test_async_for_ends_when_every_process_agreed_to_stop() -> None:
    # The other process's input ended: this one stops at the same step and its
    # `async for` ends instead of handing out a batch no step may run.
    pipeline = data.prefetch(batches(8))
    cluster = _TwoProcesses(other_stops_at=3)
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        async for batch in pipeline:
            await sess.run(_count, batch)
        assert pipeline.plugin_state()["next"] == 3
    assert sess.state.global_step == 3


async def test_async_for_ends_when_a_hook_stops_the_session() -> None:
    pipeline = data.prefetch(batches(8))
    hooks = [pipeline, monitored.StopAtStepHook(last_step=3)]
    async with monitored.MonitoredSession(hooks=hooks) as sess:
        async for batch in pipeline:
            await sess.run(_count, batch)
    assert sess.state.global_step == 3


async def test_alone_the_end_of_input_is_still_the_next_steps_out_of_range() -> None:
    # TF1's behaviour, unchanged for one process: no look-ahead hook runs.
    pipeline = data.prefetch(batches(2), feed="batch")
    async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
        await sess.run(_count)
        await sess.run(_count)
        assert not sess.should_stop()
        with pytest.raises(monitored.OutOfRangeError, match="exhausted after 2 batches"):
            await sess.run(_count)
    assert sess.state.global_step == 2


class _Worker(_TwoProcesses):
    """A worker of two processes: the chief's pipeline state arrives at creation."""

    is_chief = False

    def __init__(self, chiefs: dict[str, Any]) -> None:
        super().__init__()
        self.chiefs = chiefs

    async def share_state(self, session: Any, max_wait_secs: float) -> None:
        await super().share_state(session, max_wait_secs)
        await session.load_plugin_states(self.chiefs)


async def test_a_worker_takes_the_chiefs_position_whatever_the_size_of_its_shard() -> None:
    chiefs_pipeline = data.prefetch(data.shard(batches(11), 2, 0), feed="batch")  # 6 batches
    chiefs_pipeline._next = 3
    pipeline = data.prefetch(data.shard(batches(11), 2, 1), feed="batch")  # 5 batches
    cluster = _Worker(
        {pipeline.plugin_name: {"version": 1, "state": chiefs_pipeline.plugin_state()}}
    )
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        seen = []
        while not sess.should_stop():
            await sess.run(lambda state, batch: seen.append(int(batch[0])))
    assert seen == [7, 9]


async def test_a_worker_refuses_a_chiefs_pipeline_configured_otherwise() -> None:
    chiefs = data.prefetch(batches(4), feed="batch", num_epochs=2)
    pipeline = data.prefetch(batches(4), feed="batch", num_epochs=1)
    cluster = _Worker({pipeline.plugin_name: {"version": 1, "state": chiefs.plugin_state()}})
    cluster.fail = lambda failure: None  # type: ignore[method-assign]
    with pytest.raises(
        data.ResumeMismatchError,
        match="the chief's pipeline of this name has another configuration: num_epochs=2",
    ):
        async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster):
            pass


@pytest.mark.parametrize("start", ["empty", "resumed_at_the_end"])
@pytest.mark.parametrize("feed", ["batch", False])
async def test_with_other_processes_nothing_left_to_read_stops_before_the_first_step(
    start: str, feed: str | bool
) -> None:
    # A job restarted at the end of its input, or a rank with an empty shard: before
    # the first batch the processes agree to stop; no step runs anywhere.
    pipeline = data.prefetch(batches(0 if start == "empty" else 4), feed=feed)
    if start == "resumed_at_the_end":
        pipeline.load_plugin_state({**pipeline.plugin_state(), "next": 4})
    cluster = _TwoProcesses()
    steps = []
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        if feed:
            while not sess.should_stop():
                await sess.run(lambda state, batch: steps.append(batch))
        else:
            async for batch in pipeline:
                await sess.run(lambda state, batch: steps.append(batch), batch)
        assert sess.should_stop()
    assert steps == []
    assert cluster.votes == [(0, False), (0, True)]  # created; before the first batch


async def test_with_other_processes_the_first_batch_may_come_from_what_the_loop_starts() -> None:
    # A source fed by a task started inside `async with` (queue runners, the
    # Supervisor's): nothing waits for its first batch before the loop runs.
    send, receive = anyio.create_memory_object_stream[np.ndarray](10)
    pipeline = data.prefetch(receive, feed="batch")
    cluster = _TwoProcesses()

    async def feeder() -> None:
        async with send:
            for b in batches(3):
                await send.send(b)

    with anyio.fail_after(10):
        async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
            sess.coord.start_soon(feeder)
            while not sess.should_stop():
                await sess.run(_count)
    receive.close()
    assert sess.state.global_step == 3
    assert cluster.votes == [(0, False), (0, False), (1, False), (2, False), (3, True)]


async def test_with_other_processes_no_look_ahead_once_a_stop_is_requested() -> None:
    # A stream the loop would feed after the step: looking for its next batch once
    # StopAtStepHook has asked to stop would wait forever.
    send, receive = anyio.create_memory_object_stream[np.ndarray](10)
    with send, receive:
        for b in batches(2):
            send.send_nowait(b)
        pipeline = data.prefetch(receive, feed="batch")
        cluster = _TwoProcesses()
        hooks = [pipeline, monitored.StopAtStepHook(last_step=2)]
        with anyio.fail_after(10):
            async with monitored.MonitoredSession(hooks=hooks, cluster=cluster) as sess:
                while not sess.should_stop():
                    await sess.run(_count)
    assert sess.state.global_step == 2


async def test_look_ahead_false_leaves_the_end_of_input_to_the_next_step() -> None:
    pipeline = data.prefetch(batches(2), feed="batch")
    pipeline.look_ahead = False
    cluster = _TwoProcesses()
    async with monitored.MonitoredSession(hooks=[pipeline], cluster=cluster) as sess:
        while not sess.should_stop():
            await sess.run(_count)
    # Steps 1 and 2 vote to go on; step 3 finds no batch (OutOfRangeError, a normal
    # end) and the close votes to stop.
    assert cluster.votes == [(0, False), (1, False), (2, False), (2, True)]


async def test_a_pipeline_used_on_its_own_after_its_session_reads_on() -> None:
    pipeline = data.prefetch(batches(5), feed=False)
    hooks = [pipeline, monitored.StopAtStepHook(last_step=2)]
    async with monitored.MonitoredSession(hooks=hooks) as sess:
        async for batch in pipeline:
            await sess.run(_count, batch)
    async with pipeline:
        assert [int(b[0]) async for b in pipeline] == [2, 3, 4]


async def test_two_pipelines_of_the_same_name_are_refused_saying_how_to_name_them() -> None:
    first, second = data.prefetch(batches(2)), data.prefetch(batches(3))
    with pytest.raises(monitored.PluginValidationError, match=r"'input:list' is already .*name="):
        async with monitored.MonitoredSession(hooks=[first, second]):
            pass  # pragma: no cover - refused on entry
