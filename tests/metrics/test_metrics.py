"""Streaming metrics against TF1's ``tf.compat.v1.metrics`` formulas.

TensorFlow is not installed here: each expected value is computed from the
formula TF documents and implements (``tensorflow/python/ops/metrics_impl.py``),
quoted in the test, on the same batches streamed in the same order. AUC is also
cross-checked against scikit-learn's ``roc_auc_score`` where the 200 thresholds
cannot change the answer, and against small cases computed by hand.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from monitored import metrics as m

RNG = np.random.default_rng(1234)
BATCHES = 4


def _batches(n: int = 64) -> list[tuple[Any, Any, Any]]:
    out = []
    for _ in range(BATCHES):
        labels = RNG.integers(0, 2, n)
        preds = RNG.random(n).astype(np.float32)
        weights = RNG.random(n)
        out.append((labels, preds, weights))
    return out


def test_mean_is_total_over_count_weighted() -> None:
    # TF: total += sum(values * weights); count += sum(weights); mean = div_no_nan(total, count)
    batches = [(RNG.normal(size=(8, 3)), RNG.random((8, 1))) for _ in range(BATCHES)]
    metric = m.Mean()
    for values, weights in batches:
        metric.update(values, weights)
    total = sum(float(np.sum(v * w)) for v, w in batches)
    count = sum(float(np.sum(np.broadcast_to(w, v.shape))) for v, w in batches)
    assert metric.result() == pytest.approx(total / count, rel=1e-6)


def test_never_updated_metric_is_zero_as_in_tf() -> None:
    # TF's div_no_nan: an empty mean is 0, not NaN; `empty` tells the two apart.
    for metric in [m.Mean(), m.Accuracy(), m.Precision(), m.Recall(), m.AUC(), m.MeanIoU(3)]:
        assert metric.empty
        assert metric.result() == 0.0 or isinstance(metric, m.AUC)


def test_accuracy_casts_predictions_to_the_labels_dtype() -> None:
    # TF: is_correct = cast(equal(cast(predictions, labels.dtype), labels), float32), then mean
    metric = m.Accuracy()
    metric.update(np.array([1, 2, 3]), np.array([1.7, 2.0, 0.0]))
    assert metric.result() == pytest.approx(2 / 3)
    metric.update([1, 1], [1, 0], weights=[3.0, 1.0])
    assert metric.result() == pytest.approx((2 + 3.0) / (3 + 3.0 + 1.0))


def test_regression_errors_follow_tf() -> None:
    # TF: mse = mean(squared_difference(labels, predictions)); rmse = sqrt(mse); mae = mean(|l - p|)
    mse, rmse, mae = m.MeanSquaredError(), m.RootMeanSquaredError(), m.MeanAbsoluteError()
    labels_all, preds_all, w_all = [], [], []
    for _ in range(BATCHES):
        labels, preds, w = RNG.normal(size=10), RNG.normal(size=10), RNG.random(10)
        for metric in (mse, rmse, mae):
            metric.update(labels, preds, w)
        labels_all.append(labels)
        preds_all.append(preds)
        w_all.append(w)
    labels, preds, w = map(np.concatenate, (labels_all, preds_all, w_all))
    expected = np.sum(w * (labels - preds) ** 2) / np.sum(w)
    assert mse.result() == pytest.approx(expected, rel=1e-6)
    assert rmse.result() == pytest.approx(math.sqrt(expected), rel=1e-6)
    assert mae.result() == pytest.approx(np.sum(w * np.abs(labels - preds)) / np.sum(w), rel=1e-6)


def test_counts_precision_recall() -> None:
    # TF: labels and predictions cast to bool; tp = sum(w * (l & p)); precision = tp / (tp + fp)
    # (0 when tp + fp == 0); recall = tp / (tp + fn)
    labels = np.array([1, 1, 0, 0, 1, 0])
    preds = np.array([1, 0, 1, 0, 1, 0])
    w = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    made = {
        "tp": m.TruePositives(),
        "fp": m.FalsePositives(),
        "tn": m.TrueNegatives(),
        "fn": m.FalseNegatives(),
        "p": m.Precision(),
        "r": m.Recall(),
    }
    for metric in made.values():
        metric.update(labels, preds, w)
    assert made["tp"].result() == 6.0
    assert made["fp"].result() == 3.0
    assert made["tn"].result() == 10.0
    assert made["fn"].result() == 2.0
    assert made["p"].result() == pytest.approx(6 / 9)
    assert made["r"].result() == pytest.approx(6 / 8)


def test_auc_thresholds_are_tfs() -> None:
    # TF: [0 - 1e-7] + [(i + 1) / (n - 1) for i in range(n - 2)] + [1 + 1e-7], as float32
    t = m.auc_thresholds(200)
    assert t.dtype == np.float32
    assert t.shape == (200,)
    assert t[0] == np.float32(-1e-7)
    assert t[-1] == np.float32(1 + 1e-7)
    assert t[1] == np.float32(1 / 199)
    assert t[198] == np.float32(198 / 199)


def _tf_auc(labels: Any, preds: Any, weights: Any, n: int = 200, curve: str = "ROC") -> float:
    """TF's trapezoidal AUC written the way TF writes it: tiled comparisons, O(n * T)."""
    t = m.auc_thresholds(n)
    pos = np.asarray(labels).astype(bool).reshape(1, -1)
    above = np.asarray(preds, dtype=np.float32).reshape(1, -1) > t.reshape(-1, 1)
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64).reshape(1, -1), above.shape)
    tp = np.sum(w * (pos & above), 1)
    fn = np.sum(w * (pos & ~above), 1)
    tn = np.sum(w * (~pos & ~above), 1)
    fp = np.sum(w * (~pos & above), 1)
    eps = 1e-6
    rec = (tp + eps) / (tp + fn + eps)
    if curve == "ROC":
        x, y = fp / (fp + tn + eps), rec
    else:
        x, y = rec, (tp + eps) / (tp + fp + eps)
    return float(np.sum((x[:-1] - x[1:]) * (y[:-1] + y[1:]) / 2))


@pytest.mark.parametrize("curve", ["ROC", "PR"])
def test_auc_streamed_equals_tfs_computation(curve: str) -> None:
    batches = _batches()
    metric = m.AUC(curve=curve)  # type: ignore[arg-type]
    for labels, preds, w in batches:
        metric.update(labels, preds, w)
    labels, preds, w = (np.concatenate(x) for x in zip(*batches, strict=True))
    assert metric.result() == pytest.approx(_tf_auc(labels, preds, w, curve=curve), rel=1e-6)


def test_auc_matches_scikit_learn_where_discretization_cannot_matter() -> None:
    # Predictions at bucket centres, one distinct score per bucket: the 200-threshold
    # ROC curve is then the exact ROC curve, and the trapezoid the exact area.
    labels = RNG.integers(0, 2, 2000)
    preds = (RNG.integers(0, 199, 2000) + 0.5) / 199
    metric = m.AUC()
    metric.update(labels, preds)
    assert metric.result() == pytest.approx(roc_auc_score(labels, preds), abs=1e-6)


def test_auc_hand_computed_cases() -> None:
    # Perfect separation: ROC area 1 (up to TF's epsilons); reversed: 0.
    perfect = m.AUC()
    perfect.update([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9])
    assert perfect.result() == pytest.approx(1.0, abs=1e-5)
    reversed_ = m.AUC()
    reversed_.update([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9])
    assert reversed_.result() == pytest.approx(0.0, abs=1e-5)
    # Three thresholds (-eps, 0.5, 1+eps), labels [1, 0], predictions [0.6, 0.6]:
    # at 0.5 tp=1 fp=1 -> (fpr, tpr) = (1, 1); the curve is the diagonal: area 0.5.
    tiny = m.AUC(num_thresholds=3)
    tiny.update([1, 0], [0.6, 0.6])
    assert tiny.result() == pytest.approx(0.5, abs=1e-5)


def test_auc_summation_methods_bound_the_trapezoid() -> None:
    labels, preds, _ = _batches()[0]
    values = {}
    for method in ("minoring", "trapezoidal", "majoring", "careful_interpolation"):
        metric = m.AUC(curve="PR", summation_method=method)  # type: ignore[arg-type]
        metric.update(labels, preds)
        values[method] = metric.result()
    assert values["minoring"] <= values["trapezoidal"] <= values["majoring"]
    assert 0 < values["careful_interpolation"] <= 1


def test_per_class_accuracy_averages_over_all_classes_as_tf() -> None:
    # TF: per_class = div_no_nan(correct, total) per label class; reduce_mean over num_classes
    metric = m.MeanPerClassAccuracy(num_classes=4)
    metric.update([0, 0, 1, 1, 2], [0, 1, 1, 1, 0])
    metric.update([2, 2], [2, 2])
    assert metric.result() == pytest.approx((0.5 + 1.0 + 2 / 3 + 0.0) / 4)


def test_mean_iou_over_the_classes_seen() -> None:
    # TF: cm[label, pred]; iou = diag / (row + col - diag); mean over classes with denominator != 0
    metric = m.MeanIoU(num_classes=4)
    metric.update([0, 1, 2, 2], [0, 2, 2, 2])
    # class 0: 1/1; class 1: 0/(1+0-0); class 2: 2/(2+3-2); class 3 unseen
    assert metric.result() == pytest.approx((1 + 0 + 2 / 3) / 3)


ALL: list[Any] = [
    (m.Mean, {}),
    (m.Accuracy, {}),
    (m.Precision, {}),
    (m.Recall, {}),
    (m.AUC, {}),
    (m.MeanSquaredError, {}),
    (m.MeanAbsoluteError, {}),
    (m.TruePositives, {}),
    (m.MeanPerClassAccuracy, {"num_classes": 2}),
    (m.MeanIoU, {"num_classes": 2}),
]


def _feed(metric: Any, labels: Any, preds: Any, w: Any) -> None:
    if isinstance(metric, m.Mean):
        metric.update(preds, w)
    elif isinstance(
        metric,
        (m.MeanPerClassAccuracy | m.MeanIoU, m.Accuracy | m.Precision | m.Recall | m.TruePositives),
    ):
        metric.update(labels, (preds > 0.5).astype(np.int64), w)
    else:
        metric.update(labels, preds, w)


@pytest.mark.parametrize(("cls", "kwargs"), ALL)
def test_merged_halves_equal_the_whole_and_state_round_trips(cls: Any, kwargs: Any) -> None:
    batches = _batches()
    whole, first, second = cls(**kwargs), cls(**kwargs), cls(**kwargs)
    for i, (labels, preds, w) in enumerate(batches):
        w = np.round(w * 8) / 8  # dyadic weights: sums are exact in any order
        _feed(whole, labels, preds, w)
        _feed(first if i < BATCHES // 2 else second, labels, preds, w)
    first.merge(second)
    assert first.result() == whole.result()
    rebuilt = m.Metric.from_state(first.state())
    assert type(rebuilt) is cls
    assert rebuilt.result() == whole.result()
    assert rebuilt.updates == BATCHES
    whole.reset()
    assert whole.empty


def test_shape_mismatch_names_the_metric_and_both_shapes() -> None:
    with pytest.raises(m.MetricShapeError, match=r"'acc'.*\(3,\).*\(4,\)"):
        m.Accuracy(name="acc").update([1, 2, 3], [1, 2, 3, 4])


def test_trailing_dimension_of_one_is_squeezed_as_tf() -> None:
    metric = m.Accuracy()
    metric.update(np.array([[1], [2]]), np.array([1, 0]))
    assert metric.result() == 0.5


def test_weights_that_do_not_broadcast() -> None:
    with pytest.raises(m.MetricWeightsError, match=r"'mean'.*\(3,\).*\(2, 2\)"):
        m.Mean().update(np.ones((2, 2)), np.ones(3))


def test_auc_configuration_and_range_errors() -> None:
    with pytest.raises(m.MetricConfigError, match="num_thresholds must be at least 2"):
        m.AUC(num_thresholds=1)
    with pytest.raises(m.MetricValueError, match=r"'auc'.*\[0, 1\].*1\.5"):
        m.AUC().update([0, 1], [0.5, 1.5])
    with pytest.raises(m.MetricValueError, match="class ids"):
        m.MeanIoU(2).update([0, 2], [0, 1])


def test_merge_refuses_different_configurations_and_bad_state() -> None:
    with pytest.raises(m.MetricMergeError, match="same kind"):
        m.AUC(num_thresholds=10).merge(m.AUC())
    with pytest.raises(m.MetricStateError, match="kind 'nope'"):
        m.Metric.from_state({"kind": "nope"})
