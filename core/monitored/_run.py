"""What passes between the session and its hooks around one step.

``SessionRunArgs`` is a hook's request (values to fetch, feeds to add),
``SessionRunContext`` the step as the hooks see it (and where they request a
stop), ``SessionRunValues`` the answer to one hook's request.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, final

if TYPE_CHECKING:
    from ._session import MonitoredSession

__all__ = ["Fetches", "RunOptions", "SessionRunArgs", "SessionRunContext", "SessionRunValues"]

#: A fetch structure: a name (a step output or a state entry, or ``"global_step"``),
#: or a list, tuple or dict nesting names. Each hook gets its own structure back.
Fetches = str | list[Any] | tuple[Any, ...] | Mapping[str, Any] | None


@final
class RunOptions:
    """How a hook asks the coming step to run: TF1's ``RunOptions``, for ``monitored``.

    ``trace=True`` records the step as the session sees it (each hook call, the step
    function, the batched fetch) and hands the :class:`~monitored.StepTrace` to the
    asking hook as ``run_values.run_metadata``; ``show_memory=True`` adds the state's
    memory before and after the step. ``ProfilerHook`` asks for it every N steps.
    """

    __slots__ = ("show_memory", "trace")

    def __init__(self, trace: bool = False, show_memory: bool = False) -> None:
        self.trace = trace
        self.show_memory = show_memory

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunOptions):
            return NotImplemented
        return (self.trace, self.show_memory) == (other.trace, other.show_memory)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RunOptions(trace={self.trace!r}, show_memory={self.show_memory!r})"


@final
class SessionRunArgs:
    """What a hook asks of the coming step, returned from ``before_run``.

    ``fetches`` name the values the hook wants in ``after_run`` (step outputs or
    state entries, any nesting); ``feeds`` are extra keyword arguments for the
    step function. ``feed_dict`` is accepted as TF1's name for ``feeds``.
    ``options`` is a :class:`RunOptions` (a request to trace the step); anything
    else, TF1's ``RunOptions`` protos included, is refused rather than ignored.
    """

    __slots__ = ("feeds", "fetches", "options")

    def __init__(
        self,
        fetches: Fetches = None,
        feeds: Mapping[str, Any] | None = None,
        options: RunOptions | None = None,
        *,
        feed_dict: Mapping[str, Any] | None = None,
    ) -> None:
        if feeds is not None and feed_dict is not None:
            raise TypeError("SessionRunArgs: pass feeds or feed_dict, not both")
        feeds = feed_dict if feed_dict is not None else feeds
        if feeds is not None and type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise TypeError(
                f"SessionRunArgs feeds must be a mapping of names to values, got "
                f"{type(feeds).__name__}"
            )
        if options is not None and not isinstance(options, RunOptions):
            raise TypeError(
                f"SessionRunArgs options must be a monitored.RunOptions (such as "
                f"RunOptions(trace=True)) or None, got {type(options).__name__}: TF1's "
                "RunOptions protos have no meaning here"
            )
        self.fetches: Fetches = fetches
        self.feeds: Mapping[str, Any] | None = feeds
        self.options: RunOptions | None = options

    @property
    def feed_dict(self) -> Mapping[str, Any] | None:
        """TF1's name for :attr:`feeds`."""
        return self.feeds

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SessionRunArgs):
            return NotImplemented
        return (self.fetches, self.feeds, self.options) == (
            other.fetches,
            other.feeds,
            other.options,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"SessionRunArgs(fetches={self.fetches!r}, feeds={self.feeds!r}, "
            f"options={self.options!r})"
        )


class SessionRunValues(NamedTuple):
    """The answer to one hook's :class:`SessionRunArgs`, passed to ``after_run``.

    ``results`` has the structure of the hook's fetches with host (NumPy) values,
    or is ``None`` when the hook asked for nothing. ``options`` and
    ``run_metadata`` are the hook's :class:`RunOptions` and the step's
    :class:`~monitored.StepTrace` when it asked for a trace, else ``None``.
    """

    results: Any
    options: Any = None
    run_metadata: Any = None


@final
class SessionRunContext:
    """The step being run, as hooks see it in ``before_run`` and ``after_run``."""

    __slots__ = ("_feeds", "_original_args", "_stop_requested", "session", "stop_requested_by")

    def __init__(
        self,
        original_args: SessionRunArgs | None,
        session: MonitoredSession,
        feeds: Mapping[str, Any] | None = None,
    ) -> None:
        self._original_args = original_args
        self._feeds = feeds
        #: The :class:`~monitored.MonitoredSession` running the step.
        self.session = session
        self._stop_requested = False
        #: Who called :meth:`request_stop` first (the calling function's qualified name).
        self.stop_requested_by: str | None = None

    @property
    def original_args(self) -> SessionRunArgs:
        """The caller's own arguments: ``feeds`` holds the step function's keyword arguments."""
        if self._original_args is None:
            self._original_args = SessionRunArgs(None, self._feeds)
        return self._original_args

    def request_stop(self) -> None:
        """Stop the loop after this step: every hook's ``after_run`` still runs."""
        if not self._stop_requested:
            self._stop_requested = True
            self.stop_requested_by = caller_name()

    @property
    def stop_requested(self) -> bool:
        """Whether a hook has called :meth:`request_stop` during this step."""
        return self._stop_requested


def caller_name(depth: int = 2) -> str:
    """The qualified name of the function ``depth`` frames up (for "stop requested by")."""
    try:
        return sys._getframe(depth).f_code.co_qualname
    except ValueError:  # pragma: no cover - called from the outermost frame
        return "<unknown>"
