"""The exception classes of ``monitored-optuna``: one class per kind of failure.

A pruned trial is not among them: it ends with Optuna's own
``optuna.TrialPruned``, which ``Study.optimize``, :func:`~monitored_optuna.optimize`
and every other Optuna runner know as "pruned, not failed".
"""

from __future__ import annotations

from monitored import MonitoredError

__all__ = ["MonitoredValueError", "OptunaConfigError", "OptunaError"]


class OptunaError(MonitoredError):
    """Base class of every error raised by ``monitored-optuna``."""


class OptunaConfigError(OptunaError, ValueError):
    """An argument is invalid (no ``monitor``, ``every_n_steps < 0``, not a trial)."""


class MonitoredValueError(OptunaError, LookupError):
    """The watched value is missing where it is due, or is not a scalar number."""
