"""Streaming metrics: TF1's ``tf.metrics`` as objects with ``update``, ``result``, ``reset``.

Each metric accumulates plain float64 arrays in the inputs' array module (NumPy,
or CuPy when given CuPy arrays), merges exactly with another worker's
(:meth:`Metric.merge`) and turns into plain data and back (:meth:`Metric.state`,
:meth:`Metric.from_state`). Results follow ``tf.compat.v1.metrics`` formula by
formula; see ``docs/evaluation.md``.
"""

from ._base import Metric
from ._errors import (
    MetricConfigError,
    MetricError,
    MetricMergeError,
    MetricShapeError,
    MetricStateError,
    MetricValueError,
    MetricWeightsError,
)
from ._metrics import (
    AUC,
    Accuracy,
    FalseNegatives,
    FalsePositives,
    Mean,
    MeanAbsoluteError,
    MeanIoU,
    MeanPerClassAccuracy,
    MeanSquaredError,
    Precision,
    Recall,
    RootMeanSquaredError,
    TrueNegatives,
    TruePositives,
    auc_thresholds,
)

__all__ = [
    "AUC",
    "Accuracy",
    "FalseNegatives",
    "FalsePositives",
    "Mean",
    "MeanAbsoluteError",
    "MeanIoU",
    "MeanPerClassAccuracy",
    "MeanSquaredError",
    "Metric",
    "MetricConfigError",
    "MetricError",
    "MetricMergeError",
    "MetricShapeError",
    "MetricStateError",
    "MetricValueError",
    "MetricWeightsError",
    "Precision",
    "Recall",
    "RootMeanSquaredError",
    "TrueNegatives",
    "TruePositives",
    "auc_thresholds",
]

# Tracebacks name the public path of an error, as the core's do, not its private module.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value
