"""``ModeKeys``, ``EstimatorSpec`` and ``MetricSpec``: what a ``model_fn`` says it computed.

TF's ``model_fn`` built a graph once and returned ops; here it runs on each
batch, on arrays, and returns what it computed for that batch:

* ``loss``: the batch's loss (a 0-d array or a number);
* ``train_op``: in training, the update. Either it was applied already inside
  ``model_fn`` (pass what the optimizer returned, or ``True``) or it is a
  function of no argument that applies it (called right after ``model_fn``);
* ``eval_metric_ops``: in evaluation, ``{name: metric}`` where each metric is a
  *new* :mod:`monitored.metrics` object updated with this batch only
  (``metrics.Accuracy().updated(labels, predicted)`` reads as TF's
  ``tf.metrics.accuracy(labels, predicted)``); the estimator merges the batches;
* ``predictions``: an array or ``{name: array}``, one row per example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

from ..metrics import Metric
from ._errors import ModelFnError

__all__ = ["EstimatorSpec", "MetricSpec", "ModeKeys"]


@final
class ModeKeys:
    """The three modes a ``model_fn`` is called in (TF's ``tf.estimator.ModeKeys``)."""

    TRAIN: Final = "train"
    EVAL: Final = "eval"
    PREDICT: Final = "infer"


_MODES: Final = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


@final
@dataclasses.dataclass(frozen=True, slots=True)
class EstimatorSpec:
    """What ``model_fn(features, labels, mode, ...)`` computed for one batch.

    The fields are TF's. What each mode needs: ``TRAIN`` a ``loss`` and a
    ``train_op``; ``EVAL`` a ``loss`` (``eval_metric_ops`` optional);
    ``PREDICT`` ``predictions``. ``training_hooks``, ``evaluation_hooks`` and
    ``prediction_hooks`` are taken from the first call of a run (TF built its
    graph once) and join that run's session. ``scaffold`` and
    ``export_outputs`` have no counterpart: a :class:`~monitored.Scaffold` is the
    estimator's own (variables come from :func:`get_variable`), and nothing here
    exports a SavedModel.
    """

    mode: str
    predictions: Any = None
    loss: Any = None
    train_op: Any = None
    eval_metric_ops: Mapping[str, Any] | None = None
    training_hooks: Sequence[object] = ()
    evaluation_hooks: Sequence[object] = ()
    prediction_hooks: Sequence[object] = ()
    export_outputs: None = None
    scaffold: None = None

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ModelFnError(
                f"EstimatorSpec(mode={self.mode!r}): one of ModeKeys.TRAIN ({ModeKeys.TRAIN!r}), "
                f"EVAL ({ModeKeys.EVAL!r}) or PREDICT ({ModeKeys.PREDICT!r})"
            )
        if self.export_outputs is not None:
            raise ModelFnError(
                "EstimatorSpec(export_outputs=...): nothing here exports a SavedModel; drop "
                "it and serve with Estimator.predict or a predict function over the "
                "checkpoint (docs/estimator.md)"
            )
        if self.scaffold is not None:
            raise ModelFnError(
                "EstimatorSpec(scaffold=...): the estimator makes its own scaffold; create "
                "variables with monitored.estimator.get_variable inside model_fn"
            )
        if self.mode in (ModeKeys.TRAIN, ModeKeys.EVAL) and self.loss is None:
            raise ModelFnError(f"EstimatorSpec in mode {self.mode!r} needs a loss")
        if self.mode == ModeKeys.TRAIN and self.train_op is None:
            raise ModelFnError(
                "EstimatorSpec in mode 'train' needs a train_op: the update, applied inside "
                "model_fn (pass what optimizer.minimize/apply_gradients returned, or True) "
                "or a function of no argument that applies it"
            )
        if self.mode == ModeKeys.PREDICT and self.predictions is None:
            raise ModelFnError("EstimatorSpec in mode 'infer' (PREDICT) needs predictions")
        if self.eval_metric_ops is not None:
            if not isinstance(self.eval_metric_ops, Mapping):
                raise ModelFnError(
                    "EstimatorSpec(eval_metric_ops=...): a dict of metric names to "
                    f"monitored.metrics objects, not {type(self.eval_metric_ops).__name__}"
                )
            for name, metric in self.eval_metric_ops.items():
                check_metric_op(name, metric)
        for field in ("training_hooks", "evaluation_hooks", "prediction_hooks"):
            hooks = getattr(self, field)
            if isinstance(hooks, str | bytes) or not isinstance(hooks, Sequence):
                raise ModelFnError(f"EstimatorSpec({field}=...): a list of hooks")


def check_metric_op(name: object, metric: object) -> None:
    """Refuse an ``eval_metric_ops`` entry that is not a metric updated with the batch.

    TF's ``(value_op, update_op)`` pair gets a message of its own.
    """
    if not isinstance(name, str) or not name:
        raise ModelFnError(f"eval_metric_ops: metric names are non-empty strings, not {name!r}")
    if isinstance(metric, Metric):
        return
    if isinstance(metric, tuple) and len(metric) == 2:
        raise ModelFnError(
            f"eval_metric_ops[{name!r}]: TF's (value_op, update_op) pair has no meaning on "
            "arrays; return a new monitored.metrics object updated with this batch, e.g. "
            "metrics.Accuracy().updated(labels, predictions)"
        )
    raise ModelFnError(
        f"eval_metric_ops[{name!r}]: a monitored.metrics object updated with this batch, "
        f"not {type(metric).__name__}"
    )


@final
@dataclasses.dataclass(frozen=True, slots=True)
class MetricSpec:
    """``tf.contrib.learn.MetricSpec``: a metric computed from predictions and labels.

    ``metric_fn()`` makes a fresh :class:`~monitored.metrics.Metric` for each
    evaluation; every batch it is updated with ``labels`` (the input's, or
    ``predictions[label_key]``) and ``predictions[prediction_key]`` (the whole
    predictions when they are one array and ``prediction_key`` is ``None``),
    and ``weights`` from the features' ``weight_key`` entry. Give these to
    :meth:`Estimator.evaluate` (``metrics=``) or an ``Experiment``'s
    ``eval_metrics``.
    """

    metric_fn: Callable[[], Metric]
    prediction_key: str | None = None
    label_key: str | None = None
    weight_key: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.metric_fn):
            raise ModelFnError(
                f"MetricSpec(metric_fn={self.metric_fn!r}): a function making a metric, "
                "such as monitored.metrics.Accuracy"
            )

    def create(self, name: str) -> Metric:
        """A fresh metric from ``metric_fn``, checked."""
        metric = self.metric_fn()
        if not isinstance(metric, Metric):
            raise ModelFnError(
                f"MetricSpec {name!r}: metric_fn returned {type(metric).__name__}, not a "
                "monitored.metrics object"
            )
        return metric

    def update(
        self, name: str, metric: Metric, features: Any, labels: Any, predictions: Any
    ) -> None:
        """Update ``metric`` with one batch, picking the keys this spec names."""
        chosen = _pick(name, "prediction_key", predictions, self.prediction_key, "predictions")
        truth = (
            labels
            if self.label_key is None
            else _pick(name, "label_key", labels, self.label_key, "labels")
        )
        weights = (
            None
            if self.weight_key is None
            else _pick(name, "weight_key", features, self.weight_key, "features")
        )
        update: Any = getattr(metric, "update")  # noqa: B009 - each kind defines its own
        update(truth, chosen, weights) if weights is not None else update(truth, chosen)


def _pick(name: str, argument: str, values: Any, key: str | None, what: str) -> Any:
    if key is None:
        if isinstance(values, Mapping):
            raise ModelFnError(
                f"MetricSpec {name!r}: the {what} are a dict ({sorted(values)}); say which "
                f"entry with {argument}="
            )
        return values
    if not isinstance(values, Mapping) or key not in values:
        have = sorted(values) if isinstance(values, Mapping) else type(values).__name__
        raise ModelFnError(
            f"MetricSpec {name!r}: {argument}={key!r} is not among the {what}: {have}"
        )
    return values[key]
