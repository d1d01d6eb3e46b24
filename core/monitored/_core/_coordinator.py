"""``Coordinator``: stop requests and background work, on anyio.

TF1's ``tf.train.Coordinator`` for async Python. Any task or thread may call
:meth:`Coordinator.request_stop`, optionally with the exception that made it stop;
the session sees the stop at the next step boundary and the exception is raised
from the next ``run`` or from the ``async with`` exit, never swallowed.
Background tasks (:meth:`Coordinator.start_soon`) run in the session's task group;
threads (:meth:`Coordinator.start_thread`, :meth:`Coordinator.register_thread`)
are joined with a grace period when the session closes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, TypeAlias, final

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

from ._errors import OutOfRangeError
from ._run import caller_name

__all__ = ["Coordinator", "LooperThread"]

log = logging.getLogger("monitored")

_POLL_SECS: Final = 0.01
#: How often a join that waits for a stop request looks whether everything ended.
_JOIN_POLL_SECS: Final = 0.05

#: Exceptions that mean "the input is exhausted": they stop without being errors.
END_OF_INPUT: tuple[type[BaseException], ...] = (
    OutOfRangeError,
    StopIteration,
    StopAsyncIteration,
)

#: What ``request_stop`` accepts: an exception, or ``sys.exc_info()`` as in TF1.
ExcInfo: TypeAlias = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]


@final
class Coordinator:
    """Coordinates the stop of a training loop, its background tasks and threads."""

    __slots__ = (
        "_clean_stop_exception_types",
        "_closing",
        "_exc",
        "_idle",
        "_joined",
        "_lock",
        "_running",
        "_scopes",
        "_stopped",
        "_task_group",
        "_threads",
        "_wake_callbacks",
        "stop_requested_by",
    )

    def __init__(
        self, clean_stop_exception_types: Iterable[type[BaseException]] | None = None
    ) -> None:
        """``clean_stop_exception_types``: exceptions that stop without being errors
        (default: the end-of-input ones, ``OutOfRangeError``, ``StopIteration`` and
        ``StopAsyncIteration``), as TF1's argument of the same name."""
        self._clean_stop_exception_types: tuple[type[BaseException], ...] = (
            END_OF_INPUT
            if clean_stop_exception_types is None
            else tuple(clean_stop_exception_types)
        )
        self._joined = False
        self._lock = threading.Lock()
        self._stopped = False
        self._exc: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._task_group: anyio.abc.TaskGroup | None = None
        self._running = 0
        self._scopes: set[anyio.CancelScope] = set()
        self._idle: anyio.Event | None = None
        self._closing = False
        #: Called by :meth:`wake_waiters` (and a first stop request): the session's
        #: waits for input, which then look again whether the session stops.
        self._wake_callbacks: list[Callable[[], object]] = []
        #: Who requested the stop first (the calling function's qualified name).
        self.stop_requested_by: str | None = None

    # -- stop requests ----------------------------------------------------------------
    def request_stop(self, ex: BaseException | ExcInfo | None = None) -> None:
        """Request a stop; ``ex`` (the first one given) is re-raised by the session.

        ``ex`` is an exception or ``sys.exc_info()`` (TF1 accepts both). The
        ``clean_stop_exception_types`` (by default the end-of-input exceptions
        ``OutOfRangeError``, ``StopIteration``, ``StopAsyncIteration``) stop
        without being recorded, as in TF1. Once :meth:`join` has run (and until
        :meth:`clear_stop`), nobody is left to re-raise it, so ``ex`` is raised
        at once, as TF1's joined coordinator does. Safe to call from any thread
        or task, any number of times.
        """
        if isinstance(ex, tuple):
            ex = ex[1]
        first = False
        with self._lock:
            if (
                ex is not None
                and self._exc is None
                and not isinstance(ex, self._clean_stop_exception_types)
            ):
                if self._joined:
                    raise ex
                self._exc = ex
                log.error("Coordinator stopped with exception: %r", ex)
            if not self._stopped:
                first = True
                self.stop_requested_by = caller_name()
                log.debug("Coordinator: stop requested by %s", self.stop_requested_by)
            self._stopped = True
        if first:
            self.wake_waiters()

    def should_stop(self) -> bool:
        """Whether a stop was requested."""
        return self._stopped

    def wake_waiters(self) -> None:
        """Have the session's waits for input look again whether the session stops.

        A step loop waiting for its next batch (a :func:`monitored.data.prefetch`
        pipeline whose loader is slow, or blocked in I/O) is not at a step
        boundary, where stops are otherwise seen. A first :meth:`request_stop`
        wakes it; so does this, for a stop that is not a coordinator's: a hook
        that turns a signal into a stop after the current step (its
        ``preempted_by`` set, as ``monitored-checkpoint``'s
        ``CheckpointSaverHook`` does) calls it when the signal comes. A wait
        woken while the session stops (or was stopped by a signal) ends without
        a batch: the step that has none never starts, and the session closes
        normally after the last finished step.

        Safe from any thread. Not from a signal handler: schedule it on the event
        loop (``loop.call_soon_threadsafe``), since a waiter takes locks the
        interrupted code may hold.
        """
        for callback in list(self._wake_callbacks):
            callback()

    def _on_wake(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback`` (from the waking thread) on :meth:`wake_waiters`; returns
        the function that stops that."""
        self._wake_callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._wake_callbacks.remove(callback)

        return remove

    def clear_stop(self) -> None:
        """Forget the stop request and any recorded exception."""
        with self._lock:
            self._exc = None
            self._stopped = False
            self._joined = False
            self.stop_requested_by = None

    @property
    def exception(self) -> BaseException | None:
        """The exception passed to :meth:`request_stop`, if any."""
        return self._exc

    def raise_requested_exception(self) -> None:
        """Raise the exception passed to :meth:`request_stop`, if there is one."""
        if self._exc is not None:
            raise self._exc

    @contextlib.contextmanager
    def stop_on_exception(self) -> Generator[None, None, None]:
        """Turn an exception raised in the block into a stop request carrying it."""
        try:
            yield
        except Exception as ex:
            self.request_stop(ex)

    async def wait_for_stop(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (TF1's API)
        """Wait until a stop is requested, at most ``timeout`` seconds.

        Returns whether a stop was requested.
        """
        # Polled rather than waited in a worker thread: a cancelled wait must not
        # leave a thread blocked behind it.
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stopped:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await anyio.sleep(_POLL_SECS if remaining is None else min(_POLL_SECS, remaining))
        return True

    # -- background work ------------------------------------------------------------------
    def start_soon(
        self, func: Callable[..., Awaitable[Any]], *args: Any, name: object = None
    ) -> None:
        """Run ``await func(*args)`` in the background while the session is open.

        An exception raised by it requests a stop carrying that exception. The task
        is cancelled when the session closes; work that must not be interrupted
        belongs in a thread (:meth:`start_thread`) or a shielded cancel scope.
        """
        if self._task_group is None or self._closing:
            raise RuntimeError(
                "Coordinator.start_soon needs an open session: call it from "
                "after_create_session or a step, not once the session is closing"
            )
        label = str(name or getattr(func, "__name__", func))
        self._running += 1  # counted now, so a join never misses a task not yet started

        async def guarded() -> None:
            scope = anyio.CancelScope()
            self._scopes.add(scope)
            try:
                with scope, self.stop_on_exception():
                    await func(*args)
            finally:
                self._scopes.discard(scope)
                self._running -= 1
                if self._running == 0 and self._idle is not None:
                    self._idle.set()

        if self._idle is None or self._idle.is_set():
            self._idle = anyio.Event()
        self._task_group.start_soon(guarded, name=label)

    def start_looper(
        self,
        timer_interval_secs: float | None,
        target: Callable[..., Awaitable[Any]],
        *args: Any,
        name: object = None,
    ) -> None:
        """The async form of :class:`LooperThread`: a background task that awaits
        ``target(*args)`` every ``timer_interval_secs`` seconds (``0``: back to back;
        ``None``: once) until a stop is requested.

        Like :meth:`start_soon`, it needs an open session and an exception raised by
        ``target`` requests a stop carrying it. Blocking targets belong in a
        :class:`LooperThread`.
        """
        label = name or f"looper:{getattr(target, '__name__', target)}"

        async def loop() -> None:
            if timer_interval_secs is None:
                await target(*args)
                return
            next_time = time.monotonic()
            while not await self.wait_for_stop(max(0.0, next_time - time.monotonic())):
                next_time += timer_interval_secs
                await target(*args)
                await anyio.lowlevel.checkpoint()  # a zero interval must not starve the loop

        self.start_soon(loop, name=label)

    def start_thread(
        self, func: Callable[..., Any], *args: Any, name: str | None = None
    ) -> threading.Thread:
        """Start ``func(*args)`` in a daemon thread registered with this coordinator.

        ``func`` should return once :meth:`should_stop` is true; an exception raised
        by it requests a stop carrying that exception.
        """

        def guarded() -> None:
            with self.stop_on_exception():
                func(*args)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        self.register_thread(thread)
        thread.start()
        return thread

    def register_thread(self, thread: threading.Thread) -> None:
        """Have :meth:`join` wait for ``thread``."""
        with self._lock:
            self._threads.append(thread)

    async def join(
        self,
        threads: Iterable[threading.Thread] | None = None,
        stop_grace_period_secs: float = 120,
        ignore_live_threads: bool = False,
    ) -> None:
        """Wait for background tasks and the registered threads (and ``threads``).

        Waits until a stop is requested or nothing runs any more, then at most
        ``stop_grace_period_secs`` for the tasks and threads to finish. Then
        raises the exception passed to :meth:`request_stop`, if any; otherwise a
        ``RuntimeError`` naming the threads still running, unless
        ``ignore_live_threads``.
        """
        with self._lock:
            pending = list(self._threads)
        pending += [t for t in threads or () if t not in pending]
        while not await self.wait_for_stop(_JOIN_POLL_SECS):
            if not self._running and not any(t.is_alive() for t in pending):
                break
        deadline = time.monotonic() + stop_grace_period_secs
        if self._running and self._idle is not None:
            with anyio.move_on_after(stop_grace_period_secs):
                await self._idle.wait()
        for thread in pending:
            remaining = max(0.0, deadline - time.monotonic())
            await anyio.to_thread.run_sync(thread.join, remaining, abandon_on_cancel=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._joined = True
        self.raise_requested_exception()
        alive = [t.name for t in pending if t.is_alive()]
        if alive and not ignore_live_threads:
            raise RuntimeError(
                f"Coordinator stopped with threads still running after "
                f"{stop_grace_period_secs}s: {', '.join(alive)}"
            )

    @property
    def registered_threads(self) -> tuple[threading.Thread, ...]:
        """The threads :meth:`join` waits for (registered or started here)."""
        with self._lock:
            return tuple(self._threads)

    @property
    def joined(self) -> bool:
        """Whether :meth:`join` has run (since the last :meth:`clear_stop`)."""
        return self._joined

    @property
    def running_tasks(self) -> int:
        """How many background tasks started with :meth:`start_soon` still run."""
        return self._running

    # -- used by the session -----------------------------------------------------------------
    def _cancel_tasks(self) -> None:
        """Cancel the background tasks running now (the session is being re-created)."""
        for scope in list(self._scopes):
            scope.cancel()

    def _attach(self, task_group: anyio.abc.TaskGroup | None) -> None:
        self._task_group = task_group


class LooperThread(threading.Thread):
    """A thread that calls ``target(*args, **kwargs)`` until the coordinator stops.

    TF1's ``tf.train.LooperThread``: with ``timer_interval_secs=None`` the target
    is called once (it runs its own loop); otherwise every
    ``timer_interval_secs`` seconds (``0``: back to back) until
    :meth:`Coordinator.should_stop`. The thread is a daemon registered with the
    coordinator, so :meth:`Coordinator.join` (and a session's close) waits for it;
    an exception raised by the target requests a stop carrying it. Subclasses may
    override :meth:`start_loop`, :meth:`run_loop` and :meth:`stop_loop` instead of
    passing a target. It is meant for blocking work; async work belongs in
    :meth:`Coordinator.start_soon`.
    """

    def __init__(
        self,
        coord: Coordinator,
        timer_interval_secs: float | None,
        target: Callable[..., Any] | None = None,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(coord, Coordinator):
            raise ValueError(f"'coord' argument must be a Coordinator: {coord!r}")
        if target is None and (args or kwargs):
            raise ValueError("'args' and 'kwargs' argument require that you also pass 'target'")
        super().__init__(daemon=True)
        self._coord = coord
        self._timer_interval_secs = timer_interval_secs
        self._target_fn = target
        self._target_args = tuple(args or ())
        self._target_kwargs = dict(kwargs or {})
        coord.register_thread(self)

    @classmethod
    def loop(
        cls,
        coord: Coordinator,
        timer_interval_secs: float | None,
        target: Callable[..., Any],
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> LooperThread:
        """Start a ``LooperThread`` calling ``target`` and return it."""
        looper = cls(coord, timer_interval_secs, target=target, args=args, kwargs=kwargs)
        looper.start()
        return looper

    def run(self) -> None:
        with self._coord.stop_on_exception():
            self.start_loop()
            if self._timer_interval_secs is None:
                self.run_loop()
            else:
                next_time = time.monotonic()
                while not self._wait_for_stop(next_time - time.monotonic()):
                    next_time += self._timer_interval_secs
                    self.run_loop()
            self.stop_loop()

    def _wait_for_stop(self, timeout: float) -> bool:
        """Block this thread until a stop is requested, at most ``timeout`` seconds."""
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._coord.should_stop():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(_POLL_SECS, remaining))
        return True

    def start_loop(self) -> None:
        """Called once when the thread starts."""

    def stop_loop(self) -> None:
        """Called once when the loop ends."""

    def run_loop(self) -> None:
        """Called at each interval: calls the target, if one was given."""
        if self._target_fn is not None:
            self._target_fn(*self._target_args, **self._target_kwargs)
