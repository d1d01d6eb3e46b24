"""TF1's ``tf.metrics`` as streaming objects, computed as TF computes them.

Each class states the formula it follows (that of ``tf.compat.v1.metrics``).
Sums are kept in float64, where TF keeps most of them in float32, so results
agree with TF's to float32 rounding and do not drift on long streams.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

import numpy as np

from ._base import Metric, as_array, broadcast_weights, match_shapes
from ._errors import MetricConfigError

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
    "Precision",
    "Recall",
    "RootMeanSquaredError",
    "TrueNegatives",
    "TruePositives",
]

_F64: Final = np.float64

#: TF1's ``kepsilon``: the end thresholds sit this far below 0 and above 1.
AUC_THRESHOLD_EPSILON: Final = 1e-7
#: TF1's ``epsilon`` in the recall, precision and rate ratios of ``auc``.
AUC_RATIO_EPSILON: Final = 1e-6

#: What AUC's predictions must be, in its range errors.
_AUC_RANGE: Final = "predictions must be in [0, 1] (TF asserts it)"

Curve = Literal["ROC", "PR"]
Summation = Literal["trapezoidal", "careful_interpolation", "minoring", "majoring"]


# -- means ------------------------------------------------------------------------------------
class _MeanOf(Metric):
    """A weighted mean: ``total = sum(w * x)``, ``count = sum(w)``, result ``total / count``."""

    __slots__ = ()

    def _layout(self) -> dict[str, tuple[int, ...]]:
        return {"total": (), "count": ()}

    def _add(self, values: Any, weights: Any, xp: Any) -> None:
        if weights is None:
            total = values.sum(dtype=_F64)
            count = values.size
        else:
            w = broadcast_weights(self, weights, values.shape, xp)
            total = (values * w).sum(dtype=_F64)
            count = w.sum(dtype=_F64)
        arrays = self._arrays
        arrays["total"] += total
        arrays["count"] += count
        self._updates += 1

    def result(self) -> float:
        """``total / count``, ``0.0`` when ``count <= 0`` (TF's ``div_no_nan``)."""
        arrays = self._host()
        count = float(arrays["count"])
        return float(arrays["total"]) / count if count > 0 else 0.0


class Mean(_MeanOf):
    """``tf.metrics.mean``: the (weighted) mean of every value seen.

    ``sum(weights * values) / sum(weights)``; weights default to 1.
    """

    __slots__ = ()
    kind = "mean"

    def update(self, values: Any, weights: Any = None) -> None:
        """Add a batch of values (any shape), optionally weighted."""
        values = as_array(values)
        self._add(values, weights, self._module(values))


class Accuracy(_MeanOf):
    """``tf.metrics.accuracy``: how often ``predictions == labels``.

    Predictions are cast to the labels' dtype first (as TF does), then the mean
    of the 0/1 matches, weighted.
    """

    __slots__ = ()
    kind = "accuracy"

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch: ``labels`` and ``predictions`` of the same shape."""
        predictions = as_array(predictions)
        xp = self._module(predictions)
        labels, predictions = match_shapes(self, labels, predictions)
        if predictions.dtype != labels.dtype:
            predictions = predictions.astype(labels.dtype)
        self._add(predictions == labels, weights, xp)


class MeanSquaredError(_MeanOf):
    """``tf.metrics.mean_squared_error``: the weighted mean of ``(labels - predictions)**2``."""

    __slots__ = ()
    kind = "mean_squared_error"

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch: ``labels`` and ``predictions`` of the same shape."""
        predictions = as_array(predictions)
        xp = self._module(predictions)
        labels, predictions = match_shapes(self, labels, predictions)
        diff = xp.subtract(labels, predictions, dtype=_F64)
        xp.multiply(diff, diff, out=diff)
        self._add(diff, weights, xp)


class RootMeanSquaredError(MeanSquaredError):
    """``tf.metrics.root_mean_squared_error``: ``sqrt`` of the mean squared error."""

    __slots__ = ()
    kind = "root_mean_squared_error"

    def result(self) -> float:
        """``sqrt(total / count)``, ``0.0`` when nothing was seen."""
        return math.sqrt(super().result())


class MeanAbsoluteError(_MeanOf):
    """``tf.metrics.mean_absolute_error``: the weighted mean of ``|labels - predictions|``."""

    __slots__ = ()
    kind = "mean_absolute_error"

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch: ``labels`` and ``predictions`` of the same shape."""
        predictions = as_array(predictions)
        xp = self._module(predictions)
        labels, predictions = match_shapes(self, labels, predictions)
        diff = xp.subtract(labels, predictions, dtype=_F64)
        xp.abs(diff, out=diff)
        self._add(diff, weights, xp)


# -- counts of a binary condition ---------------------------------------------------------------
def _binary(metric: Metric, labels: Any, predictions: Any) -> tuple[Any, Any, Any]:
    """Labels and predictions cast to ``bool`` (non-zero is true), as TF casts them."""
    predictions = as_array(predictions)
    xp = metric._module(predictions)
    labels, predictions = match_shapes(metric, labels, predictions)
    return labels.astype(bool, copy=False), predictions.astype(bool, copy=False), xp


def _weighted_count(metric: Metric, condition: Any, weights: Any, xp: Any) -> Any:
    if weights is None:
        return xp.count_nonzero(condition)
    w = broadcast_weights(metric, weights, condition.shape, xp)
    return (w * condition).sum(dtype=_F64)


class _Count(Metric):
    __slots__ = ()

    def _layout(self) -> dict[str, tuple[int, ...]]:
        return {"count": ()}

    def _condition(self, labels: Any, predictions: Any) -> Any:
        raise NotImplementedError

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch; labels and predictions are cast to ``bool``."""
        labels, predictions, xp = _binary(self, labels, predictions)
        self._arrays["count"] += _weighted_count(
            self, self._condition(labels, predictions), weights, xp
        )
        self._updates += 1

    def result(self) -> float:
        """The summed weight of the matching elements."""
        return float(self._host()["count"])


class TruePositives(_Count):
    """``tf.metrics.true_positives``: total weight where ``labels and predictions``."""

    __slots__ = ()
    kind = "true_positives"

    def _condition(self, labels: Any, predictions: Any) -> Any:
        return labels & predictions


class FalsePositives(_Count):
    """``tf.metrics.false_positives``: total weight where ``not labels and predictions``."""

    __slots__ = ()
    kind = "false_positives"

    def _condition(self, labels: Any, predictions: Any) -> Any:
        return ~labels & predictions


class TrueNegatives(_Count):
    """``tf.metrics.true_negatives``: total weight where ``not labels and not predictions``."""

    __slots__ = ()
    kind = "true_negatives"

    def _condition(self, labels: Any, predictions: Any) -> Any:
        return ~(labels | predictions)


class FalseNegatives(_Count):
    """``tf.metrics.false_negatives``: total weight where ``labels and not predictions``."""

    __slots__ = ()
    kind = "false_negatives"

    def _condition(self, labels: Any, predictions: Any) -> Any:
        return labels & ~predictions


class Precision(Metric):
    """``tf.metrics.precision``: ``tp / (tp + fp)``, ``0.0`` when ``tp + fp == 0``.

    Labels and predictions are cast to ``bool``.
    """

    __slots__ = ()
    kind = "precision"

    def _layout(self) -> dict[str, tuple[int, ...]]:
        return {"true_positives": (), "false_positives": ()}

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch; labels and predictions are cast to ``bool``."""
        labels, predictions, xp = _binary(self, labels, predictions)
        arrays = self._arrays
        arrays["true_positives"] += _weighted_count(self, labels & predictions, weights, xp)
        arrays["false_positives"] += _weighted_count(self, ~labels & predictions, weights, xp)
        self._updates += 1

    def result(self) -> float:
        """``tp / (tp + fp)``, or ``0.0`` when there is no positive prediction."""
        arrays = self._host()
        tp, fp = float(arrays["true_positives"]), float(arrays["false_positives"])
        return tp / (tp + fp) if tp + fp > 0 else 0.0


class Recall(Metric):
    """``tf.metrics.recall``: ``tp / (tp + fn)``, ``0.0`` when ``tp + fn == 0``.

    Labels and predictions are cast to ``bool``.
    """

    __slots__ = ()
    kind = "recall"

    def _layout(self) -> dict[str, tuple[int, ...]]:
        return {"true_positives": (), "false_negatives": ()}

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch; labels and predictions are cast to ``bool``."""
        labels, predictions, xp = _binary(self, labels, predictions)
        arrays = self._arrays
        arrays["true_positives"] += _weighted_count(self, labels & predictions, weights, xp)
        arrays["false_negatives"] += _weighted_count(self, labels & ~predictions, weights, xp)
        self._updates += 1

    def result(self) -> float:
        """``tp / (tp + fn)``, or ``0.0`` when there is no positive label."""
        arrays = self._host()
        tp, fn = float(arrays["true_positives"]), float(arrays["false_negatives"])
        return tp / (tp + fn) if tp + fn > 0 else 0.0


# -- AUC ------------------------------------------------------------------------------------------
def auc_thresholds(num_thresholds: int = 200) -> np.ndarray[Any, np.dtype[np.float32]]:
    """TF1's ``auc`` thresholds, as the float32 values TF compares predictions with.

    ``num_thresholds - 2`` thresholds ``(i + 1) / (num_thresholds - 1)`` inside
    (0, 1), plus ``-1e-7`` and ``1 + 1e-7`` at the ends so that predictions of
    exactly 0 and 1 fall inside the curve.
    """
    inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
    ends = [0.0 - AUC_THRESHOLD_EPSILON, *inner, 1.0 + AUC_THRESHOLD_EPSILON]
    return np.asarray(ends, dtype=np.float32)


def _div_no_nan(num: np.ndarray[Any, Any], den: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = np.zeros(np.broadcast(num, den).shape, dtype=_F64)
    np.divide(num, den, out=out, where=den != 0)
    return out


class AUC(Metric):
    """``tf.metrics.auc``: the area under the ROC or precision-recall curve.

    Predictions (in [0, 1]) are compared with ``num_thresholds`` thresholds
    (:func:`auc_thresholds`); at each threshold ``i`` an element counts as
    predicted positive when ``prediction > thresholds[i]``, giving TF's
    ``tp, fn, tn, fp`` arrays. With ``eps = 1e-6``::

        recall    = (tp + eps) / (tp + fn + eps)
        fp_rate   = fp / (fp + tn + eps)              # ROC: x = fp_rate, y = recall
        precision = (tp + eps) / (tp + fp + eps)      # PR:  x = recall,  y = precision
        auc = sum((x[:-1] - x[1:]) * (y[:-1] + y[1:]) / 2)   # 'trapezoidal'

    ``'minoring'``/``'majoring'`` take the smaller/larger of the two heights;
    ``'careful_interpolation'`` is the trapezoidal rule for ROC and TF's
    Davis-Goadrich interpolation for PR. ``thresholds=`` replaces the evenly
    spaced ones (the two end thresholds are still added).

    The running sums are per-bucket weights of positive and negative labels
    (which bucket of thresholds a prediction falls in), so an update costs
    ``O(n log T)``, not TF's ``O(n T)``, and the counts are the same.
    """

    __slots__ = ("_thresholds", "curve", "num_thresholds", "summation_method", "thresholds")
    kind = "auc"

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: Curve = "ROC",
        summation_method: Summation = "trapezoidal",
        thresholds: list[float] | None = None,
        name: str | None = None,
    ) -> None:
        label = name if name is not None else self.kind
        if curve not in ("ROC", "PR"):
            raise MetricConfigError(f"metric {label!r}: curve must be 'ROC' or 'PR', got {curve!r}")
        if summation_method not in ("trapezoidal", "careful_interpolation", "minoring", "majoring"):
            raise MetricConfigError(
                f"metric {label!r}: summation_method must be 'trapezoidal', "
                f"'careful_interpolation', 'minoring' or 'majoring', got {summation_method!r}"
            )
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            if any(not 0.0 <= t <= 1.0 for t in inner):
                raise MetricConfigError(f"metric {label!r}: thresholds must be in [0, 1]")
            ends = [0.0 - AUC_THRESHOLD_EPSILON, *inner, 1.0 + AUC_THRESHOLD_EPSILON]
            self._thresholds = np.asarray(ends, dtype=np.float32)
            num_thresholds = len(inner) + 2
            self.thresholds: list[float] | None = inner
        else:
            if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int):
                raise MetricConfigError(
                    f"metric {label!r}: num_thresholds must be an int, got {num_thresholds!r}"
                )
            if num_thresholds < 2:
                raise MetricConfigError(
                    f"metric {label!r}: num_thresholds must be at least 2, got {num_thresholds}"
                )
            self._thresholds = auc_thresholds(num_thresholds)
            self.thresholds = None
        self.num_thresholds = num_thresholds
        self.curve: Curve = curve
        self.summation_method: Summation = summation_method
        super().__init__(name)

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "num_thresholds": self.num_thresholds,
            "curve": self.curve,
            "summation_method": self.summation_method,
        }
        if self.thresholds is not None:
            config["thresholds"] = list(self.thresholds)
        return config

    def _layout(self) -> dict[str, tuple[int, ...]]:
        buckets = (self.num_thresholds + 1,)
        return {"positives": buckets, "negatives": buckets}

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch: predictions in [0, 1], labels cast to ``bool``."""
        predictions = as_array(predictions)
        xp = self._module(predictions)
        labels, predictions = match_shapes(self, labels, predictions)
        predictions = predictions.astype(xp.float32, copy=False)
        if xp is not np:
            self._check_range(predictions, 0.0, 1.0, _AUC_RANGE)
        elif predictions.size:
            low, high = float(predictions.min()), float(predictions.max())
            if not (low >= 0.0 and high <= 1.0):
                raise self._out_of_range(_AUC_RANGE, low, high, deferred=False)
        thresholds = self._thresholds if xp is np else xp.asarray(self._thresholds)
        # How many thresholds lie strictly below each prediction: prediction > t[i]
        # exactly for i below that bucket.
        bucket = xp.searchsorted(thresholds, predictions.reshape(-1), side="left")
        positive = labels.reshape(-1).astype(bool, copy=False)
        size = self.num_thresholds + 1
        w = None
        if weights is not None:
            w = broadcast_weights(self, weights, predictions.shape, xp).reshape(-1)
        if xp is not np:  # no boolean masks: each would read its size on the host
            pos = _bins(xp, bucket, size, positive if w is None else w * positive)
            neg = _bins(xp, bucket, size, ~positive if w is None else w * ~positive)
        elif w is None:
            pos = xp.bincount(bucket[positive], minlength=size)
            neg = xp.bincount(bucket[~positive], minlength=size)
        else:
            pos = xp.bincount(bucket[positive], weights=w[positive], minlength=size)
            neg = xp.bincount(bucket[~positive], weights=w[~positive], minlength=size)
        self._arrays["positives"] += pos
        self._arrays["negatives"] += neg
        self._updates += 1

    def confusion(self) -> dict[str, np.ndarray[Any, np.dtype[np.float64]]]:
        """TF's ``true_positives``, ``false_negatives``, ``true_negatives`` and
        ``false_positives`` at each threshold (host arrays of ``num_thresholds``)."""
        arrays = self._host()
        n = self.num_thresholds
        below_pos = np.cumsum(arrays["positives"])[:n]
        below_neg = np.cumsum(arrays["negatives"])[:n]
        total_pos, total_neg = arrays["positives"].sum(), arrays["negatives"].sum()
        return {
            "tp": total_pos - below_pos,
            "fn": below_pos,
            "tn": below_neg,
            "fp": total_neg - below_neg,
        }

    def result(self) -> float:
        """The area, by ``summation_method`` (see the class docstring)."""
        c = self.confusion()
        tp, fn, tn, fp = c["tp"], c["fn"], c["tn"], c["fp"]
        if self.curve == "PR" and self.summation_method == "careful_interpolation":
            return _interpolate_pr_auc(tp, fp, fn)
        eps = AUC_RATIO_EPSILON
        recall = (tp + eps) / (tp + fn + eps)
        if self.curve == "ROC":
            x, y = fp / (fp + tn + eps), recall
        else:
            x, y = recall, (tp + eps) / (tp + fp + eps)
        if self.summation_method == "minoring":
            heights = np.minimum(y[:-1], y[1:])
        elif self.summation_method == "majoring":
            heights = np.maximum(y[:-1], y[1:])
        else:
            heights = (y[:-1] + y[1:]) / 2.0
        return float(np.sum((x[:-1] - x[1:]) * heights))


def _interpolate_pr_auc(
    tp: np.ndarray[Any, Any], fp: np.ndarray[Any, Any], fn: np.ndarray[Any, Any]
) -> float:
    """TF's PR-AUC by interpolating true and false positives linearly between thresholds.

    In each interval, with ``P = tp + fp`` and ``slope = dTP / dP``, precision is
    ``(TP_A + slope * (P - P_A)) / P``; its integral over recall is
    ``slope * (dTP + intercept * log(P_A / P_B)) / (tp + fn)``, where
    ``intercept = TP_B - slope * P_B``.
    """
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    slope = _div_no_nan(dtp, np.maximum(p[:-1] - p[1:], 0))
    intercept = tp[1:] - slope * p[1:]
    both = (p[:-1] > 0) & (p[1:] > 0)
    ratio = np.where(both, _div_no_nan(p[:-1], np.maximum(p[1:], 0)), 1.0)
    with np.errstate(divide="ignore"):
        log_ratio = np.log(np.where(ratio > 0, ratio, 1.0))
    return float(np.sum(_div_no_nan(slope * (dtp + intercept * log_ratio), tp[1:] + fn[1:])))


def _bins(xp: Any, ids: Any, size: int, weights: Any) -> Any:
    """``bincount(ids, weights, minlength=size)`` on CuPy, without waiting for the device.

    CuPy's ``bincount`` checks its input on the host ("if (x < 0).any():  #
    synchronize!", then ``int(cupy.max(x))`` for the size): two synchronizations
    per call. Here the size is known and the ids are in ``[0, size)`` (checked on
    the device, see :meth:`Metric._check_range`; CuPy wraps an index out of range,
    so a bad batch cannot write outside the counts), so an unbuffered add into
    zeros needs nothing from the host. ``weights`` is float64 or bool (0/1).
    """
    counts = xp.zeros((size,), dtype=_F64)
    weights = weights.astype(_F64, copy=False)
    add_at = getattr(xp.add, "at", None)
    if add_at is not None:
        add_at(counts, ids, weights)
    else:  # pragma: no cover - CuPy before ufunc.at
        import cupyx

        cupyx.scatter_add(counts, ids, weights)
    return counts


# -- per-class metrics -------------------------------------------------------------------------
def _class_ids(metric: Metric, which: str, ids: Any, num_classes: int, xp: Any) -> Any:
    flat = ids.reshape(-1)
    if flat.size and flat.dtype.kind not in "iu":  # floats truncate, as TF casts them
        flat = flat.astype(xp.int64)
    if xp is not np:
        metric._check_range(flat, 0, num_classes - 1, _ids_range(which, num_classes))
    elif flat.size:
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= num_classes:
            raise metric._out_of_range(_ids_range(which, num_classes), low, high, deferred=False)
    return flat.astype(xp.int64, copy=False)


def _ids_range(which: str, num_classes: int) -> str:
    return f"{which} must be class ids in [0, {num_classes})"


def _check_num_classes(name: str | None, kind: str, num_classes: int) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise MetricConfigError(
            f"metric {name if name is not None else kind!r}: num_classes must be a positive "
            f"int, got {num_classes!r}"
        )
    return num_classes


class MeanPerClassAccuracy(Metric):
    """``tf.metrics.mean_per_class_accuracy``: the mean over classes of each class's accuracy.

    Per class ``c``: ``correct[c] / total[c]`` (summed weights of the examples
    labelled ``c`` that are predicted right, over all labelled ``c``; 0 when
    none), then the mean over **all** ``num_classes`` classes, as TF takes it
    (a class never seen counts as 0).
    """

    __slots__ = ("num_classes",)
    kind = "mean_per_class_accuracy"

    def __init__(self, num_classes: int, name: str | None = None) -> None:
        self.num_classes = _check_num_classes(name, self.kind, num_classes)
        super().__init__(name)

    def config(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes}

    def _layout(self) -> dict[str, tuple[int, ...]]:
        return {"total": (self.num_classes,), "correct": (self.num_classes,)}

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch of class ids (any shape, flattened)."""
        predictions = as_array(predictions)
        xp = self._module(predictions)
        labels, predictions = match_shapes(self, labels, predictions)
        n = self.num_classes
        flat_labels = _class_ids(self, "labels", labels, n, xp)
        correct = (predictions.astype(labels.dtype) == labels).reshape(-1)
        if xp is not np:  # no boolean mask and no bincount: each waits for the device
            if weights is None:
                w = xp.ones(flat_labels.shape, _F64)
            else:
                w = broadcast_weights(self, weights, labels.shape, xp).reshape(-1)
            total = _bins(xp, flat_labels, n, w)
            right = _bins(xp, flat_labels, n, w * correct)
        elif weights is None:
            total = xp.bincount(flat_labels, minlength=n)
            right = xp.bincount(flat_labels[correct], minlength=n)
        else:
            w = broadcast_weights(self, weights, labels.shape, xp).reshape(-1)
            total = xp.bincount(flat_labels, weights=w, minlength=n)
            right = xp.bincount(flat_labels, weights=w * correct, minlength=n)
        self._arrays["total"] += total
        self._arrays["correct"] += right
        self._updates += 1

    def per_class(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Each class's accuracy (0 for a class never seen), on the host."""
        arrays = self._host()
        return _div_no_nan(arrays["correct"], np.maximum(arrays["total"], 0))

    def result(self) -> float:
        """The mean of :meth:`per_class` over all classes."""
        return float(np.mean(self.per_class()))


class MeanIoU(Metric):
    """``tf.metrics.mean_iou``: the mean intersection-over-union over classes.

    A confusion matrix ``cm[label, prediction]`` of summed weights; per class
    ``IoU = cm[c, c] / (row_sum[c] + col_sum[c] - cm[c, c])``; the mean is over
    the classes whose denominator is not 0 (seen as a label or a prediction),
    and 0 when there is none.
    """

    __slots__ = ("num_classes",)
    kind = "mean_iou"

    def __init__(self, num_classes: int, name: str | None = None) -> None:
        self.num_classes = _check_num_classes(name, self.kind, num_classes)
        super().__init__(name)

    def config(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes}

    def _layout(self) -> dict[str, tuple[int, ...]]:
        return {"confusion_matrix": (self.num_classes, self.num_classes)}

    def update(self, labels: Any, predictions: Any, weights: Any = None) -> None:
        """Add a batch of class ids (any shape, flattened)."""
        predictions = as_array(predictions)
        xp = self._module(predictions)
        labels, predictions = match_shapes(self, labels, predictions)
        n = self.num_classes
        cell = _class_ids(self, "labels", labels, n, xp) * n + _class_ids(
            self, "predictions", predictions, n, xp
        )
        w = None
        if weights is not None:
            w = broadcast_weights(self, weights, labels.shape, xp).reshape(-1)
        if xp is not np:
            counts = _bins(xp, cell, n * n, xp.ones(cell.shape, _F64) if w is None else w)
        else:
            counts = xp.bincount(cell, weights=w, minlength=n * n)
        self._arrays["confusion_matrix"] += counts.reshape(n, n)
        self._updates += 1

    def result(self) -> float:
        """The mean IoU over the classes that were seen; ``0.0`` when none was."""
        cm = self._host()["confusion_matrix"]
        diag = np.diag(cm)
        denominator = cm.sum(axis=0) + cm.sum(axis=1) - diag
        valid = int(np.count_nonzero(denominator))
        if valid == 0:
            return 0.0
        iou = diag / np.where(denominator > 0, denominator, 1.0)
        return float(iou.sum() / valid)
