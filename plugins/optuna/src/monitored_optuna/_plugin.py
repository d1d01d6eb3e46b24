"""The ``optuna`` entry point: pruning configured by options, installed.

Off until a ``monitor`` is set (``plugin_options={"optuna": {"monitor":
"accuracy"}}`` or ``MONITORED_PLUGIN_OPTIONS="optuna.monitor=accuracy"``) *and*
the session runs for a trial: the current trial of its task, which
:func:`~monitored_optuna.optimize` (or :func:`~monitored_optuna.use_trial`)
sets. Installing it changes nothing by itself; a session outside any trial
reports nothing. Module functions delegate to one :class:`OptunaPruningHook`
per session. ``training_only``: evaluation sessions do not load it; their
results reach it in the training session (``after_evaluate``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._hook import OptunaPruningHook
from ._trial import current_trial

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = [
    "after_create_session",
    "after_evaluate",
    "after_run",
    "before_run",
    "begin",
    "declare_options",
    "hook_of",
    "load_plugin_state",
    "plugin_state",
    "provides",
    "training_only",
]

#: Pruning, unless an ``OptunaPruningHook`` passed in ``hooks=[...]`` takes over.
provides: Final = frozenset({"pruning"})

#: Only training sessions are pruned; an evaluation session runs to its end.
training_only: Final = True

#: The hook of each open session that reports (keyed by the session's id, dropped
#: with the session): sessions running at once in one event loop each have their own.
_hooks: dict[int, OptunaPruningHook] = {}


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option("monitor", "", "the value to report (empty: pruning is off)"),
        monitored.Option(
            "every_n_steps", 0, "report a step output every this many steps (0: evaluations)"
        ),
    ]


def begin(session: MonitoredSession) -> None:
    options = session.options_for("optuna")
    trial = current_trial()
    if not options["monitor"] or trial is None:
        return
    hook = OptunaPruningHook(trial, options["monitor"], every_n_steps=options["every_n_steps"])
    hook.begin(session)
    key = id(session)
    _hooks[key] = hook
    weakref.finalize(session, _hooks.pop, key, None)


async def after_create_session(session: MonitoredSession, coord: Coordinator) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        await hook.after_create_session(session, coord)


def before_run(run_context: SessionRunContext) -> monitored.SessionRunArgs | None:
    hook = _hooks.get(id(run_context.session))
    return hook.before_run(run_context) if hook is not None else None


def after_run(run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
    hook = _hooks.get(id(run_context.session))
    return hook.after_run(run_context, run_values) if hook is not None else None


def after_evaluate(session: MonitoredSession, step: int, metrics: Mapping[str, Any]) -> Any:
    hook = _hooks.get(id(session))
    return hook.after_evaluate(session, step, metrics) if hook is not None else None


def plugin_state(session: MonitoredSession) -> dict[str, Any] | None:
    hook = _hooks.get(id(session))
    return hook.plugin_state() if hook is not None else None


def load_plugin_state(session: MonitoredSession, state: dict[str, Any]) -> None:
    hook = _hooks.get(id(session))
    if hook is not None:
        hook.load_plugin_state(state)


def hook_of(session: MonitoredSession) -> OptunaPruningHook | None:
    """The hook the installed plugin runs in ``session``, if it reports there."""
    return _hooks.get(id(session))
