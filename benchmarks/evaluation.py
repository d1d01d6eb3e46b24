"""Streaming-metric updates: monitored.metrics vs the same sums written inline in NumPy.

For each metric this times ``metric.update(...)`` (input checks, weights, the
accumulation into float64 arrays) against the shortest inline NumPy code that
accumulates the same sums, written below and run in the same process on the
same batches. Both are timed alternately after a warm-up, over ``--updates``
updates per repeat; the medians are compared. The ratio is monitored's time
over the inline code's (the target is at most 1.2).

The inline AUC baseline uses the same bucketing (``searchsorted`` + ``bincount``)
that monitored uses; TF's own tiled comparison is O(n * thresholds) and far slower.

    python benchmarks/evaluation.py [--batch 4096] [--updates 200] [--repeats 7]

Prints a markdown table and the command that produced it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from monitored import metrics as m


def _inline_mean() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        acc[0] += preds.sum(dtype=np.float64)
        acc[1] += preds.size

    return update, lambda: float(acc[0] / acc[1])


def _inline_accuracy() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        acc[0] += (labels == preds).sum(dtype=np.float64)
        acc[1] += labels.size

    return update, lambda: float(acc[0] / acc[1])


def _inline_mse() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        d = np.subtract(labels, preds, dtype=np.float64)
        acc[0] += (d * d * weights).sum()
        acc[1] += weights.sum()

    return update, lambda: float(acc[0] / acc[1])


def _inline_precision() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        lab, pred = labels.astype(bool), preds.astype(bool)
        acc[0] += np.count_nonzero(lab & pred)
        acc[1] += np.count_nonzero(~lab & pred)

    return update, lambda: float(acc[0] / (acc[0] + acc[1]))


def _inline_auc() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    thresholds = m.auc_thresholds(200)
    pos, neg = np.zeros(201), np.zeros(201)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        bucket = np.searchsorted(thresholds, preds, side="left")
        lab = labels.astype(bool)
        pos[:] += np.bincount(bucket[lab], minlength=201)
        neg[:] += np.bincount(bucket[~lab], minlength=201)

    return update, lambda: 0.0


def _inline_iou() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    cm = np.zeros((10, 10))

    def update(labels: Any, preds: Any, weights: Any) -> None:
        cm[:] += np.bincount(labels * 10 + preds, minlength=100).reshape(10, 10)

    return update, lambda: 0.0


def _time_case(
    label: str,
    make: Callable[[], Any],
    make_inline: Any,
    labels: Any,
    preds: Any,
    weights: Any,
    weighted: bool,
    args: argparse.Namespace,
) -> tuple[float, float]:
    """Median µs per update: (monitored, inline)."""
    w = weights if weighted else None

    def run_monitored() -> None:
        metric = make()
        if label == "Mean":
            for _ in range(args.updates):
                metric.update(preds)
        else:
            for _ in range(args.updates):
                metric.update(labels, preds, w)

    def run_inline() -> None:
        update, _ = make_inline()
        for _ in range(args.updates):
            update(labels, preds, weights)

    run_monitored()
    run_inline()
    mine, theirs = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        run_monitored()
        mine.append(time.perf_counter() - start)
        start = time.perf_counter()
        run_inline()
        theirs.append(time.perf_counter() - start)
    return (
        statistics.median(mine) / args.updates * 1e6,
        statistics.median(theirs) / args.updates * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.batch
    binary = rng.integers(0, 2, n)
    scores = rng.random(n).astype(np.float32)
    weights = rng.random(n)
    classes, predicted = rng.integers(0, 10, n), rng.integers(0, 10, n)
    hard = (scores > 0.5).astype(np.int64)
    cases: list[tuple[str, Callable[[], Any], Any, Any, Any, bool]] = [
        ("Mean", m.Mean, _inline_mean, binary, scores, False),
        ("Accuracy", m.Accuracy, _inline_accuracy, binary, hard, False),
        ("MeanSquaredError (weighted)", m.MeanSquaredError, _inline_mse, scores, binary, True),
        ("Precision", m.Precision, _inline_precision, binary, hard, False),
        ("AUC (200 thresholds)", m.AUC, _inline_auc, binary, scores, False),
        ("MeanIoU (10 classes)", lambda: m.MeanIoU(10), _inline_iou, classes, predicted, False),
    ]
    print(
        f"python benchmarks/evaluation.py --batch {n} --updates {args.updates} "
        f"--repeats {args.repeats}\n"
    )
    print(
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"NumPy {np.__version__}, batch {n}\n"
    )
    print("| metric | monitored (µs/update) | inline NumPy (µs/update) | ratio |")
    print("|---|---:|---:|---:|")
    ratios = []
    for label, make, make_inline, labels, preds, weighted in cases:
        a, b = _time_case(label, make, make_inline, labels, preds, weights, weighted, args)
        ratios.append(a / b)
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print(f"\nworst ratio {max(ratios):.2f}", file=sys.stdout)


if __name__ == "__main__":
    main()
