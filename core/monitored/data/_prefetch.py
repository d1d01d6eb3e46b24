"""``prefetch``: batches made ahead of the step, in tasks or threads, resumable exactly.

Every batch has a global index (0, 1, 2, ... across epochs). Producers claim the
next index, make that batch and leave it in a reorder buffer; the consumer (the
step loop, through ``async for`` or the feeding hook) takes index after index.
So the order of batches never depends on which worker was faster, and the
position of the input is one integer: the index of the next batch a step will
consume. That integer (with the skipped ranges and the shuffle seed) is the
pipeline's plugin state, saved with each checkpoint at the step it was taken.

Backpressure: a producer may claim index ``g`` only while
``g < next + buffer_size + num_workers``, so at most ``buffer_size`` finished
batches wait, plus one in progress per worker; memory stays bounded.

Who makes a batch: workers (tasks or threads), and the consumer itself when
the batch it needs is not claimed yet and making it in place is safe. A sync
source in tasks runs on the loop's thread anyway. In threads, handing one
batch over costs a wake-up of the thread and one of the event loop (tens of
microseconds), more than indexing a list; but how long a call of any other
source takes cannot be known before it returns (the next one may read a
file, or wait for something only the event loop provides), so the consumer
makes batches in place only for sources known to be cheap and non-blocking:
built-in lists and tuples and NumPy arrays in memory, or a source its user
declared so (``in_place=True``). The consumer takes such a batch straight
away, without the reorder buffer. Claims go through one lock whoever claims,
so order, bounds and resume are the same.
"""

from __future__ import annotations

import collections.abc
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, final

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import numpy as np

from .._core._cluster import LocalCluster
from .._core._coordinator import END_OF_INPUT
from .._core._errors import OutOfRangeError
from .._core._run import SessionRunArgs
from ._errors import BatchError, InputStateError, ProducerError, ResumeMismatchError
from ._structure import Signature, check_batch, quick_signature
from ._wake import LoopWaker

if TYPE_CHECKING:
    from .._core._coordinator import Coordinator
    from .._core._run import SessionRunContext, SessionRunValues
    from .._core._session import MonitoredSession
    from ._staging import DeviceStager

__all__ = ["FeedingPipeline", "Pipeline", "pipelines", "prefetch"]

log = logging.getLogger("monitored")

_MISSING: Final = object()
_POLL_SECS: Final = 0.005
_DEFAULT_GRACE_SECS: Final = 120.0
#: Configuration entries that are the size of this process's shard of the data.
_SHARD_SIZE_KEYS: Final = ("length", "examples")

Spawn = Callable[..., Any]


class Pipeline:
    """An input pipeline: an async iterable of batches and a session hook.

    Made by :func:`prefetch`, :func:`~monitored.data.batch` or
    :func:`~monitored.data.shuffle_batch`. Pass it in ``hooks=[...]`` of the
    session: the session starts its producers when it is created, saves its
    position with every checkpoint and stops them when it closes. Outside a
    session, ``async with pipeline:`` starts and stops them.

    In a job of several processes (a ``cluster`` plugin such as
    ``monitored-mpi``), the pipeline looks for its next batch before its first
    batch is taken and at the end of every step, and votes to stop when there
    is none, so that every process stops after the same step. Set
    :attr:`look_ahead` to ``False`` for a source whose next batch only comes
    once the step has returned (one the training loop itself feeds): the
    end of its input on one process then leaves the others waiting.
    """

    #: Look for the next batch before each step is over (with several processes only).
    look_ahead: bool = True

    #: Version of the layout returned by ``plugin_state``.
    plugin_state_version = 1

    def __init__(
        self,
        *,
        name: str,
        load: Callable[[int], Any] | None = None,
        open_iter: Callable[[int], Iterator[Any] | AsyncIterator[Any]] | None = None,
        length: int | None = None,
        buffer_size: int = 2,
        num_workers: int = 1,
        threads: bool = True,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        epoch_length: int | None = None,
        device: bool = False,
        stop_grace_period_secs: float | None = None,
        check: bool = True,
        async_source: bool = False,
        in_place: bool = False,
    ) -> None:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        if (load is None) == (open_iter is None):
            raise TypeError("a Pipeline needs exactly one of load and open_iter")
        if open_iter is not None and num_workers > 1:
            raise ValueError(
                f"source {name!r} is read in order (an iterable): num_workers must be 1, got "
                f"{num_workers}; for parallel loading give a function of the batch index or "
                "a sequence"
            )
        #: The name of the source, used in errors and as the plugin name ``input:<name>``.
        self.name = name
        self.plugin_name = f"input:{name}"
        self._load = load
        self._open_iter = open_iter
        self._length = length
        self._buffer_size = buffer_size
        self._num_workers = num_workers
        self._threads = threads
        #: Batches are made by sync code in the event loop's thread (task producers).
        self._sync_in_loop = not threads and not async_source
        self._sync_iterable = open_iter is not None and not async_source
        #: The iterator of a sync source, for the producers of the current generation.
        self._reader: _Reader | None = None
        #: The consumer makes a batch no worker has claimed yet itself: a sync
        #: source in tasks runs on its thread anyway; one in threads does only
        #: when known to be cheap and never to wait (on the event loop, say).
        self._in_place = self._sync_in_loop or (threads and in_place)
        #: Worker threads waiting on ``_space`` and not yet woken.
        self._sleepers = 0
        self._window = buffer_size + num_workers
        self._half = self._window // 2
        self._config: dict[str, Any] = dict(config or {})
        self._seed = seed
        self._epoch_length = epoch_length
        self._grace = stop_grace_period_secs
        self._check = check
        self._stager: DeviceStager | None = None
        if device:
            from ._staging import DeviceStager

            # The host may queue about this many steps ahead of the GPU before a
            # pinned buffer set is reused (see _staging).
            self._stager = DeviceStager(slots=buffer_size + 2)
        # -- position (what a checkpoint saves) --
        self._next = 0
        self._skips: list[tuple[int, int]] = []
        # -- runtime, guarded by _lock --
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._gen = 0
        self._running = False
        self._claim = 0
        self._limit: int | None = length
        self._end: int | None = length
        self._error: tuple[int, BaseException] | None = None
        self._error_raised = False
        self._ready: dict[int, Any] = {}
        self._first: Signature | None = None
        #: ``quick_signature`` of the first batch: a batch that matches it is fine.
        self._quick: Any = None
        self._first_index = 0
        self._waiting: anyio.Event | None = None
        self._space_event: anyio.Event | None = None
        self._retire: anyio.Event | None = None
        self._waker: LoopWaker | None = None
        self._spawn: Spawn | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._consumed_by_iteration = False
        #: The session this pipeline is a hook of, and whether that session trains
        #: with other processes.
        self._session: MonitoredSession | None = None
        self._distributed = False
        #: Whether the agreement before this session's first batch was held.
        self._first_agreed = False
        #: Set by the coordinator's wake-up (a stop, a preemption signal): a wait
        #: for a batch then looks whether the session stops (``_stopping``).
        self._woken = False
        #: Removes this pipeline's wake-up from its session's coordinator.
        self._unwake: Callable[[], None] | None = None
        #: The signal that stopped the last session (``stopped_by_signal``), if any.
        self._preempted: str | None = None
        #: Threads inside a call of the source: thread ident -> the batch index.
        self._calling: dict[int, int] = {}

    # -- the position ----------------------------------------------------------------------
    @property
    def next_index(self) -> int:
        """The global index of the next batch a step will consume."""
        return self._next

    @property
    def seed(self) -> int | None:
        """The shuffle seed (drawn once when none was given, and saved in checkpoints)."""
        return self._seed

    def skip(self, start: int, stop: int) -> None:
        """Never deliver the batches with global indices in ``[start, stop)``.

        For a rollback (a NaN guard restores step *k* and skips the batches that
        led to the NaN). The ranges are saved with the position, so a resumed run
        skips them too.
        """
        if not 0 <= start <= stop:
            raise ValueError(f"skip needs 0 <= start <= stop, got [{start}, {stop})")
        if start == stop:
            return
        with self._lock:
            self._skips.append((start, stop))
            self._skips.sort()
            if self._running and start < self._claim:
                # Batches in progress are dropped when deposited (``_deposit``).
                self._ready = {g: b for g, b in self._ready.items() if not self._skipped(g)}
            # A failure in the range stopped the producers there: none would make
            # the batches after it, which are wanted now.
            restart = self._running and self._error is not None and start <= self._error[0] < stop
            if self._stager is not None:
                self._stager.clear()
        if restart:
            self._start()

    def _skipped(self, index: int) -> bool:
        return any(start <= index < stop for start, stop in self._skips)

    def _after_skips(self, index: int) -> int:
        for start, stop in self._skips:
            if start <= index < stop:
                index = stop
        return index

    # -- plugin state ----------------------------------------------------------------------
    def plugin_state(self) -> dict[str, Any]:
        """The position after the batches consumed so far (not those prefetched)."""
        saved: dict[str, Any] = {
            "next": self._next,
            "skips": [list(r) for r in self._skips],
            "config": self._config,
            "seed": self._seed,
        }
        if self._epoch_length:
            saved["epoch"], saved["index_in_epoch"] = divmod(self._next, self._epoch_length)
        return saved

    def load_plugin_state(self, state: Mapping[str, Any]) -> None:
        """Resume at the saved position; refuse a differently configured pipeline,
        and a damaged position (:class:`~monitored.data.InputStateError`)."""
        saved_config, position, skips, seed = self._read_saved(state)
        # In a job of several processes a worker receives the chief's position (every
        # process has consumed as many batches); the size of the chief's shard is not
        # this process's, so only the rest of the configuration must agree.
        shared = self._distributed and self._session is not None and not self._session.is_chief
        ignored = _SHARD_SIZE_KEYS if shared else ()
        keys = sorted((set(saved_config) | set(self._config)) - set(ignored))
        diffs = [
            f"{k}={saved_config.get(k, '<unset>')!r} (now {self._config.get(k, '<unset>')!r})"
            for k in keys
            if saved_config.get(k, _MISSING) != self._config.get(k, _MISSING)
        ]
        if diffs and shared:
            raise ResumeMismatchError(
                f"input pipeline {self.name!r}: the chief's pipeline of this name has another "
                f"configuration: {', '.join(diffs)}; every process of the job starts at "
                "the chief's position, so each must configure its pipeline of this name the "
                "same way (only the size of its shard may differ)"
            )
        if diffs:
            raise ResumeMismatchError(
                f"input pipeline {self.name!r}: the checkpoint was saved with another "
                f"configuration: {', '.join(diffs)}; resuming would feed other batches. Use "
                "the saved settings, or another pipeline name to start this input afresh"
            )
        if seed is not None:
            self._seed = seed
            self._reseed()
        with self._lock:
            self._next = position
            self._skips = skips
        if self._running:
            self._start()

    def _read_saved(
        self, state: object
    ) -> tuple[dict[str, Any], int, list[tuple[int, int]], int | None]:
        """``(config, next, skips, seed)`` of a saved state, checked: a checkpoint
        may have been damaged or written by someone else."""

        def damaged(what: str) -> InputStateError:
            return InputStateError(
                f"input pipeline {self.name!r}: the saved input position is damaged: {what}"
            )

        if not isinstance(state, Mapping):
            raise damaged(f"a {type(state).__name__}, not a mapping")
        config = state.get("config", {})
        if not isinstance(config, Mapping):
            raise damaged(f"'config' is a {type(config).__name__}, not a mapping")
        if "next" not in state:
            raise damaged("'next' (the index of the next batch) is missing")
        position = state["next"]
        if not _is_index(position):
            raise damaged(f"'next' is {_show(position)}, not an index >= 0")
        skips = state.get("skips", [])
        if not isinstance(skips, list):
            raise damaged(f"'skips' is a {type(skips).__name__}, not a list")
        ranges = []
        for entry in skips:
            if (
                not isinstance(entry, list | tuple)
                or len(entry) != 2
                or not all(_is_index(bound) for bound in entry)
                or entry[0] > entry[1]
            ):
                raise damaged(
                    f"the skipped range {_show(entry)} is not [start, stop] with 0 <= start <= stop"
                )
            ranges.append((int(entry[0]), int(entry[1])))
        seed = state.get("seed")
        if seed is not None and not _is_index(seed):
            raise damaged(f"'seed' is {_show(seed)}, not an int >= 0")
        return dict(config), int(position), sorted(ranges), seed

    def _reseed(self) -> None:
        """Subclass hook: the seed changed (restored from a checkpoint)."""

    # -- starting and stopping -------------------------------------------------------------
    def begin(self, session: MonitoredSession) -> None:
        """Note the session, and whether it trains with other processes."""
        self._session = session
        self._distributed = not isinstance(session.cluster, LocalCluster)
        self._first_agreed = False

    async def _stop_before_first_batch(self) -> bool:
        """With other processes, before this session's first batch: whether every
        process stops now because one of them has nothing to read (a run resumed at
        the end of its input, an empty shard).

        Held at the first take, once the loop runs (not when the session is
        created): a source may be fed by what the program starts after that.
        """
        self._first_agreed = True
        if not self._looks_ahead():
            return False
        assert self._session is not None
        exhausted = not await self._has_next()
        stopping = self._session.coord.should_stop()
        return self._session._agree_to_stop_now(
            exhausted or stopping, self._end_of_input if exhausted else None
        )

    def _looks_ahead(self) -> bool:
        """Whether this pipeline's end stops every process (see the class docstring).

        Not in a session whose loop decides where each process's input ends (a
        sharded evaluation over shards of different lengths).
        """
        session = self._session
        return (
            self._distributed
            and self.look_ahead
            and session is not None
            and not any(counted is self for counted in session._inputs_counted_by_loop)
        )

    @property
    def _end_of_input(self) -> str:
        return f"the end of input pipeline {self.name!r}"

    async def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        """Start the producers at the (restored) position."""
        if self._grace is None:
            self._grace = float(getattr(session, "_stop_grace_period_secs", _DEFAULT_GRACE_SECS))
        self._spawn = coord.start_soon
        if self._unwake is not None:
            self._unwake()
        self._woken, self._preempted = False, None
        self._unwake = coord._on_wake(self._wake_consumer)
        self._start()

    def end(self, session: MonitoredSession) -> None:
        """Forget the session: iterating the pipeline later is no longer its loop."""
        self._preempted = session.stopped_by_signal
        self._session = None
        if self._unwake is not None:
            self._unwake()
            self._unwake = None

    def _wake_consumer(self) -> None:
        """The coordinator's wake-up (any thread): a wait for a batch looks again
        whether the session stops."""
        with self._lock:
            self._woken = True
            event, self._waiting = self._waiting, None
        if event is not None:
            self._set(event)

    def _stopping(self) -> str | None:
        """Why the session stops while the step loop waits for a batch, if it does.

        Alone only: with other processes a stop is agreed at the end of a step,
        and the others would wait in that step's collectives for this one.
        """
        session = self._session
        if session is None or self._distributed:
            return None
        signal_name = session.stopped_by_signal
        if signal_name is not None:
            return f"{signal_name} received"
        if session.should_stop():
            return f"stop requested by {session.coord.stop_requested_by or 'the coordinator'}"
        return None

    def _stopped_while_waiting(self, index: int, why: str) -> OutOfRangeError:
        """The end of the input for a step loop that waits for batch ``index`` while
        the session stops: the session closes normally, after the last finished step."""
        return OutOfRangeError(
            f"input pipeline {self.name!r}: the session stops ({why}) while batch {index} "
            "is still being made; the step that needed it does not run"
        )

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """With other processes, stop after this step when no batch follows it.

        Alone, the end of the input is the next step's ``OutOfRangeError``, as
        in TF1. In a job of several processes that would come too late: the
        others would already be inside the next step, waiting in its
        collectives for this one. Known now, it is one more reason to stop that
        every process agrees on at the end of this step. Looked at once every
        hook's ``after_run`` has run (a rollback may have moved the input back),
        and not when a stop is already requested.
        """
        if self._looks_ahead():
            run_context.session.call_after_hooks(lambda: self._stop_if_exhausted(run_context))

    async def _stop_if_exhausted(self, run_context: SessionRunContext) -> None:
        if run_context.stop_requested or run_context.session.coord.should_stop():
            return  # stopping anyway: the next batch may never come (a stream fed by the loop)
        if not await self._has_next():
            run_context.request_stop()
            run_context.stop_requested_by = self._end_of_input

    async def __aenter__(self) -> Pipeline:
        if self._task_group is not None:
            raise RuntimeError(f"input pipeline {self.name!r} is already running")
        self._session, self._distributed = None, False  # on its own now, whatever it was
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._spawn = self._task_group.start_soon
        self._start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        task_group, self._task_group = self._task_group, None
        self._spawn = None
        if task_group is not None:
            self._stop()
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)

    def _start(self) -> None:
        """(Re)start producers at ``_next``; earlier producers retire."""
        if self._spawn is None:
            raise RuntimeError(f"input pipeline {self.name!r} has no running session")
        with self._lock:
            self._gen += 1
            gen = self._gen
            self._running = True
            self._claim = self._after_skips(self._next)
            self._limit = self._end = self._length
            self._error = None
            self._error_raised = False
            self._ready = {}
            self._wake_locked()
            old, self._retire = self._retire, anyio.Event()
            retire = self._retire
            old_reader = self._reader
            # One worker thread means one call of the source at a time, as the
            # user may assume: the consumer making a batch takes the same lock.
            serial = self._threads and self._num_workers == 1
            reader = self._reader = _Reader() if self._sync_iterable or serial else None
        if self._stager is not None:
            self._stager.clear()
        if old is not None:
            old.set()
        if old_reader is not None:
            old_reader.close(blocking=False)  # else the thread reading it closes it
        self._waker = LoopWaker()
        self._spawn(self._serve, gen, retire, reader, name=f"input pipeline {self.name}")

    def _stop(self) -> None:
        with self._lock:
            was_running, self._running = self._running, False
            self._gen += 1
            self._wake_locked()
            events = [self._waiting, self._space_event, self._retire]
            self._waiting = self._space_event = None
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close(blocking=False)
        for event in events:
            if event is not None:
                event.set()
        if was_running:
            self._report_unconsumed_error()

    async def _serve(self, gen: int, retire: anyio.Event, reader: _Reader | None) -> None:
        threads: list[threading.Thread] = []
        try:
            async with anyio.create_task_group() as tasks:
                for i in range(self._num_workers):
                    label = f"monitored.data {self.name} worker {i}"
                    if self._threads:
                        thread = threading.Thread(
                            target=self._thread_worker,
                            args=(gen, reader),
                            name=label,
                            daemon=True,
                        )
                        threads.append(thread)
                        thread.start()
                    else:
                        tasks.start_soon(self._task_worker, gen, reader, name=label)
                await retire.wait()
                tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if self._gen == gen:
                    self._stop()
                await self._join(threads)

    def _report_unconsumed_error(self) -> None:
        """Log a producer's failure that no step reached (the run stopped before)."""
        error = self._error
        if error is not None and not self._error_raised:
            index, exc = error
            log.warning(
                "input pipeline %r: the source failed making batch %d (%s: %s); the run "
                "stopped at batch %d, before any step needed it",
                self.name,
                index,
                type(exc).__name__,
                exc,
                self._next,
            )

    async def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for the worker threads, at most the grace period; after a preemption
        signal, not for a call of the source (its batch would never be used)."""
        grace = self._grace if self._grace is not None else _DEFAULT_GRACE_SECS
        deadline = time.monotonic() + grace
        # Polled, not joined in a worker thread: a hung producer must not leave
        # another thread blocked behind it.
        while (alive := [t for t in threads if t.is_alive()]) and time.monotonic() < deadline:
            if self._preempted is not None and all(t.ident in self._calling for t in alive):
                break
            await anyio.sleep(_POLL_SECS)
        hung = [t for t in threads if t.is_alive()]
        if hung and self._preempted is not None:
            calls = ", ".join(self._describe_call(t) for t in hung)
            log.warning(
                "input pipeline %r: the session stopped on %s; producer thread(s) %s still "
                "in a call of the source, abandoned (daemon threads: they do not hold up "
                "the process's exit, and their batches are never used)",
                self.name,
                self._preempted,
                calls,
            )
        elif hung:
            log.warning(
                "input pipeline %r: producer thread(s) %s still running %.3gs after the stop "
                "(the grace period); left behind as daemon threads",
                self.name,
                ", ".join(t.name for t in hung),
                grace,
            )

    def _describe_call(self, thread: threading.Thread) -> str:
        """The thread's name, and the batch it is making if it is in a call of the source."""
        index = self._calling.get(thread.ident or 0)
        return thread.name if index is None else f"{thread.name} (making batch {index})"

    # -- producers -------------------------------------------------------------------------
    def _claimable_locked(self, gen: int) -> int | None:
        """The next index to make, ``-1`` to wait for space, ``None`` to retire."""
        if gen != self._gen:
            return None
        index = self._claim
        if self._skips:
            index = self._after_skips(index)
        if self._limit is not None and index >= self._limit:
            return None
        if index >= self._next + self._window:
            return -1
        return index

    def _make(
        self, gen: int, reader: _Reader | None, only: int | None = None
    ) -> tuple[int, Any] | int | None:
        """Claim the next index and make its batch in the calling thread.

        Shared by thread workers, task workers and the consumer. For an iterator
        (or a function with one worker thread) the claim and the call happen
        under ``reader.lock``, so the source is called by one thread at a time
        and an iterator's items go to consecutive indices. The
        consumer passes ``only`` (the index it waits for) and never blocks: it
        makes that batch or none. Returns ``(index, batch)``; ``-1`` when there
        is nothing to claim now; ``None`` when producers of ``gen`` retire (a
        failure is recorded for the step that needs the batch).
        """
        # Task producers and the consumer share the loop's thread and never
        # await between claim and read: the lock is for threads.
        locked = False
        if reader is not None and self._threads:
            if not reader.lock.acquire(blocking=only is None):
                return -1  # a worker is reading the iterator: its batch comes soon
            locked = True
        try:
            with self._lock:
                index = self._claimable_locked(gen)
                if index is None or index < 0:
                    return index
                if only is not None and index != only:
                    return -1
                self._claim = index + 1
            calling = self._calling
            thread = threading.get_ident()
            try:
                calling[thread] = index
                try:
                    if self._load is not None:
                        batch = self._load(index)
                    else:
                        assert reader is not None
                        batch = reader.read(index, self._open_sync)
                finally:
                    del calling[thread]
                if locked:
                    assert reader is not None
                    reader.lock.release()
                    locked = False
                if self._check and not self._checked(gen, index, batch):
                    return None
            except BaseException as exc:
                self._fail(gen, index, exc)
                if (only is not None or not self._threads) and not isinstance(exc, Exception):
                    # An interrupt in the event loop's thread is not the source's
                    # failure: it propagates from here, so it is not reported again.
                    self._mark_raised(gen, index, exc)
                    raise
                return None
        finally:
            if locked:
                assert reader is not None
                reader.lock.release()
        return index, batch

    def _produce(self, gen: int, reader: _Reader | None) -> bool:
        """A worker's turn: make the next batch and leave it for the consumer.
        False when the worker retires."""
        made = self._make(gen, reader)
        if made is None:
            return False
        if isinstance(made, tuple):
            return self._deposit(gen, *made)
        return True

    def _thread_worker(self, gen: int, reader: _Reader | None) -> None:
        try:
            while True:
                with self._lock:
                    while (index := self._claimable_locked(gen)) == -1:
                        self._sleepers += 1  # reset by whoever wakes it
                        self._space.wait()
                if index is None or not self._produce(gen, reader):
                    return
        finally:
            if reader is not None:
                reader.close(blocking=True)

    async def _task_worker(self, gen: int, reader: _Reader | None) -> None:
        iterator: AsyncIterator[Any] | None = None
        position = 0
        try:
            while True:
                space: anyio.Event | None = None
                with self._lock:
                    index = self._claimable_locked(gen)
                    if index == -1:
                        space = self._space_event
                        if space is None:
                            space = self._space_event = anyio.Event()
                    elif index is not None and not self._sync_in_loop:
                        self._claim = index + 1
                if index is None:
                    return
                if space is not None:
                    await space.wait()
                    continue
                if self._sync_in_loop:
                    # Nothing else runs on this thread until it returns: the
                    # claim above is still the next one.
                    if not self._produce(gen, reader):
                        return
                    continue
                try:
                    if iterator is None:
                        assert self._open_iter is not None
                        opened = self._open_iter(index)
                        assert isinstance(opened, AsyncIterator)
                        iterator, position = opened, index
                    while position < index:  # skipped batches are read and dropped
                        await iterator.__anext__()
                        position += 1
                    batch = await iterator.__anext__()
                    position += 1
                except Exception as exc:  # cancellation and interrupts propagate
                    self._fail(gen, index, exc)
                    return
                if self._check and not self._checked(gen, index, batch):
                    return
                if not self._deposit(gen, index, batch):
                    return
        finally:
            if iterator is not None:
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True):
                        await aclose()
            if reader is not None:
                reader.close(blocking=False)

    def _open_sync(self, index: int) -> Iterator[Any]:
        assert self._open_iter is not None
        iterator = self._open_iter(index)
        if not isinstance(iterator, Iterator):
            raise TypeError(f"source {self.name!r} is async: it cannot be read in a thread")
        return iterator

    def _checked(self, gen: int, index: int, batch: Any) -> bool:
        """Whether ``batch`` has the structure of the first batch (else its
        failure is recorded)."""
        quick = quick_signature(batch)
        if quick is not None and quick == self._quick:
            return True
        error = self._check_slowly(batch, index, quick)
        if error is None:
            return True
        self._fail(gen, index, error)
        return False

    def _deposit(self, gen: int, index: int, batch: Any) -> bool:
        """Leave a checked batch in the reorder buffer (False: ``gen`` retired).

        A batch skipped while it was being made is dropped here."""
        with self._lock:
            if gen != self._gen:
                return False
            if self._skips and self._skipped(index):
                return True
            self._ready[index] = batch
            event = None
            if index == self._next:  # the consumer waits for this very batch
                event, self._waiting = self._waiting, None
        if event is not None:
            self._set(event)
        return True

    def _check_slowly(self, batch: Any, index: int, quick: Any) -> BatchError | None:
        """The full check, against the first batch checked (under the lock, so two
        workers cannot both take their batch for the first)."""
        with self._lock:
            try:
                first = check_batch(batch, index, self.name, self._first, self._first_index)
            except BatchError as exc:
                return exc
            if self._first is None:
                self._first, self._first_index, self._quick = first, index, quick
        return None

    def _fail(self, gen: int, index: int, exc: BaseException) -> None:
        with self._lock:
            if gen != self._gen:
                return
            if isinstance(exc, END_OF_INPUT) or (
                isinstance(exc, IndexError) and self._open_iter is None and self._length is None
            ):
                self._end = index if self._end is None else min(self._end, index)
            elif self._error is None or index < self._error[0]:
                self._error = (index, exc)
            self._limit = index if self._limit is None else min(self._limit, index)
            self._wake_locked()
            event, self._waiting = self._waiting, None
        if event is not None:
            self._set(event)

    def _mark_raised(self, gen: int, index: int, exc: BaseException) -> None:
        """``exc``, recorded for batch ``index``, propagates on the consumer's thread."""
        with self._lock:
            if gen == self._gen and self._error is not None and self._error[1] is exc:
                self._error_raised = True

    def _set(self, event: anyio.Event) -> None:
        if self._waker is not None:
            self._waker.set(event)

    # -- the consumer ----------------------------------------------------------------------
    async def take(self) -> Any:
        """The next batch (awaiting it if it is not made yet).

        Raises ``OutOfRangeError`` at the end of the input and
        :class:`~monitored.data.ProducerError` for a batch whose producer failed.
        """
        in_place = self._in_place
        while True:
            space: anyio.Event | None = None
            skipped = False
            with self._lock:
                index = self._next
                batch = self._ready.pop(index, _MISSING)
                if self._skips and self._skipped(index):
                    # A whole skipped range is passed in one step.
                    skipped, batch = True, _MISSING
                    space = self._advance_locked(self._after_skips(index))
                elif batch is not _MISSING:
                    space = self._advance_locked(index + 1)
                    following = self._ready.get(index + 1, _MISSING)
                else:
                    self._raise_locked(index)
                    if self._woken and (why := self._stopping()) is not None:
                        raise self._stopped_while_waiting(index, why)
                    if not in_place:
                        event = self._waiting = anyio.Event()
            if space is not None:
                space.set()
            if batch is not _MISSING:
                break
            if skipped:
                continue
            if in_place:
                made = self._make(self._gen, self._reader, only=index)
                if isinstance(made, tuple):
                    with self._lock:
                        if self._skips and self._skipped(index):
                            continue  # skipped (by another thread) while it was made
                        batch = made[1]  # made for this step: straight to it
                        space = self._advance_locked(index + 1)
                        following = self._ready.get(index + 1, _MISSING)
                    if space is not None:
                        space.set()
                    break
                in_place = False  # a worker makes it, or it failed: look again, then wait
                continue
            await event.wait()
            in_place = self._in_place
        stager = self._stager
        if stager is not None:
            batch = stager.take(index, batch)
            if following is not _MISSING:
                stager.start(index + 1, following)
        return batch

    async def _has_next(self) -> bool:
        """Whether another batch (or its producer's error) comes; awaits until known.

        Nothing is consumed: the position saved with a checkpoint stays that of
        the next step's batch. A batch made in place here waits in the buffer.
        """
        in_place = self._in_place
        while True:
            event: anyio.Event | None = None
            space: anyio.Event | None = None
            skipped = False
            with self._lock:
                index = self._next
                if self._skips and self._skipped(index):
                    skipped = True  # a whole skipped range is passed at once, as take() does
                    space = self._advance_locked(self._after_skips(index))
                elif (
                    index in self._ready
                    or not self._running
                    or (self._error is not None and self._error[0] == index)
                ):
                    return True  # a batch, or what the next take() raises
                elif self._end is not None and index >= self._end:
                    return False
                elif self._woken and self._stopping() is not None:
                    return True  # the next take() ends the input
                elif not in_place:
                    event = self._waiting = anyio.Event()
            if space is not None:
                space.set()
            if skipped:
                continue
            if event is not None:
                await event.wait()
                in_place = self._in_place
                continue
            made = self._make(self._gen, self._reader, only=index)
            if isinstance(made, tuple):
                self._deposit(self._gen, *made)
                return True
            in_place = False  # a worker makes it, or it failed: look again, then wait

    def _advance_locked(self, next_index: int) -> anyio.Event | None:
        """The batches before ``next_index`` are consumed (or skipped): move on,
        and wake producers once half the window is free (so a fast source refills
        in bursts, not one switch per batch). Returns a task producers' event to
        set outside the lock."""
        self._next = next_index
        if self._claim - self._next > self._half:
            return None
        if self._sleepers:
            self._wake_locked()
        space, self._space_event = self._space_event, None
        return space

    def _wake_locked(self) -> None:
        """Wake the worker threads waiting for space (a woken thread needs the
        GIL to run, so it counts as awake from now on, not from then)."""
        self._sleepers = 0
        self._space.notify_all()

    def _raise_locked(self, index: int) -> None:
        if self._error is not None and self._error[0] == index:
            exc = self._error[1]
            self._error_raised = True
            if isinstance(exc, BatchError):
                raise exc
            raise ProducerError(
                f"input pipeline {self.name!r}: the source raised {type(exc).__name__} while "
                f"making batch {index}: {exc}",
                source=self.name,
                index=index,
            ) from exc
        if self._end is not None and index >= self._end:
            raise OutOfRangeError(
                f"input pipeline {self.name!r} is exhausted after {index} batches"
            )
        if not self._running:
            raise RuntimeError(
                f"input pipeline {self.name!r} is not running: pass it in the session's "
                "hooks=[...] or use `async with pipeline:`"
            )

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        session = self._session
        if session is not None and self._running:
            if session.should_stop():
                # The loop is over (a hook's stop, or every process agreed to stop):
                # end the iteration rather than hand out a batch no step will run.
                raise StopAsyncIteration
            if not self._first_agreed and await self._stop_before_first_batch():
                raise StopAsyncIteration
        try:
            return await self.take()
        except OutOfRangeError:
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} next={self._next} "
            f"buffer_size={self._buffer_size} num_workers={self._num_workers}>"
        )


class FeedingPipeline(Pipeline):
    """A :class:`Pipeline` that passes each batch to the step as a keyword argument.

    ``while not sess.should_stop(): await sess.run(step)`` then calls
    ``step(state, <feed>=batch)`` (with ``feed=None`` and dict batches, each
    field is its own keyword argument).
    """

    def __init__(self, *, feed: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._feed = feed

    async def __anext__(self) -> Any:
        raise TypeError(
            f"input pipeline {self.name!r} feeds the step itself (feed={self._feed!r}); "
            "iterating it too would hand each batch to one or the other. Make it with "
            "feed=False to iterate it"
        )

    async def before_run(self, run_context: SessionRunContext) -> SessionRunArgs:
        """Take the next batch and hand it to the step."""
        if not self._first_agreed and await self._stop_before_first_batch():
            raise OutOfRangeError(
                f"input pipeline {self.name!r}: every process agreed to stop before its "
                "first batch (one of them had nothing to read, a run resumed at the end of "
                "its input or an empty shard, or another reason to stop)"
            )
        batch = await self.take()
        if self._feed is not None:
            return SessionRunArgs(None, feeds={self._feed: batch})
        if not isinstance(batch, dict):
            raise TypeError(
                f"input pipeline {self.name!r} feeds with feed=None, so its batches must be "
                f"dicts of keyword arguments; got {type(batch).__name__}"
            )
        return SessionRunArgs(None, feeds=batch)


@final
class _Reader:
    """One-at-a-time access to a sync source, for the producers of one generation.

    A worker thread and the consumer may both read an iterator, or call a
    function served by one worker, but one at a time (under ``lock``): claiming
    an index and reading its item are one step under the lock, so an
    iterator's items land on consecutive indices whoever reads.
    """

    __slots__ = ("closed", "iterator", "lock", "position")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.iterator: Iterator[Any] | None = None
        #: The index of the item the iterator yields next.
        self.position = 0
        self.closed = False

    def read(self, index: int, open_at: Callable[[int], Iterator[Any]]) -> Any:
        """The batch at ``index`` (under ``lock``); items of skipped indices are
        read and dropped."""
        assert not self.closed, "a retired reader is never claimed from"
        if self.iterator is None:
            self.iterator, self.position = open_at(index), index
        while self.position < index:
            next(self.iterator)
            self.position += 1
        item = next(self.iterator)
        self.position += 1
        return item

    def close(self, *, blocking: bool) -> None:
        """Close the iterator, unless (``blocking=False``) a worker is reading it:
        that worker closes it when it retires."""
        if not self.lock.acquire(blocking=blocking):
            return
        try:
            iterator, self.iterator, self.closed = self.iterator, None, True
        finally:
            self.lock.release()
        _close(iterator)


def prefetch(
    source: Iterable[Any] | AsyncIterable[Any] | Callable[[int], Any],
    buffer_size: int = 2,
    num_workers: int = 1,
    *,
    num_epochs: int | None = 1,
    threads: bool | None = None,
    feed: str | bool | None = False,
    name: str | None = None,
    device: bool = False,
    stop_grace_period_secs: float | None = None,
    check: bool = True,
    in_place: bool | None = None,
) -> Pipeline:
    """Make batches ahead of the step loop, with backpressure.

    Args:
        source: where batches come from:

            * a function of the batch index, ``source(i) -> batch``, ending the
              input by raising ``OutOfRangeError``, ``StopIteration`` or
              ``IndexError``: several workers make batches in parallel;
            * a sequence (``len`` and ``[i]``, a list of batches): read by index,
              ``num_epochs`` times;
            * an iterable or async iterable (a generator): read in order by one
              producer, again for each epoch (so it must be re-iterable when
              ``num_epochs != 1``).

            A batch is an array, or a tuple, list or dict of arrays.
        buffer_size: how many finished batches may wait (>= 1); each worker also
            holds one in progress. Producers wait when it is full.
        num_workers: producers making batches in parallel (index functions and
            sequences only). Results are delivered in index order whatever the
            timing, so the content of the stream does not depend on it.
        num_epochs: passes over a sequence or iterable (``None``: forever).
        threads: make batches in worker threads (for blocking or CPU-bound
            loading; NumPy releases the GIL) rather than anyio tasks. Default:
            threads for sync sources, tasks for async iterables.
        feed: when used in ``hooks=[...]``, also pass each batch to the step:
            ``"batch"`` calls ``step(state, batch=...)``; ``None`` spreads dict
            batches as keyword arguments; ``False`` (default) feeds nothing, and
            the loop takes batches with ``async for``.
        name: the name in errors and checkpoints (``input:<name>``); give each
            pipeline of a session its own.
        device: copy each batch to the GPU ahead of use on a separate CUDA stream
            through pinned host memory (needs CuPy).
        stop_grace_period_secs: how long closing waits for worker threads
            (default: the session's).
        check: check each batch's structure (fields, dtypes) against the first.
        in_place: with worker threads, let the step make the batch it needs
            itself when no thread has claimed it yet, saving a hand-off between
            threads (tens of microseconds). Only for a source that is cheap and
            never waits (on I/O, or on anything the event loop provides): it
            runs on the event loop's thread. Default: on for built-in lists and
            tuples and NumPy arrays in memory, off for everything else.
    """
    label = name or _name_of(source)
    common: dict[str, Any] = {
        "name": label,
        "buffer_size": buffer_size,
        "num_workers": num_workers,
        "device": device,
        "stop_grace_period_secs": stop_grace_period_secs,
        "check": check,
    }
    if num_epochs is not None and (isinstance(num_epochs, bool) or num_epochs < 1):
        raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs!r}")
    config: dict[str, Any] = {"kind": "prefetch", "num_epochs": num_epochs}
    common["in_place"] = bool(in_place)
    if isinstance(source, AsyncIterable):
        if threads:
            raise ValueError(
                f"source {label!r} is an async iterable: it runs in a task, not a thread"
            )
        if in_place:
            raise ValueError(
                f"source {label!r} is an async iterable: it runs in a task, so in_place "
                "does not apply"
            )
        _check_repeatable(source, num_epochs, label)
        common |= {
            "open_iter": _async_opener(source, num_epochs),
            "threads": False,
            "async_source": True,
        }
    elif _is_sequence(source):
        sequence: Any = source
        size = len(sequence)
        common |= {
            "load": lambda i: sequence[i % size] if size else _raise_end(),
            "length": None if num_epochs is None else size * num_epochs,
            "threads": True if threads is None else threads,
            "epoch_length": size or None,
            "in_place": _cheap_to_index(source) if in_place is None else in_place,
        }
        config["length"] = size
    elif isinstance(source, Iterable):
        _check_repeatable(source, num_epochs, label)
        common |= {
            "open_iter": _sync_opener(source, num_epochs),
            "threads": True if threads is None else threads,
        }
    elif callable(source):
        if num_epochs not in (1, None):
            raise ValueError(
                f"source {label!r} is a function of the batch index: it decides where the "
                "input ends, so num_epochs does not apply"
            )
        common |= {"load": source, "threads": True if threads is None else threads}
    else:
        raise TypeError(
            f"prefetch needs an iterable, an async iterable or a function of the batch "
            f"index; got {type(source).__name__}"
        )
    common["config"] = config
    if feed is False:
        return Pipeline(**common)
    if feed is True:
        feed = "batch"
    return FeedingPipeline(feed=feed, **common)


def pipelines(session: MonitoredSession) -> list[Pipeline]:
    """The input pipelines registered in ``session`` (in ``hooks=[...]``), in call order.

    For plugins that act on the input: a NaN guard rolling back to a checkpoint
    calls :meth:`Pipeline.skip` on each to leave out the batches that followed.
    """
    return [info.plugin for info in session.plugins if isinstance(info.plugin, Pipeline)]


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _show(value: object) -> str:
    """``repr`` cut short: the value came from a file."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _close(iterator: object) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def _raise_end() -> Any:
    raise OutOfRangeError("empty source")


def _is_sequence(source: object) -> bool:
    return (
        isinstance(source, collections.abc.Sequence) and not isinstance(source, str | bytes)
    ) or (
        hasattr(source, "__len__")
        and hasattr(source, "__getitem__")
        and not isinstance(source, collections.abc.Mapping | str | bytes)
        and not isinstance(source, Iterator)
    )


def _cheap_to_index(source: object) -> bool:
    """Whether ``source[i]`` is known to take microseconds and never to wait: a
    built-in list or tuple, or a NumPy array in memory (an item of a memory map
    is a view too; its pages are read when the step uses them)."""
    return type(source) in (list, tuple, np.ndarray, np.memmap)


def _check_repeatable(source: object, num_epochs: int | None, label: str) -> None:
    if num_epochs != 1 and isinstance(source, Iterator | AsyncIterator):
        raise ValueError(
            f"source {label!r} is an iterator, which can be read only once, so num_epochs "
            f"must be 1 (got {num_epochs}); pass the re-iterable object (a list, or a "
            "class whose __iter__ makes a new generator)"
        )


def _sync_opener(source: Iterable[Any], num_epochs: int | None) -> Callable[[int], Iterator[Any]]:
    if isinstance(source, Iterator):
        return _one_shot_opener(source)

    def iterate_from(start: int) -> Iterator[Any]:
        position, epoch = 0, 0
        while num_epochs is None or epoch < num_epochs:
            before = position
            for item in source:
                if position >= start:
                    yield item
                position += 1
            if position == before:  # an empty pass: nothing more will come
                return
            epoch += 1

    return iterate_from


def _one_shot_opener(source: Iterator[Any]) -> Callable[[int], Iterator[Any]]:
    """An iterator (a generator object) can go forward only: reopening it at a
    later position skips ahead; at an earlier one (an in-process rollback) it
    cannot, and says so."""
    read = 0

    def iterate_from(start: int) -> Iterator[Any]:
        nonlocal read
        if start < read:
            raise ValueError(
                f"the source is an iterator already read up to batch {read}: it cannot go "
                f"back to batch {start}; pass a re-iterable source (a list, or an object "
                "whose __iter__ makes a new generator)"
            )
        for item in source:
            read += 1
            if read > start:
                yield item

    return iterate_from


def _async_opener(
    source: AsyncIterable[Any], num_epochs: int | None
) -> Callable[[int], AsyncIterator[Any]]:
    async def iterate_from(start: int) -> AsyncIterator[Any]:
        position, epoch = 0, 0
        while num_epochs is None or epoch < num_epochs:
            before = position
            async for item in source:
                if position >= start:
                    yield item
                position += 1
            if position == before:
                return
            epoch += 1

    return iterate_from


def _name_of(source: object) -> str:
    base = getattr(source, "_monitored_shard_of", None)
    if base is not None:  # monitored.data.shard: named as what it is a shard of
        return _name_of(base)
    if inspect.isfunction(source) or inspect.ismethod(source) or inspect.isclass(source):
        return str(source.__name__)
    if inspect.isgenerator(source):
        return str(source.__name__)
    return type(source).__name__
