"""The ``progress`` entry point: the progress display, on by default on the chief.

Live on an interactive terminal or in Jupyter, plain lines every
``log_every_secs`` elsewhere. ``MONITORED_PROGRESS=0`` or
``disable_plugins=["progress"]`` turns it off; workers never load it
(``chief_only``), nor do evaluation sessions (``training_only``: the training
session's display shows their results). Options: ``show``, ``every_n_steps``, ``refresh_secs``,
``log_every_secs``, ``mode``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._hook import ProgressHook, progress_enabled

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = [
    "after_create_session",
    "after_evaluate",
    "after_run",
    "before_run",
    "begin",
    "chief_only",
    "declare_options",
    "display_of",
    "end",
    "provides",
    "training_only",
]

#: The progress display, unless a ``ProgressHook`` passed in ``hooks=[...]`` takes over.
provides: Final = frozenset({"progress"})

#: Only the chief shows progress; workers print nothing.
chief_only: Final = True
#: An evaluation inside training would draw a second display over the training one.
training_only: Final = True

_hooks: dict[int, ProgressHook] = {}


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option("show", [], "outputs whose latest values are shown", type=list),
        monitored.Option("every_n_steps", 0, "refresh every this many steps (0: by time)"),
        monitored.Option("refresh_secs", 0.2, "seconds between refreshes of the live display"),
        monitored.Option("log_every_secs", 30.0, "seconds between lines without a terminal"),
        monitored.Option("mode", "auto", "auto, live, plain or off"),
    ]


def begin(session: MonitoredSession) -> None:
    if not progress_enabled():
        session.delegate_step_hooks("progress", None)  # off: no call at any step
        return
    options = session.options_for("progress")
    hook = ProgressHook(
        show=options["show"],
        every_n_steps=options["every_n_steps"],
        refresh_secs=options["refresh_secs"],
        log_every_secs=options["log_every_secs"],
        mode=options["mode"],
    )
    key = id(session)
    _hooks[key] = hook
    weakref.finalize(session, _hooks.pop, key, None)
    # The session calls the hook's before_run (one clock check) and after_run directly.
    session.delegate_step_hooks("progress", hook)


def after_create_session(session: MonitoredSession, coord: Coordinator) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        hook.after_create_session(session, coord)


def before_run(run_context: SessionRunContext) -> monitored.SessionRunArgs | None:
    hook = _hooks.get(id(run_context.session))
    return hook.before_run(run_context) if hook is not None else None


def after_run(run_context: SessionRunContext, run_values: SessionRunValues) -> None:
    hook = _hooks.get(id(run_context.session))
    if hook is not None:
        hook.after_run(run_context, run_values)


def after_evaluate(session: MonitoredSession, step: int, metrics: Mapping[str, Any]) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        hook.after_evaluate(session, step, metrics)


def end(session: MonitoredSession) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        hook.end(session)


def display_of(session: MonitoredSession) -> ProgressHook | None:
    """The display the installed plugin runs in ``session`` (to ``report`` metrics to)."""
    return _hooks.get(id(session))
