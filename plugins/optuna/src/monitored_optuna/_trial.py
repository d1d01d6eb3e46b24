"""The trial of the running task: how a session finds the trial it trains for.

:func:`~monitored_optuna.optimize` runs each trial's objective in its own task
with the trial set here; the installed ``optuna`` plugin and an
``OptunaPruningHook(None, ...)`` read it when their session begins. A context
variable, not a module global: each task of an event loop has its own copy, so
eight trials running at once each see their own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ._errors import OptunaConfigError

if TYPE_CHECKING:
    import optuna

    from monitored import MonitoredSession

__all__ = ["current_trial", "note_session_closed", "use_trial"]

_trial: Final[contextvars.ContextVar[optuna.trial.BaseTrial | None]] = contextvars.ContextVar(
    "monitored_optuna_trial", default=None
)


#: The signals that stopped sessions of the running trial's task (``optimize`` sets a
#: list per trial; ``None`` outside ``optimize``).
_stop_signals: Final[contextvars.ContextVar[list[str] | None]] = contextvars.ContextVar(
    "monitored_optuna_stop_signals", default=None
)


def note_session_closed(session: MonitoredSession) -> None:
    """Tell ``optimize`` running this task's trial that ``session`` was stopped by a signal.

    Called as a session closes by the pruning hook and the installed plugin:
    a session stopped by SIGINT or SIGTERM closes normally and its objective
    returns a value, which ``optimize`` must not take for the trial's result.
    """
    noted = _stop_signals.get()
    if noted is None:
        return
    name = session.stopped_by_signal
    if name is not None:
        noted.append(name)


def current_trial() -> optuna.trial.BaseTrial | None:
    """The trial this task trains for (set by ``optimize`` or ``use_trial``), if any."""
    return _trial.get()


@contextlib.contextmanager
def use_trial(trial: optuna.trial.BaseTrial) -> Iterator[optuna.trial.BaseTrial]:
    """Make ``trial`` the current trial of this task inside the ``with`` block.

    For objectives run by something other than :func:`optimize` (Optuna's own
    ``study.optimize`` in threads, your own ask/tell loop): sessions created in
    the block report to ``trial`` through the installed ``optuna`` plugin.
    """
    check_trial(trial, "use_trial")
    token = _trial.set(trial)
    try:
        yield trial
    finally:
        _trial.reset(token)


def check_trial(trial: Any, where: str) -> None:
    """Refuse what is not an Optuna trial, naming ``where`` it was given."""
    import optuna  # here, not at the top: installed alone, this plugin costs no import

    if not isinstance(trial, optuna.trial.BaseTrial):
        raise OptunaConfigError(
            f"{where}: expected an optuna trial (optuna.trial.Trial from study.ask() or the "
            f"objective's argument), got {type(trial).__name__}: {trial!r}"
        )
