"""``SignalWatcher``: SIGTERM or a first SIGINT become a request to save and stop.

Clusters preempt a job with SIGTERM (then SIGKILL after a grace period); a
person stops one with Ctrl-C. While a session runs, the watcher turns the first
of these signals into a flag that the checkpoint hook reads at the next step
boundary: the current step finishes, a checkpoint of it is saved, ``end`` runs
and the session closes normally. A SIGINT after that aborts. When the program
(or a Jupyter kernel) had installed a SIGINT handler of its own before the
session, the abort is that handler's, as Ctrl-C was before the session: a
kernel's cancels the running cell, where a ``KeyboardInterrupt`` raised while
the kernel's event loop waits would kill the kernel. Otherwise (Python's
default handler, or the one of ``asyncio.run``/``anyio.run``, which would only
cancel the main task and let a synchronous step run on) it raises
``KeyboardInterrupt`` at once. A repeated SIGTERM is ignored, the save being
under way already.

"At once", but never inside the machinery: a ``KeyboardInterrupt`` raised in
the middle of the event loop's, anyio's or this library's own code can leave
an anyio worker thread started but never told to stop (the interpreter then
waits for it forever at exit), a future never resolved (the main task waits
forever) or a cancel scope half updated. So the abort is raised where the
main thread is when the signal comes only if that is the user's code (a step,
a hook) or the event loop waiting in ``select``; anywhere else (an installed
package, tensorboardX say, that the library called) it is deferred
to the first such point, which a helper thread finds by interrupting the main
thread every millisecond (with ``SIGURG``, ignored by default, so that a late
one is harmless) until the abort is raised, at most :data:`ABORT_WITHIN_SECS`.

Plain ``signal.signal`` handlers, not ``anyio.open_signal_receiver``: a receiver
is a task, and tasks do not run while a loop of synchronous steps never yields
to the event loop; and asyncio resets a removed handler to the default rather
than to the one that was there before. The handler only sets an attribute (and
writes a line to stderr), which is safe at any point of the main thread; the
previous handlers are put back when the session ends.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Final, final

import anyio.lowlevel

__all__ = ["ABORT_REPEAT_SECS", "ABORT_WITHIN_SECS", "DEFAULT_SIGNALS", "SignalWatcher"]

log = logging.getLogger("monitored.checkpoint")

#: The signals that ask for a save and a clean stop.
DEFAULT_SIGNALS: Final = tuple(
    s for s in (getattr(signal, "SIGTERM", None), signal.SIGINT) if s is not None
)

Handler = Callable[[int, FrameType | None], Any] | int | None

#: The longest a second SIGINT waits for a point outside the machinery before its
#: ``KeyboardInterrupt`` is raised wherever the main thread is (a main thread
#: blocked that long inside library code would otherwise never be interrupted).
ABORT_WITHIN_SECS: Final = 2.0
#: When the event loop the abort interrupted still runs this long after it (a clean-up
#: that waits forever: a task shielded from cancellation, a thread that never
#: answers), the interrupt is raised again, and again after as long.
ABORT_REPEAT_SECS: Final = 5.0
#: How often the abort helper interrupts the main thread while the abort waits.
_KICK_SECS: Final = 0.001
#: The signal the helper interrupts the main thread with: ignored by default, so
#: one arriving after the abort was raised does nothing.
_KICK_SIGNAL: Final = getattr(signal, "SIGURG", None)
#: Top-level packages whose code a ``KeyboardInterrupt`` must not land in: the
#: event loop, anyio, and this library (the core and its plugins).
_MACHINERY: Final = frozenset({"asyncio", "anyio", "sniffio", "trio", "outcome", "monitored"})
#: The directories installed packages live in (a user's script lives elsewhere).
_INSTALLED_DIRS: Final = ("site-packages", "dist-packages")
#: Modules of the ``Runner`` classes whose SIGINT handler only cancels the main task:
#: asyncio's, and anyio's copy of it for Pythons before 3.11.
_RUNNERS: Final = frozenset({"asyncio.runners", "anyio._backends._asyncio"})


#: The watchers of every open session, and the handlers that were in place
#: before the first of them: one process-wide handler serves them all, so
#: sessions that overlap each get the signal and, when the last closes, the
#: original handlers come back whatever the order of closing.
_active: list[SignalWatcher] = []
_original: dict[signal.Signals, Handler] = {}


def _dispatch(signum: int, frame: FrameType | None) -> None:
    """Hand the signal to every watcher of it; the notice is written once per signal.

    A sweep runs several sessions (and their evaluation sessions) at once: one
    Ctrl-C is one line on stderr, not one per session.
    """
    listening = [watcher for watcher in _active if signum in watcher._signals]
    heard = [watcher for watcher in listening if watcher.received is not None]
    fresh = [watcher for watcher in listening if watcher.received is None]
    for watcher in fresh:
        watcher.received = signal.Signals(signum)
        watcher._notify()
    if heard:  # a session that started since the first signal stops too, unannounced
        heard[0]._handle_again(signum, frame)
    elif fresh:
        _announce(signal.Signals(signum), any(signal.SIGINT in w._signals for w in fresh))


@final
class SignalWatcher:
    """Records the first preemption signal; put in place from the main thread only."""

    __slots__ = ("_on_signal", "_signals", "_soon", "received")

    def __init__(self, signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
        self._signals = tuple(signals)
        #: The first signal received, or ``None``.
        self.received: signal.Signals | None = None
        self._on_signal: Callable[[], object] | None = None
        #: The event loop's signal-safe "call soon" (asyncio's ``call_soon_threadsafe``,
        #: trio's ``run_sync_soon``), for ``_on_signal``.
        self._soon: Callable[[Callable[[], object]], object] | None = None

    @property
    def installed(self) -> bool:
        """Whether this watcher receives signals."""
        return self in _active

    def install(self, on_signal: Callable[[], object] | None = None) -> bool:
        """Start receiving signals; ``False`` (and nothing done) off the main thread.

        ``on_signal`` is called in the running event loop soon after the first
        signal (never in the signal handler, where the interrupted code may hold
        any lock): the session's ``coord.wake_waiters``, so that a step loop
        waiting for its input rather than running a step stops too.
        """
        if self.installed:
            return True
        self.received = None
        self._on_signal, self._soon = on_signal, _loop_soon() if on_signal is not None else None
        if threading.current_thread() is not threading.main_thread():
            log.info(
                "preemption handling is off: signal handlers can only be set in the main "
                "thread, and this session runs in thread %r",
                threading.current_thread().name,
            )
            return False
        try:
            for sig in self._signals:
                if signal.getsignal(sig) is not _dispatch:
                    _original[sig] = signal.getsignal(sig)
                    signal.signal(sig, _dispatch)
        except (ValueError, OSError) as exc:  # pragma: no cover - embedded interpreters
            log.info("preemption handling is off: %s", exc)
            return False
        _active.append(self)
        return True

    def uninstall(self) -> None:
        """Stop receiving signals; the last watcher puts the original handlers back."""
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return
        _active.remove(self)
        for sig in self._signals:
            if any(sig in watcher._signals for watcher in _active):
                continue
            previous = _original.pop(sig, None)
            if signal.getsignal(sig) is _dispatch:  # unless replaced since
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)

    def _notify(self) -> None:
        """Schedule ``on_signal`` in the event loop (signal-safe: it only queues a call)."""
        if self._on_signal is not None and self._soon is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._soon(self._on_signal)

    def _handle_again(self, signum: int, frame: FrameType | None) -> None:
        """A signal after the first: a SIGINT aborts, a SIGTERM is ignored."""
        if signum == signal.SIGINT:
            previous = _original.get(signal.SIGINT)
            self.uninstall()
            handler = _programs_own(previous)
            if handler is not None:
                handler(signum, frame)
                return
            _say("monitored-checkpoint: SIGINT again: aborting")
            _abort(frame)
        # A repeated SIGTERM: the save it asks for is under way already.


def _loop_soon() -> Callable[[Callable[[], object]], object] | None:
    """The running event loop's call-soon that may be called from a signal handler.

    asyncio's ``call_soon_threadsafe`` only appends to the loop's queue and
    writes a byte to its self-pipe (what asyncio's own signal handling does);
    trio documents ``run_sync_soon`` as safe from signal handlers.
    """
    try:
        native: Any = anyio.lowlevel.current_token().native_token
    except RuntimeError:  # no event loop
        return None
    soon: Any = getattr(native, "call_soon_threadsafe", None) or getattr(
        native, "run_sync_soon", None
    )
    return soon if callable(soon) else None


def _announce(received: signal.Signals, abortable: bool) -> None:
    """Say that ``received`` asks the sessions to save and stop (and how to abort)."""
    how = " (Ctrl-C again to abort)" if abortable else ""
    _say(
        f"monitored-checkpoint: {received.name} received; finishing the current "
        f"step, saving a checkpoint and stopping{how}"
    )


def _say(line: str) -> None:
    """Write to stderr without the locks of ``print`` or ``logging`` (signal-safe)."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _programs_own(handler: Handler) -> Callable[[int, FrameType | None], Any] | None:
    """``handler`` if the program (or a Jupyter kernel) installed it, else ``None``.

    Python's ``default_int_handler`` is no handler of the program's own, nor is
    the one ``asyncio.run`` and ``anyio.run`` install (a ``Runner``'s, which
    cancels the main task: a step that never awaits would then run on). A
    kernel's is: during a cell ipykernel's cancels the cell, and a
    ``KeyboardInterrupt`` raised while its event loop waits would kill the kernel.
    """
    if not callable(handler) or handler is signal.default_int_handler or _runners(handler):
        return None
    return handler


def _runners(handler: Handler) -> bool:
    """Whether ``handler`` is a ``Runner``'s (asyncio's, anyio's): the first SIGINT it
    gets only cancels the main task, the next raises ``KeyboardInterrupt``."""
    func: Any = handler
    while isinstance(func, functools.partial):
        func = func.func
    owner = getattr(func, "__self__", None)
    return getattr(func, "__name__", None) == "_on_sigint" and type(owner).__module__ in _RUNNERS


def _abort(frame: FrameType | None) -> None:
    """Raise ``KeyboardInterrupt`` now if ``frame`` may take it, else as soon as one may."""
    _Repeat.start(frame)
    if _interruptible(frame) or _KICK_SIGNAL is None or not hasattr(signal, "pthread_kill"):
        raise KeyboardInterrupt
    abort = _Abort.pending = _Abort(_KICK_SIGNAL)
    abort.start()


def _abort_repeat() -> float:
    """:data:`ABORT_REPEAT_SECS`, read when an abort starts (tests shorten it)."""
    return ABORT_REPEAT_SECS


def _abort_within() -> float:
    """:data:`ABORT_WITHIN_SECS`, read when an abort starts (tests shorten it)."""
    return ABORT_WITHIN_SECS


def _interruptible(frame: FrameType | None) -> bool:
    """Whether the main thread, running ``frame``, may take a ``KeyboardInterrupt`` there.

    Yes in the user's code (the innermost frame outside the standard library and
    the installed packages is not the machinery's) and in the event loop waiting
    for I/O; no inside the event loop, anyio or this library, whose state it
    could leave half updated, nor in a package that one of them called (a
    summary writer half made in tensorboardX's code). A package the user's code
    called (numpy in a step) is the user's: the user's frame comes first.
    """
    if frame is None or _idle_in_select(frame):
        return True
    current: FrameType | None = frame
    while current is not None:
        top = str(current.f_globals.get("__name__", "")).partition(".")[0]
        if top in _MACHINERY or top.startswith("monitored_"):
            return False
        if top not in sys.stdlib_module_names and not _installed(current):
            return True
        current = current.f_back
    return True


def _installed(frame: FrameType) -> bool:
    """Whether ``frame`` runs an installed package's code (from ``site-packages``)."""
    filename = frame.f_code.co_filename
    return any(f"{os.sep}{where}{os.sep}" in filename for where in _INSTALLED_DIRS)


def _idle_in_select(frame: FrameType) -> bool:
    """Whether ``frame`` is asyncio's loop waiting in ``select``: nothing is half done there."""
    caller = frame.f_back
    return (
        frame.f_code.co_name == "select"
        and frame.f_globals.get("__name__") == "selectors"
        and caller is not None
        and caller.f_code.co_name == "_run_once"
        and caller.f_globals.get("__name__") == "asyncio.base_events"
    )


@final
class _Abort:
    """A ``KeyboardInterrupt`` waiting for the main thread to leave the machinery.

    A daemon thread interrupts the main thread with ``kick`` every
    :data:`_KICK_SECS`; the handler raises the interrupt at the first point that
    may take it, or anywhere once :data:`ABORT_WITHIN_SECS` have passed.
    """

    #: The abort waiting to be raised, if any (one per process: it ends the process).
    pending: _Abort | None = None

    __slots__ = ("_deadline", "_kick", "_previous")

    def __init__(self, kick: signal.Signals) -> None:
        self._kick = kick
        self._deadline = time.monotonic() + _abort_within()
        self._previous: Handler = signal.signal(kick, self._handle)

    def start(self) -> None:
        """Start interrupting the main thread (once this abort is the pending one).

        A bare ``_thread`` thread: ``threading.Thread.start`` takes the threading
        module's own locks, which the interrupted code may be holding (starting
        an anyio worker thread, say), and the interpreter does not wait for it at exit.
        """
        _thread.start_new_thread(self._interrupt, (threading.main_thread().ident,))

    def _interrupt(self, main: int | None) -> None:
        """Interrupt the main thread until the abort is raised (or the process ends)."""
        while _Abort.pending is self and main is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, self._kick)
            time.sleep(_KICK_SECS)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if _Abort.pending is not self:
            return
        if _interruptible(frame) or time.monotonic() >= self._deadline:
            _Abort.pending = None
            signal.signal(self._kick, self._previous)
            raise KeyboardInterrupt


@final
class _Repeat:
    """The abort again while the event loop it interrupted runs on.

    The ``KeyboardInterrupt`` unwinds the program, and the event loop's runner
    cancels what is left; a clean-up that never ends (shielded from cancellation,
    waiting for a thread or a task the interrupt cut off) would keep the process
    alive. While that loop still runs, a bare thread sends the main thread SIGINT
    every :data:`ABORT_REPEAT_SECS`: each raises a ``KeyboardInterrupt`` (the
    session's handler, asyncio's or Python's), until the loop is closed. A program
    not in an event loop, or one whose loop ends, is left alone.
    """

    #: The loop being watched, if any (one per process: the abort ends it).
    loop: Any = None

    @classmethod
    def start(cls, frame: FrameType | None) -> None:
        """Watch the event loop running ``frame`` (if any), once per process."""
        loop = _running_loop(frame)
        if loop is None or cls.loop is not None:
            return
        main = threading.main_thread().ident
        if main is None or not hasattr(signal, "pthread_kill"):  # pragma: no cover
            return
        cls.loop = loop
        _thread.start_new_thread(cls._watch, (loop, main, _abort_repeat()))

    @classmethod
    def _watch(cls, loop: Any, main: int, every: float) -> None:
        due = time.monotonic() + every
        while not loop.is_closed():
            time.sleep(min(every, 0.1))
            if time.monotonic() < due or not loop.is_running():
                continue
            _say("monitored-checkpoint: still not ended: interrupting again")
            # A Runner's handler (the sessions' put back) needs two to raise.
            for _ in range(2 if _runners(signal.getsignal(signal.SIGINT)) else 1):
                with contextlib.suppress(OSError, ValueError):
                    signal.pthread_kill(main, signal.SIGINT)
                time.sleep(_KICK_SECS * 10)
            due = time.monotonic() + every
        cls.loop = None


def _running_loop(frame: FrameType | None) -> Any:
    """The asyncio event loop whose ``run_forever`` is on ``frame``'s stack, if any."""
    current = frame
    while current is not None:
        if (
            current.f_code.co_name == "run_forever"
            and current.f_globals.get("__name__") == "asyncio.base_events"
        ):
            return current.f_locals.get("self")
        current = current.f_back
    return None
