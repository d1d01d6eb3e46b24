"""Test helpers for hook and plugin authors: run a real session around a hook.

``run_session`` drives a :class:`~monitored.MonitoredSession` with the given hooks
and step function until it stops (or ``max_steps``), and reports what happened.
The same helper is offered to pytest as the ``monitored_run`` fixture
(``monitored.pytest_plugin``, registered through ``pytest11``), the way pytest
ships ``pytester``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

from ._core._session import MonitoredSession
from ._core._state import TrainState

__all__ = ["SessionResult", "counting_step", "record_step_calls", "run_session"]


def counting_step(state: TrainState, **feeds: Any) -> dict[str, Any]:
    """A step that only advances the global step; its outputs are the feeds."""
    state.global_step += 1
    return dict(feeds)


def record_step_calls(hook: Any) -> list[int]:
    """The global steps at which the session calls ``hook.before_run``, as it runs.

    Replaces ``before_run`` on the ``hook`` object by a wrapper that appends the
    global step the step starts at to the returned list, then calls the
    original; call it before the session starts. For testing a hook's schedule:
    that a hook due every ``N`` steps is called only then
    (``session.skip_step_hooks``).
    """
    before_run = hook.before_run
    steps: list[int] = []

    @functools.wraps(before_run)
    def recording(run_context: Any) -> Any:
        steps.append(run_context.session.state.global_step)
        return before_run(run_context)

    hook.before_run = recording
    return steps


@final
@dataclass(slots=True)
class SessionResult:
    """What :func:`run_session` observed."""

    state: TrainState
    session: MonitoredSession
    #: How often each event of the session's own lifecycle ran, by hook name.
    events: Counter[str] = field(default_factory=Counter)
    #: Every step's outputs, in order.
    outputs: list[Mapping[str, Any]] = field(default_factory=list)


class _EventCounter:
    """Counts the five session events; registered first, so it sees every call."""

    def __init__(self, events: Counter[str]) -> None:
        self.events = events

    def begin(self) -> None:
        self.events["begin"] += 1

    def after_create_session(self) -> None:
        self.events["after_create_session"] += 1

    def before_run(self) -> None:
        self.events["before_run"] += 1

    def after_run(self) -> None:
        self.events["after_run"] += 1

    def end(self) -> None:
        self.events["end"] += 1


async def run_session(
    hooks: Iterable[object],
    step_fn: Callable[..., Any] = counting_step,
    *,
    max_steps: int = 1000,
    state: TrainState | None = None,
    **session_kwargs: Any,
) -> SessionResult:
    """Run ``step_fn`` in a session with ``hooks`` until it stops, at most ``max_steps``.

    Exceptions propagate exactly as they would in training. Installed plugins are
    loaded as usual; pass ``disable_plugins=[...]`` to leave some out.
    """
    state = state if state is not None else TrainState()
    events: Counter[str] = Counter()
    session = MonitoredSession(state, hooks=[_EventCounter(events), *hooks], **session_kwargs)
    result = SessionResult(state, session, events)
    async with session:
        for _ in range(max_steps):
            if session.should_stop():
                break
            result.outputs.append(await session.run(step_fn))
    return result
