"""The exception classes of ``monitored.evaluation``: one per kind of failure."""

from __future__ import annotations

from .._core._errors import MonitoredError

__all__ = [
    "EvaluationError",
    "EvaluationFailedError",
    "ExperimentConfigError",
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


class ExperimentConfigError(EvaluationError, ValueError):
    """An ``Experiment``, ``TrainSpec`` or ``EvalSpec`` argument that cannot work.

    Raised when the object is built (or, for what needs a model directory, when
    the method that needs it is called); the message names the argument and value.
    """
