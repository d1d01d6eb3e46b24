"""The exception classes of ``monitored.evaluation``: one per kind of failure."""

from __future__ import annotations

from .._core._errors import MonitoredError

__all__ = [
    "EvaluationError",
    "EvaluationFailedError",
    "NoCheckpointError",
    "NoMetricUpdatesError",
]


class EvaluationError(MonitoredError):
    """Base class of the errors raised by ``monitored.evaluation``."""


class NoCheckpointError(EvaluationError, FileNotFoundError):
    """The checkpoint directory to evaluate holds no checkpoint (the message names it)."""


class NoMetricUpdatesError(EvaluationError):
    """An eval step updated none of the metrics (the message names the step function)."""


class EvaluationFailedError(EvaluationError):
    """An evaluation run inside training (:class:`EvaluationHook`) raised; training stops.

    The original exception is the ``__cause__``.
    """
