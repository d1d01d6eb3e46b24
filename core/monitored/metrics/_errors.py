"""The exception classes of ``monitored.metrics``: one class per kind of bad input.

All derive from :class:`MetricError` (a :class:`monitored.MonitoredError` and a
``ValueError``), and every message names the metric concerned.
"""

from __future__ import annotations

from .._core._errors import MonitoredError

__all__ = [
    "MetricConfigError",
    "MetricError",
    "MetricMergeError",
    "MetricShapeError",
    "MetricStateError",
    "MetricValueError",
    "MetricWeightsError",
]


class MetricError(MonitoredError, ValueError):
    """Base class of the errors raised by streaming metrics."""


class MetricShapeError(MetricError):
    """Labels and predictions of a metric update have shapes that do not match."""


class MetricWeightsError(MetricError):
    """The weights of an update do not broadcast to the values they weigh."""


class MetricValueError(MetricError):
    """An input holds values the metric cannot take (AUC predictions outside [0, 1],
    class ids outside ``[0, num_classes)``)."""


class MetricConfigError(MetricError):
    """A metric was constructed with an invalid argument (``num_thresholds < 2``, ...)."""


class MetricMergeError(MetricError):
    """Two metrics that cannot be merged: different kinds or configurations."""


class MetricStateError(MetricError):
    """A saved metric state that does not describe a metric this version can rebuild."""
