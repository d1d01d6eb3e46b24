"""``TaskHost``: a session's background work, hosted by a task of the session's own.

A session owns background work: the loop watchdog, the tasks hooks start with
:meth:`Coordinator.start_soon`. That work needs an anyio task group, and a task
group belongs to the task that entered it: entered in ``__aenter__`` and left in
``close``, it tied the session to the task that opened it (two sessions closed in
the order they were opened, a close from another task, or from a later notebook
cell, failed with anyio's "cancel scope" ``RuntimeError``).

So the task group lives in a task of its own, started on the running event loop
for the session and ended by :meth:`TaskHost.stop`: the session can be opened,
run and closed from any task of that loop, in any order relative to other
sessions. The host task is an asyncio task (``loop.create_task``) or a trio
system task (``trio.lowlevel.spawn_system_task``), started in a copy of the
opener's context (so context variables read by background work are the
opener's, as before). anyio has no public "task outside any task group" call;
these two are what its backends offer for it.

Cancellation stays with the caller: cancelling the task that opened the session
(a ``move_on_after``, Ctrl-C reaching the main task) cancels what that task
awaits, and the session's close (always run by ``__aexit__``) stops the host.
If the loop itself ends with a session left open, the host is cancelled with
the loop's other tasks (asyncio) or with the system nursery (trio), and the
session's next use raises :class:`~monitored.EventLoopEndedError`.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Coroutine
from typing import Any, final

import anyio
import anyio.abc

from ._errors import EventLoopEndedError

__all__ = ["TaskHost"]

_LOOP_ENDED = (
    "the event loop this session was opened in ended while the session was open, and its "
    "background work with it; close the session (`await sess.close()`) and open a new one "
    "in the running loop (a notebook runs every cell in one asyncio loop, unless IPython's "
    "`%autoawait trio` runs each cell in a trio.run of its own)"
)


@final
class TaskHost:
    """Hosts an anyio task group in a task started for it on the running loop.

    ``on_error`` is told of an exception that escapes the task group while it
    runs (a hosted task raised past its own guard), so that the session stops at
    its next step boundary; :meth:`stop` raises it too, as leaving the task
    group did.
    """

    __slots__ = ("_done", "_error", "_on_error", "_stopping", "_task", "_task_group")

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error
        self._task_group: anyio.abc.TaskGroup | None = None
        self._done: anyio.Event | None = None
        self._error: BaseException | None = None
        #: Set by stop(): a cancellation of the host after it is stop's, not the loop's end.
        self._stopping = False
        #: The asyncio host task, kept referenced (the loop keeps only weak references).
        self._task: asyncio.Task[None] | None = None

    @property
    def task_group(self) -> anyio.abc.TaskGroup | None:
        """The hosted task group while the host runs (``None`` before and after)."""
        return self._task_group

    async def start(self) -> anyio.abc.TaskGroup:
        """Start the host task and return its task group once it is entered."""
        if self._done is not None:
            raise RuntimeError("a TaskHost is started only once")
        ready = anyio.Event()
        self._done = anyio.Event()
        self._task = _spawn(self._host(ready))
        # Shielded: the host starts at the loop's next turn, and an opener cancelled
        # meanwhile must still get the task group, so that its close stops the host.
        with anyio.CancelScope(shield=True):
            await ready.wait()
        if self._task_group is None:  # the host ended before it entered its task group
            raise RuntimeError("the session's background task ended before it started")
        return self._task_group

    async def stop(self) -> None:
        """Cancel the hosted tasks and wait until the host has ended, from any task.

        Shielded from the caller's cancellation (the wait is one loop turn or the
        hosted tasks' own clean-up), so a cancelled close still leaves nothing
        running. Raises what escaped the task group, if anything did.
        """
        if self._done is None:
            return
        self._stopping = True
        task_group = self._task_group
        if task_group is not None:
            task_group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._done.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error

    async def _host(self, ready: anyio.Event) -> None:
        assert self._done is not None
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                ready.set()
                await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            # The loop is ending with the session open (asyncio.run's clean-up, trio's
            # system nursery): whoever uses the session next is told, not left hanging.
            if not self._stopping:
                self._on_error(EventLoopEndedError(_LOOP_ENDED))
            raise
        except BaseException as exc:  # what a hosted task raised past its own guard
            self._error = exc
            self._on_error(exc)
        finally:
            self._task_group = None
            ready.set()
            self._done.set()


def _spawn(host: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``host`` as a task of the running loop that no task group holds.

    Returns the asyncio task (``None`` on trio, whose run keeps its system tasks).
    """
    context = contextvars.copy_context()
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass  # trio is imported, but this loop is asyncio's
        else:

            async def system_task() -> None:
                await host

            trio.lowlevel.spawn_system_task(system_task, name="monitored session", context=context)
            return None
    return asyncio.get_running_loop().create_task(host, name="monitored session", context=context)
