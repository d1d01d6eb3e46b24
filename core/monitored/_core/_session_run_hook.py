"""``SessionRunHook``: TF1's hook base class, optional here.

Any object whose methods are named after hookspecs is a hook; subclassing
``SessionRunHook`` only documents the intent and gives no-op defaults. Those
defaults are not registered as implementations, so a subclass that overrides
only ``after_run`` costs one call per step, not five.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from ._coordinator import Coordinator
    from ._run import SessionRunArgs, SessionRunContext, SessionRunValues
    from ._session import MonitoredSession

__all__ = ["SessionRunHook"]

#: What an event returns: nothing, or an awaitable when the hook is async.
_Done: TypeAlias = "Awaitable[None] | None"


class SessionRunHook:
    """Base class for hooks; override the events you need (sync or ``async def``)."""

    __slots__ = ()

    def begin(self, session: MonitoredSession) -> _Done:
        """Called once before the session is created."""
        return None

    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> _Done:
        """Called when the state is ready, before the first step."""
        return None

    def before_run(
        self, run_context: SessionRunContext
    ) -> SessionRunArgs | Awaitable[SessionRunArgs | None] | None:
        """Called before each step; may return :class:`~monitored.SessionRunArgs`."""
        return None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> _Done:
        """Called after each step with this hook's fetched values."""
        return None

    def end(self, session: MonitoredSession) -> _Done:
        """Called once when training ends normally."""
        return None
