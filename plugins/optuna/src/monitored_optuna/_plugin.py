"""The ``optuna`` entry point: pruning configured by options, installed.

Off until a ``monitor`` is set (``plugin_options={"optuna": {"monitor":
"accuracy"}}`` or ``MONITORED_PLUGIN_OPTIONS="optuna.monitor=accuracy"``) *and*
the session trains for a trial: the current trial of its task, which
:func:`~monitored_optuna.optimize` (or :func:`~monitored_optuna.use_trial`)
sets. Installing it changes nothing by itself; a session outside any trial
reports nothing.

It is a feature plugin: for a ``MonitoredTrainingSession`` (and what is built
on one: ``train_and_evaluate``, ``Experiment``) it contributes an
:class:`OptunaPruningHook` through ``training_hooks``, and has no per-step hook
of its own. So watching evaluation results costs a session nothing per step,
and watching a step output costs what the hook costs. ``training_only``:
evaluation sessions do not load it; their results reach the hook in the
training session (``after_evaluate``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Final

import monitored

from ._hook import OptunaPruningHook
from ._trial import current_trial, note_session_closed

if TYPE_CHECKING:
    from monitored import MonitoredSession, TrainingConfig

__all__ = [
    "before_close",
    "declare_options",
    "hook_of",
    "plugin_status",
    "provides",
    "training_hooks",
    "training_only",
]

#: Pruning, unless an ``OptunaPruningHook`` passed in ``hooks=[...]`` takes over.
provides: Final = frozenset({"pruning"})

#: Only training sessions are pruned; an evaluation session runs to its end.
training_only: Final = True

#: The hooks this plugin made (weakly: each lives as long as its session's plan), so
#: that ``hook_of`` tells them from a hook the user passed.
_made: weakref.WeakSet[OptunaPruningHook] = weakref.WeakSet()


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option("monitor", "", "the value to report (empty: pruning is off)"),
        monitored.Option(
            "every_n_steps", 0, "report a step output every this many steps (0: evaluations)"
        ),
    ]


def training_hooks(config: TrainingConfig) -> list[object] | None:
    """An ``OptunaPruningHook`` for the current trial, when a ``monitor`` is set."""
    options = config.plugin_options.get("optuna", {})
    monitor = options.get("monitor", "")
    trial = current_trial()
    if not monitor or trial is None:
        return None
    hook = OptunaPruningHook(trial, monitor, every_n_steps=options.get("every_n_steps", 0))
    _made.add(hook)
    return [hook]


def before_close(session: MonitoredSession, error: BaseException | None) -> None:
    """Tell :func:`~monitored_optuna.optimize` when a signal stopped this session.

    In every session of a trial's task, not only those it reports from: a
    trial interrupted by Ctrl-C or preempted must not be told ``COMPLETE``
    with the value of a model half trained.
    """
    note_session_closed(session)


def hook_of(session: MonitoredSession) -> OptunaPruningHook | None:
    """The hook this plugin contributed to ``session``, if it contributed one."""
    for info in session.plugins:
        if isinstance(info.plugin, OptunaPruningHook) and info.plugin in _made:
            return info.plugin
    return None


def plugin_status(session: MonitoredSession) -> str:
    """For the "Loaded plugins" line: what this session reports, or why nothing."""
    hook = hook_of(session)
    if hook is not None:
        return f"reporting {hook.monitor!r} to trial {getattr(hook.trial, 'number', '?')}"
    if not session.options_for("optuna").get("monitor"):
        return "off: no monitor (set the option optuna.monitor)"
    if session.training_config is None:
        return "inactive: a MonitoredSession takes no plugin hooks (pass an OptunaPruningHook)"
    return "inactive: no Optuna trial in this task (monitored_optuna.optimize sets one)"
