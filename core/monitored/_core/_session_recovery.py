"""Creating a session, and re-creating it after ``AbortedError``/``UnavailableError``.

``Recovery`` is the part of :class:`~monitored.MonitoredSession` that creates the
session (restore or initialize on the chief, share the state, wait on a worker,
``after_create_session``) and, as TF1, re-creates it and retries the step after a
recoverable error, whether raised by a step or held by the coordinator (see
``_session.py``). A process of a cluster never recovers alone.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final, cast

from ._calling import HookCall
from ._cluster import Cluster, LocalCluster
from ._coordinator import Coordinator
from ._errors import AbortedError, UnavailableError
from ._scaffold import SessionManager
from ._state import TrainState

if TYPE_CHECKING:
    from ._session import MonitoredSession

if TYPE_CHECKING:
    pass

__all__ = ["RECOVERABLE", "Recovery"]

log = logging.getLogger("monitored")

#: Errors after which the session is re-created and the step retried.
RECOVERABLE: Final = (AbortedError, UnavailableError)


class Recovery:
    """Creates the session and re-creates it after a recoverable error (a part of
    ``MonitoredSession``)."""

    _state: TrainState
    _cluster: Cluster
    _coord: Coordinator
    _session_manager: SessionManager
    _max_wait_secs: float
    _stop_grace_period_secs: float
    _busy: bool
    _deferred: list[Any]
    _step_calls: tuple[tuple[HookCall, ...], tuple[HookCall, ...]]
    _created_once: bool
    _recoverable: bool
    _recoveries: int
    _max_recoveries: int | None
    restored_from: Any

    if TYPE_CHECKING:

        @property
        def is_chief(self) -> bool: ...

        async def call_hook(self, hook: str, *args: Any) -> list[Any]: ...

        async def _run_deferred(self) -> None: ...

        def _set_step_calls(
            self, before: tuple[HookCall, ...], after: tuple[HookCall, ...]
        ) -> None: ...

        def _agree_to_stop_now(self, local: bool, requested_by: str | None = None) -> bool: ...

    # -- creating the session -----------------------------------------------------------------
    async def _create_with_recovery(self, *, recreating: bool) -> None:
        """Create the session, retrying after ``AbortedError``/``UnavailableError``."""
        while True:
            try:
                await self._create_session(recreating=recreating)
                return
            except RECOVERABLE as exc:
                if not self._may_recover(exc):
                    raise

    async def _create_session(self, *, recreating: bool) -> None:
        session = cast("MonitoredSession", self)  # this part of one
        self._busy = True  # hooks run below: `run` from them is refused
        try:
            if self.is_chief:
                self.restored_from = await self._session_manager.prepare_session(
                    session, recreating=recreating
                )
            await self._cluster.share_state(session, self._max_wait_secs)
            if not self.is_chief:
                await self._session_manager.wait_for_session(session, self._max_wait_secs)
            self._state.finalize()
            # The global step may have gone back (a restore): no hook stays skipped.
            self._set_step_calls(*self._step_calls)
            await self.call_hook("after_create_session", self, self._coord)
            await self._run_deferred()
            if not isinstance(self._cluster, LocalCluster):
                # A stop asked for while the session was created (StopAtStepHook of a
                # run resumed at its last step) holds before the first step, on every
                # process alike: they agree on it now.
                self._agree_to_stop_now(self._coord._stopped)
            self._created_once = True
        finally:
            self._deferred.clear()
            self._busy = False

    def _may_recover(self, exc: BaseException) -> bool:
        """Count a recovery after ``exc``; ``False`` if no more are allowed."""
        self._recoveries += 1
        if not self._recoverable or (
            self._max_recoveries is not None and self._recoveries > self._max_recoveries
        ):
            return False
        if not isinstance(self._cluster, LocalCluster):
            exc.add_note(
                "Not recovered: this process trains with others, which are already past "
                "this step or waiting in its collectives; one process cannot re-create "
                "its session alone, so the job ends (every process); restart it to "
                "resume from the last checkpoint"
            )
            return False
        log.warning(
            "%s at step %d: re-creating the session and retrying (recovery %d): %s",
            type(exc).__name__,
            self._state.global_step,
            self._recoveries,
            exc,
        )
        return True

    async def _recover(self, exc: BaseException) -> bool:
        """Re-create the session after ``exc``; ``False`` if recovery is not allowed."""
        if not self._may_recover(exc):
            return False
        # As TF1 gives each incarnation a new coordinator: the tasks hooks started
        # for the old one stop, and after_create_session starts them afresh.
        coord = self._coord
        coord._cancel_tasks()
        if coord._stopped:
            # A recoverable error reported to the coordinator (a lost peer, an input
            # service gone): the old incarnation's threads are stopped and joined,
            # and the coordinator starts clean.
            with contextlib.suppress(Exception):
                await coord.join(
                    stop_grace_period_secs=self._stop_grace_period_secs,
                    ignore_live_threads=True,
                )
            coord.clear_stop()
        await self._create_with_recovery(recreating=True)
        return True

    def _recovery_pending(self) -> bool:
        """Whether the coordinator holds a recoverable error this session will recover from."""
        return (
            self._recoverable
            and isinstance(self._coord._exc, RECOVERABLE)
            and isinstance(self._cluster, LocalCluster)
            and (self._max_recoveries is None or self._recoveries < self._max_recoveries)
        )

    def _cause(self, exc: BaseException) -> BaseException | None:
        """The recoverable error behind ``exc``: itself, or the one the coordinator holds.

        A step that fails because the coordinator stopped (a cancelled wait, a closed
        queue) hides the root cause; as TF1, the coordinator's recoverable error is
        what counts.
        """
        if isinstance(exc, RECOVERABLE):
            return exc
        held = self._coord._exc
        return held if isinstance(held, RECOVERABLE) else None

    async def _recover_if_pending(self) -> None:
        if self._coord._stopped and self._recovery_pending():
            held = self._coord._exc
            assert held is not None
            await self._recover(held)
