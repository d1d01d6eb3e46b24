"""Evaluation: TF1's ``evaluate_once``, ``evaluate_repeatedly`` and ``Estimator.evaluate``.

An eval step updates :mod:`monitored.metrics` objects; :func:`evaluate_once` runs
it in a :class:`~monitored.MonitoredSession` over a given state or one restored
from a checkpoint, :func:`evaluate_repeatedly` follows a training directory, and
:class:`EvaluationHook` evaluates inside training, reporting results to the
training session's plugins (the ``after_evaluate`` hook). :func:`train_and_evaluate`
(with :class:`TrainSpec`, :class:`EvalSpec`) and :class:`Experiment` run training
and evaluation together, in one process or as a separate evaluator. See
``docs/evaluation.md``.
"""

from ._errors import (
    EvaluationError,
    EvaluationFailedError,
    ExperimentConfigError,
    NoCheckpointError,
    NoMetricUpdatesError,
)
from ._evaluate import EvaluationResult, EvaluationSession, evaluate_once, evaluate_repeatedly
from ._experiment import Experiment
from ._hook import EvaluationHook
from ._train_and_evaluate import EvalSpec, TrainSpec, train_and_evaluate

__all__ = [
    "EvalSpec",
    "EvaluationError",
    "EvaluationFailedError",
    "EvaluationHook",
    "EvaluationResult",
    "EvaluationSession",
    "Experiment",
    "ExperimentConfigError",
    "NoCheckpointError",
    "NoMetricUpdatesError",
    "TrainSpec",
    "evaluate_once",
    "evaluate_repeatedly",
    "train_and_evaluate",
]

# Tracebacks name the public path of an error, as the core's do, not its private module.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value
