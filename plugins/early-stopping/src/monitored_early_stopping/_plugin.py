"""The ``early_stopping`` entry point: early stopping configured by options, installed.

Off until a ``monitor`` is set (``plugin_options={"early_stopping": {"monitor":
"loss", "patience": 5}}`` or ``MONITORED_PLUGIN_OPTIONS="early_stopping.monitor=loss"``),
so that installing it changes nothing by itself. Module functions delegate to
one :class:`EarlyStoppingHook` per session, whose ``before_run`` and
``after_run`` the session calls directly (none at all while it is off).
``training_only``: evaluation
sessions (whose steps return no training outputs) do not load it; they report
their results to the training session, where it hears them.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._hook import EarlyStoppingHook

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = [
    "after_create_session",
    "after_evaluate",
    "after_run",
    "before_run",
    "begin",
    "declare_options",
    "end",
    "hook_of",
    "load_plugin_state",
    "plugin_state",
    "provides",
    "training_only",
]

#: Early stopping, unless an ``EarlyStoppingHook`` passed in ``hooks=[...]`` takes over.
provides: Final = frozenset({"early_stopping"})

#: Only training sessions stop early; an evaluation session runs to its end.
training_only: Final = True

_hooks: dict[int, EarlyStoppingHook] = {}


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option("monitor", "", "the output to watch (empty: early stopping is off)"),
        monitored.Option("patience", 0, "checks without improvement before stopping"),
        monitored.Option("min_delta", 0.0, "smaller improvements do not count"),
        monitored.Option("mode", "auto", "min, max or auto (from the name)"),
        monitored.Option("baseline", None, "values must also beat this", type=float),
        monitored.Option("restore_best", False, "put the best state back when it stops"),
        monitored.Option("start_from", 0, "checks ignored at first"),
        monitored.Option(
            "every_n_steps", 1, "check every this many global steps (0: evaluation results)"
        ),
        monitored.Option("smoothing", 0.0, "exponential moving average factor in [0, 1)"),
    ]


def begin(session: MonitoredSession) -> None:
    options = session.options_for("early_stopping")
    if not options["monitor"]:
        # Off: nothing to do at any step, so no call at any step.
        session.delegate_step_hooks("early_stopping", None)
        return
    hook = EarlyStoppingHook(
        options["monitor"],
        min_delta=options["min_delta"],
        patience=options["patience"],
        mode=options["mode"],
        baseline=options["baseline"],
        restore_best=options["restore_best"],
        start_from=options["start_from"],
        every_n_steps=options["every_n_steps"],
        smoothing=options["smoothing"],
    )
    key = id(session)
    _hooks[key] = hook
    weakref.finalize(session, _hooks.pop, key, None)
    session.delegate_step_hooks("early_stopping", hook)


def after_create_session(session: MonitoredSession, coord: Coordinator) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        hook.after_create_session(session, coord)


def before_run(run_context: SessionRunContext) -> monitored.SessionRunArgs | None:
    hook = _hooks.get(id(run_context.session))
    return hook.before_run(run_context) if hook is not None else None


def after_run(run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
    hook = _hooks.get(id(run_context.session))
    return hook.after_run(run_context, run_values) if hook is not None else None


def after_evaluate(session: MonitoredSession, step: int, metrics: Mapping[str, Any]) -> Any:
    hook = _hooks.get(id(session))
    return hook.after_evaluate(session, step, metrics) if hook is not None else None


async def end(session: MonitoredSession) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        await hook.end(session)


def plugin_state(session: MonitoredSession) -> dict[str, Any] | None:
    hook = _hooks.get(id(session))
    return hook.plugin_state() if hook is not None else None


def load_plugin_state(session: MonitoredSession, state: dict[str, Any]) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        hook.load_plugin_state(state)


def hook_of(session: MonitoredSession) -> EarlyStoppingHook | None:
    """The hook the installed plugin runs in ``session``, if a ``monitor`` is set."""
    return _hooks.get(id(session))
