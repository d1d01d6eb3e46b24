"""Interpreter exit: anyio's worker threads of an event loop that is gone never hold it up.

anyio runs ``to_thread.run_sync`` calls (the library's blocking work: flushing
summaries, joining the coordinator's threads, waiting for a profiler) in
worker threads that are *not* daemon threads, and stops each from a done
callback of the event loop's root task. When a ``KeyboardInterrupt`` escapes
the loop while ``asyncio.run``/``anyio.run`` cancels the remaining tasks (a
second Ctrl-C that lands in a task during that clean-up, say), the loop is
closed before those callbacks run: the idle workers then wait for work forever,
and the interpreter, which joins every non-daemon thread before it exits, with
them. So when the interpreter starts to shut down (``threading``'s exit
callbacks run before it joins the threads), each worker of a *closed* loop is
told to stop, as the callback would have: an idle one ends at once, a busy one
once its call returns. Workers of a loop that is still open (one running in
another thread) are left alone.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from typing import Any

__all__ = ["install", "stop_orphaned_workers"]

_installed = False


def stop_orphaned_workers() -> int:
    """Tell every anyio worker thread whose event loop is closed to stop; how many were told.

    anyio's worker class and its attributes (``loop``, ``queue``; ``None`` in the
    queue is the stop command) are private, so each is looked up and a worker
    without them is skipped rather than failed on.
    """
    backend = sys.modules.get("anyio._backends._asyncio")
    worker_type: Any = getattr(backend, "WorkerThread", None)
    if not isinstance(worker_type, type):
        return 0
    told = 0
    for thread in threading.enumerate():
        if not isinstance(thread, worker_type) or not thread.is_alive():
            continue
        loop: Any = getattr(thread, "loop", None)
        work: Any = getattr(thread, "queue", None)
        if loop is None or not isinstance(work, queue.Queue) or not loop.is_closed():
            continue
        with contextlib.suppress(queue.Full):
            work.put_nowait(None)
            told += 1
    return told


def install() -> None:
    """Have :func:`stop_orphaned_workers` run when the interpreter starts to exit (once).

    ``threading._register_atexit`` (CPython's, what ``concurrent.futures`` uses
    for its own workers): ``atexit`` functions run only after the non-daemon
    threads were joined, which is too late.
    """
    global _installed
    if _installed:
        return
    register: Any = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it since 3.9
        return
    with contextlib.suppress(RuntimeError):  # imported while the interpreter exits
        register(stop_orphaned_workers)
        _installed = True
