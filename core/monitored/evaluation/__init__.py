"""Evaluation: TF1's ``evaluate_once``, ``evaluate_repeatedly`` and ``Estimator.evaluate``.

An eval step updates :mod:`monitored.metrics` objects; :func:`evaluate_once` runs
it in a :class:`~monitored.MonitoredSession` over a given state or one restored
from a checkpoint, :func:`evaluate_repeatedly` follows a training directory, and
:class:`EvaluationHook` evaluates inside training, reporting results to the
training session's plugins (the ``after_evaluate`` hook). See ``docs/evaluation.md``.
"""

from ._errors import EvaluationError, EvaluationFailedError, NoCheckpointError, NoMetricUpdatesError
from ._evaluate import EvaluationResult, EvaluationSession, evaluate_once, evaluate_repeatedly
from ._hook import EvaluationHook

__all__ = [
    "EvaluationError",
    "EvaluationFailedError",
    "EvaluationHook",
    "EvaluationResult",
    "EvaluationSession",
    "NoCheckpointError",
    "NoMetricUpdatesError",
    "evaluate_once",
    "evaluate_repeatedly",
]
