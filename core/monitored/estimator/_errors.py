"""The estimator's errors: one class per way a ``model_fn`` or its use can go wrong."""

from __future__ import annotations

from .._core._errors import MonitoredError

__all__ = ["EstimatorError", "ModelFnError"]


class EstimatorError(MonitoredError, ValueError):
    """An :class:`~monitored.estimator.Estimator` call that cannot be carried out.

    A ``ValueError`` too, as TF's Estimator raised ``ValueError`` for the same
    mistakes (``steps`` and ``max_steps`` together, no checkpoint to evaluate).
    """


class ModelFnError(EstimatorError):
    """A ``model_fn`` that returned something an :class:`EstimatorSpec` cannot be in its mode."""
