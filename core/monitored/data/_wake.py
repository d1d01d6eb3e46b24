"""Waking a task of the event loop from a worker thread, without waiting for it.

``anyio.from_thread.run_sync`` blocks the calling thread until the event loop has
run the function: a producer thread would then stall while the loop runs a
step. The native loops both offer a non-blocking hand-off (asyncio's
``call_soon_threadsafe``, trio's ``run_sync_soon``), used here; anyio's blocking
call remains the fallback for any other backend.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["LoopWaker"]


class LoopWaker:
    """Sets ``anyio.Event`` objects of one event loop, from its thread or any other."""

    __slots__ = ("_soon", "_thread", "_token")

    def __init__(self) -> None:
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.get_ident()
        native: Any = self._token.native_token
        self._soon: Any = getattr(native, "call_soon_threadsafe", None) or getattr(
            native, "run_sync_soon", None
        )

    def set(self, event: anyio.Event) -> None:
        """``event.set()`` in the event loop (at once when called from its thread)."""
        if threading.get_ident() == self._thread:
            event.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            if self._soon is not None:
                self._soon(event.set)
            else:  # pragma: no cover - a backend other than asyncio and trio
                anyio.from_thread.run_sync(event.set, token=self._token)
