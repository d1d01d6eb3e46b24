"""What passes between the session and its hooks around one step.

``SessionRunArgs`` is a hook's request (values to fetch, feeds to add),
``SessionRunContext`` the step as the hooks see it (and where they request a
stop), ``SessionRunValues`` the answer to one hook's request.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, final

from ._scalars import ScalarOutputs

if TYPE_CHECKING:
    from ._session import MonitoredSession

__all__ = ["Fetches", "RunOptions", "SessionRunArgs", "SessionRunContext", "SessionRunValues"]

#: A fetch structure: a name (a step output or a state entry, or ``"global_step"``),
#: or a list, tuple or dict nesting names. Each hook gets its own structure back.
#: :data:`~monitored.SCALAR_OUTPUTS` alone stands for every scalar output of the step.
Fetches = str | list[Any] | tuple[Any, ...] | Mapping[str, Any] | ScalarOutputs | None


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

    ``lag=1`` asks for the values **one step late**: this step's values reach the
    hook's ``after_run`` of the *next* step (and, after the last step, once more
    when the session stops, so none is dropped). On CuPy their device-to-host copy
    then runs while the next step computes, so the hook never makes the step wait
    for the device. For watchers (NaN guards, progress) that can act a step late.
    """

    __slots__ = ("feeds", "fetches", "lag", "options")

    def __init__(
        self,
        fetches: Fetches = None,
        feeds: Mapping[str, Any] | None = None,
        options: RunOptions | None = None,
        *,
        feed_dict: Mapping[str, Any] | None = None,
        lag: Literal[0, 1] = 0,
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
        if lag != 0 and lag != 1:
            raise ValueError(
                f"SessionRunArgs lag must be 0 (values in this step's after_run) or 1 (in "
                f"the next step's), got {lag!r}"
            )
        self.fetches: Fetches = fetches
        #: 0: the values reach this step's ``after_run``; 1: the next step's.
        self.lag: Literal[0, 1] = 1 if lag else 0
        self.feeds: Mapping[str, Any] | None = feeds
        self.options: RunOptions | None = options

    @property
    def feed_dict(self) -> Mapping[str, Any] | None:
        """TF1's name for :attr:`feeds`."""
        return self.feeds

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SessionRunArgs):
            return NotImplemented
        return (self.fetches, self.feeds, self.options, self.lag) == (
            other.fetches,
            other.feeds,
            other.options,
            other.lag,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lag = f", lag={self.lag}" if self.lag else ""
        return (
            f"SessionRunArgs(fetches={self.fetches!r}, feeds={self.feeds!r}, "
            f"options={self.options!r}{lag})"
        )


class SessionRunValues(NamedTuple):
    """The answer to one hook's :class:`SessionRunArgs`, passed to ``after_run``.

    ``results`` has the structure of the hook's fetches with host (NumPy) values,
    or is ``None`` when the hook asked for nothing (or, with ``lag=1``, when no
    earlier step's values are due). ``options`` and ``run_metadata`` are the
    hook's :class:`RunOptions` and the step's :class:`~monitored.StepTrace` when it
    asked for a trace, else ``None``.
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
    """The qualified name of the function ``depth`` frames up (for "stop requested by").

    Private helpers (``EarlyStoppingHook._decide``) are passed over for the
    public method that called them (``EarlyStoppingHook.after_run``), a few
    frames up at most: that is the name a user recognizes.
    """
    try:
        frame = sys._getframe(depth)
    except ValueError:  # pragma: no cover - called from the outermost frame
        return "<unknown>"
    first = frame.f_code.co_qualname
    for _ in range(4):
        name = frame.f_code.co_name
        if not name.startswith("_") or name.endswith("__"):
            return frame.f_code.co_qualname
        if frame.f_back is None:
            break
        frame = frame.f_back
    return first
