"""The exception classes of ``monitored-nan-guard``: one class per kind of failure.

Failures of training itself derive from the core's
:class:`monitored.NanLossDuringTrainingError` (so code catching TF1's error
catches them all); mistakes in the guard's configuration and failed rollbacks
derive from :class:`NanGuardError`.
"""

from __future__ import annotations

from monitored import MonitoredError, NanLossDuringTrainingError

__all__ = [
    "LossSpikeError",
    "NanGuardConfigError",
    "NanGuardError",
    "NanLossDuringTrainingError",
    "NonFiniteLossError",
    "NonFiniteStateError",
    "RollbackError",
]


class NanGuardError(MonitoredError):
    """Base class of the guard's own errors (configuration, rollback)."""


class NanGuardConfigError(NanGuardError, ValueError):
    """An argument of ``NanTensorHook`` is invalid, or the watched value is not a scalar."""


class NonFiniteLossError(NanLossDuringTrainingError):
    """The loss is infinite (only with ``fail_on_inf=True``; NaN raises the TF1 class)."""


class NonFiniteStateError(NanLossDuringTrainingError):
    """A state array holds NaN or infinite values (``check_state_every_n_steps``)."""


class LossSpikeError(NanLossDuringTrainingError):
    """The loss jumped more than ``spike_k`` standard deviations above its running window."""


class RollbackError(NanGuardError):
    """A rollback was due but cannot happen: no older checkpoint, or ``max_rollbacks`` spent."""
