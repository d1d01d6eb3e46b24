"""The ``nan_guard`` entry point: a :class:`NanTensorHook` in every session, installed.

It watches ``monitored.optional("loss")`` by default, so scripts whose steps
return no ``loss`` are not disturbed; a name set with the ``loss`` option must be
there (a misspelled option is an error, not a guard that is silently off). It
checks it with ``lag=1``: a loss on a device one step late, never making a step
wait for the device (``lag`` option).
Options (``plugin_options={"nan_guard": {...}}`` or
``MONITORED_PLUGIN_OPTIONS="nan_guard.on_nan=stop"``) set what the hook's
arguments set. One guard per session, whose ``before_run`` and ``after_run`` the
session calls directly (``delegate_step_hooks``); the other module functions
delegate to it.
``training_only``: evaluation sessions, which train nothing, do not load it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._hook import NanTensorHook

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = [
    "after_create_session",
    "after_run",
    "before_run",
    "begin",
    "declare_options",
    "load_plugin_state",
    "plugin_state",
    "provides",
    "training_only",
]

#: The session's NaN guard, unless a ``NanTensorHook`` passed in ``hooks=[...]`` takes over.
provides: Final = frozenset({"nan_guard"})
#: An evaluation session trains nothing to guard (and has no checkpoints to roll back to).
training_only: Final = True

#: Watched when present: scripts whose steps return no ``loss`` are not disturbed.
DEFAULT_LOSS: Final = "loss"

#: The guard of each live session, by ``id(session)`` (removed when it is collected).
_guards: dict[int, NanTensorHook] = {}


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option("loss", DEFAULT_LOSS, "the step output or state entry to watch"),
        monitored.Option("on_nan", "raise", "raise, stop or rollback on a divergence"),
        monitored.Option("fail_on_inf", False, "an infinite loss is a failure too"),
        monitored.Option(
            "check_state_every_n_steps", 0, "scan every state array for NaN/Inf (0: never)"
        ),
        monitored.Option("max_rollbacks", 3, "rollbacks allowed before giving up"),
        monitored.Option("skip_extra_steps", 0, "batches skipped after the failing step"),
        monitored.Option("spike_k", 0.0, "a loss this many std above its window fails (0: off)"),
        monitored.Option("spike_window", 100, "losses in the spike detector's window"),
        monitored.Option(
            "lag", 1, "1: a device's loss checked one step late, never waited for; 0: same step"
        ),
    ]


def begin(session: MonitoredSession) -> None:
    options = session.options_for("nan_guard")
    loss = options["loss"]
    guard = NanTensorHook(
        # The default may be absent (a script whose steps return no loss); a name
        # the user chose must be there: a misspelling must not turn the guard off.
        monitored.optional(loss) if loss == DEFAULT_LOSS else loss,
        on_nan=options["on_nan"],
        fail_on_inf=options["fail_on_inf"],
        check_state_every_n_steps=options["check_state_every_n_steps"],
        max_rollbacks=options["max_rollbacks"],
        skip_extra_steps=options["skip_extra_steps"],
        spike_k=options["spike_k"] or None,
        spike_window=options["spike_window"],
        lag=options["lag"],
    )
    key = id(session)
    _guards[key] = guard
    weakref.finalize(session, _guards.pop, key, None)
    # The session calls the guard's before_run and after_run directly: one call each.
    session.delegate_step_hooks("nan_guard", guard)


def after_create_session(session: MonitoredSession, coord: Coordinator) -> None:
    _guards[id(session)].after_create_session(session, coord)


def before_run(run_context: SessionRunContext) -> monitored.SessionRunArgs | None:
    return _guards[id(run_context.session)].before_run(run_context)


@monitored.hookimpl(tryfirst=True)
def after_run(run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
    return _guards[id(run_context.session)].after_run(run_context, run_values)


def plugin_state(session: MonitoredSession) -> dict[str, Any] | None:
    # Nothing to save until a rollback happened: checkpoints of healthy runs carry
    # no nan_guard entry (a missing entry loads as zero rollbacks).
    guard = _guards.get(id(session))
    if guard is None or (not guard.rollbacks and not guard.plugin_state()["rollbacks"]):
        return None
    return guard.plugin_state()


def load_plugin_state(session: MonitoredSession, state: dict[str, Any]) -> None:
    guard = _guards.get(id(session))
    if guard is not None:
        guard.load_plugin_state(state)


def guard_of(session: MonitoredSession) -> NanTensorHook | None:
    """The guard the installed plugin runs in ``session`` (to read its rollbacks)."""
    return _guards.get(id(session))
