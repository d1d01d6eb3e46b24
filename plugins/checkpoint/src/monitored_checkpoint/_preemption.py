"""``SignalWatcher``: SIGTERM or a first SIGINT become a request to save and stop.

Clusters preempt a job with SIGTERM (then SIGKILL after a grace period); a
person stops one with Ctrl-C. While a session runs, the watcher turns the first
of these signals into a flag that the checkpoint hook reads at the next step
boundary: the current step finishes, a checkpoint of it is saved, ``end`` runs
and the session closes normally. A SIGINT after that aborts, as Ctrl-C did
before the session: it goes to the program's own handler when there is one
(``asyncio.run``'s cancels the main task; a Jupyter kernel's cancels the running
cell), and raises ``KeyboardInterrupt`` otherwise. Raised from a handler, the
``KeyboardInterrupt`` lands wherever the main thread is, which in a kernel is
often its event loop, and that kills the kernel. A repeated SIGTERM is ignored,
the save being under way already.

Plain ``signal.signal`` handlers, not ``anyio.open_signal_receiver``: a receiver
is a task, and tasks do not run while a loop of synchronous steps never yields
to the event loop; and asyncio resets a removed handler to the default rather
than to the one that was there before. The handler only sets an attribute (and
writes a line to stderr), which is safe at any point of the main thread; the
previous handlers are put back when the session ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Final, final

__all__ = ["DEFAULT_SIGNALS", "SignalWatcher"]

log = logging.getLogger("monitored.checkpoint")

#: The signals that ask for a save and a clean stop.
DEFAULT_SIGNALS: Final = tuple(
    s for s in (getattr(signal, "SIGTERM", None), signal.SIGINT) if s is not None
)

Handler = Callable[[int, FrameType | None], Any] | int | None


#: The watchers of every open session, and the handlers that were in place
#: before the first of them: one process-wide handler serves them all, so
#: sessions that overlap each get the signal and, when the last closes, the
#: original handlers come back whatever the order of closing.
_active: list[SignalWatcher] = []
_original: dict[signal.Signals, Handler] = {}


def _dispatch(signum: int, frame: FrameType | None) -> None:
    for watcher in list(_active):
        if signum in watcher._signals:
            watcher._handle(signum, frame)


@final
class SignalWatcher:
    """Records the first preemption signal; put in place from the main thread only."""

    __slots__ = ("_signals", "received")

    def __init__(self, signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
        self._signals = tuple(signals)
        #: The first signal received, or ``None``.
        self.received: signal.Signals | None = None

    @property
    def installed(self) -> bool:
        """Whether this watcher receives signals."""
        return self in _active

    def install(self) -> bool:
        """Start receiving signals; ``False`` (and nothing done) off the main thread."""
        if self.installed:
            return True
        self.received = None
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

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            _say(
                f"monitored-checkpoint: {self.received.name} received; finishing the current "
                "step, saving a checkpoint and stopping"
                + (" (Ctrl-C again to abort)" if signal.SIGINT in self._signals else "")
            )
            return
        if signum == signal.SIGINT:
            previous = _original.get(signal.SIGINT)
            self.uninstall()
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signum, frame)
                return
            raise KeyboardInterrupt
        # A repeated SIGTERM: the save it asks for is under way already.


def _say(line: str) -> None:
    """Write to stderr without the locks of ``print`` or ``logging`` (signal-safe)."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())
