"""Noticing a hook or step function that holds the event loop.

Synchronous hooks and step functions run on the event loop's thread: while one
runs, no other task does (other sessions, input producers, a cluster's
heartbeat, a progress display). A hook that sleeps or waits on I/O for a second
stalls them all, and nothing says so. :class:`LoopWatchdog` says so, once.

It costs the step loop nothing: no clock is read per hook call. A task of the
session notes the time whenever the loop runs it (every quarter of the
threshold), and a daemon thread compares that time with the clock. When the
loop has not come back for longer than the threshold, the thread looks at the
Python stack of the loop's thread (``sys._current_frames``), finds what the
session called that is still running (a hook, a step function, a deferred
callback) and logs one warning naming it, how long it has held the loop, and
the fix: run the blocking work with ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Final, final

# Bound at import: a test that patches ``anyio.sleep`` to fake the passing of
# time (as tests of waiting hooks do) must not drive the watchdog's beat too.
from anyio import sleep

from .. import hookspecs
from ._plugins import PluginInfo

__all__ = [
    "BLOCKED_LOOP_ENV",
    "DEFAULT_BLOCKED_LOOP_SECS",
    "FROM_ENV",
    "LoopWatchdog",
    "blocked_loop_threshold",
    "describe_culprit",
]

log = logging.getLogger("monitored")

#: Seconds a hook or step may hold the event loop before the session warns; ``0``
#: or ``off`` switches the warning off (the session's argument wins over it).
BLOCKED_LOOP_ENV: Final = "MONITORED_BLOCKED_LOOP_WARNING_SECS"
#: The default threshold: ten times asyncio's own ``slow_callback_duration``
#: (0.1 s, its debug mode's limit for one callback), because training steps of a
#: tenth of a second are normal, while a loop held for a whole second already
#: stalls what shares it (a progress display, an input producer, a heartbeat).
DEFAULT_BLOCKED_LOOP_SECS: Final = 1.0

_OFF: Final = frozenset({"0", "off", "none", "false", "no"})


@final
class _FromEnv:
    """The default of ``blocked_loop_warning_secs``: the environment's, else 1 s.

    A marker of its own (not the number 1.0) so that a threshold given
    explicitly always wins over the environment, whatever its value.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"FROM_ENV ({BLOCKED_LOOP_ENV}, else {DEFAULT_BLOCKED_LOOP_SECS} s)"


#: The default of every ``blocked_loop_warning_secs`` argument (see :class:`_FromEnv`).
FROM_ENV: Final[Any] = _FromEnv()


def blocked_loop_threshold(given: float | None) -> float | None:
    """The threshold in seconds (``None``: off): ``given``, else the environment's.

    ``given`` is :data:`FROM_ENV` when the caller gave no value: then
    ``MONITORED_BLOCKED_LOOP_WARNING_SECS`` decides, else the 1 s default. Raises
    ``ValueError`` for a negative value or a variable that is not a number or ``off``.
    """
    use_env = given is FROM_ENV
    if use_env:
        given = DEFAULT_BLOCKED_LOOP_SECS
    raw = os.environ.get(BLOCKED_LOOP_ENV, "").strip() if use_env else ""
    if raw.lower() in _OFF:
        return None
    if raw:
        try:
            given = float(raw)
        except ValueError:
            raise ValueError(
                f"{BLOCKED_LOOP_ENV}={raw!r}: give a number of seconds, or 0 or off to switch "
                "the warning off"
            ) from None
    if given is None or given == 0:
        return None
    if isinstance(given, bool) or not isinstance(given, int | float) or not given > 0:
        raise ValueError(
            f"blocked_loop_warning_secs must be a positive number of seconds, or None or 0 to "
            f"switch the warning off; got {given!r}"
        )
    return float(given)


@final
class LoopWatchdog:
    """Warns once when the event loop does not come back for ``threshold`` seconds.

    ``describe`` turns the loop thread's innermost frame into a phrase naming
    what holds the loop. Start :meth:`run` as a task of the loop to watch; the
    watch ends when that task is cancelled.
    """

    __slots__ = ("_beat", "_describe", "_interval", "_loop_thread", "_stop", "threshold")

    def __init__(self, threshold: float, describe: Callable[[FrameType | None], str]) -> None:
        self.threshold = threshold
        self._describe = describe
        self._interval = threshold / 4
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()

    async def run(self) -> None:
        """Note the time whenever the loop runs this task, while a thread watches it."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        watcher = threading.Thread(target=self._watch, name="monitored loop watchdog", daemon=True)
        watcher.start()
        try:
            while True:
                self._beat = time.monotonic()
                await sleep(self._interval)
        finally:
            # The thread wakes at once and ends: no watchdog outlives its session.
            self._stop.set()
            watcher.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            # The beat task sleeps one interval between beats: beyond that, the loop was held.
            held = time.monotonic() - self._beat - self._interval
            if held < self.threshold:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            try:
                culprit = self._describe(frame)
            finally:
                del frame
            log.warning(
                "%s has held the event loop for %.1f s (still running), and no other task "
                "ran meanwhile (other sessions, input producers, a progress display, a "
                "cluster's heartbeat). Run blocking work in a thread: `await "
                "anyio.to_thread.run_sync(fn, ...)` from an async hook or step. This is "
                "said once per session, when the loop is held longer than %.1f s "
                "(blocked_loop_warning_secs=None, or %s=off, turns it off).",
                culprit,
                held,
                self.threshold,
                BLOCKED_LOOP_ENV,
            )
            return


#: The session's functions that call step functions (the rest call hooks or callbacks).
_STEP_CALLERS: Final = frozenset({"_run_hooked", "_finish_traced", "run_step_fn", "run"})


def describe_culprit(frame: FrameType | None, infos: Iterable[PluginInfo]) -> str:
    """Name what the session called that is running in ``frame`` (the loop's innermost).

    The outermost frame outside the core below the first core frame is what the
    session called: matched against the hooks and plugins of ``infos`` (by the
    code object of their attribute of that name), else a step function or a
    deferred callback, by the session function that called it.
    """
    callee: FrameType | None = None
    caller: FrameType | None = None
    current = frame
    while current is not None:
        if str(current.f_globals.get("__name__", "")).startswith("monitored._core."):
            if callee is not None:
                caller = current
                break
        else:
            callee = current
        current = current.f_back
    if callee is None or caller is None:
        return f"code outside the session ({_where(frame)})" if frame else "the event loop's thread"
    name = callee.f_code.co_name
    for info in infos:
        attr = inspect.getattr_static(info.plugin, name, None)
        if isinstance(attr, staticmethod | classmethod):
            attr = attr.__func__
        if getattr(attr, "__code__", None) is callee.f_code:
            kind = "hook" if name in hookspecs.__all__ else "function"
            return f"{kind} {name!r} of {info.describe()}"
    if caller.f_code.co_name == "_run_deferred":
        return f"callback {_where(callee)}, deferred with call_after_hooks"
    if caller.f_code.co_name in _STEP_CALLERS:
        return f"step function {_where(callee)}"
    return f"{_where(callee)}, called by the session's {caller.f_code.co_name}"


def _where(frame: FrameType) -> str:
    """``module.qualname`` of ``frame``'s code, with its line."""
    module = frame.f_globals.get("__name__", "?")
    return f"{module}.{frame.f_code.co_qualname} (line {frame.f_lineno})"
