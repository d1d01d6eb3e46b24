"""The sender's bound on pending points: past ``max_pending``, an even, coarser curve.

The writer's queue alone, without a store (its thread is not started): what
stays pending after more points than ``max_pending`` came, and the counts.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from monitored_mlflow._writer import RunWriter, SenderConfig


def writer(max_pending: int) -> RunWriter:
    config = SenderConfig("sqlite:///unused.db", "e", None, "key", max_pending=max_pending)
    return RunWriter(config, lambda message: None)


def test_past_max_pending_each_metric_keeps_an_even_grid_and_its_newest(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    w = writer(max_pending=100)
    for step in range(1, 1001):
        w.add([(step, 0, {"loss": 1.0 / step, "acc": 0.5})], [])
    pending = [point for _, point in w._points]
    assert len(pending) <= 100
    for key in ("loss", "acc"):
        steps = [p[3] for p in pending if p[0] == key]
        gaps = {b - a for a, b in itertools.pairwise(steps)}
        assert len(gaps) == 1, "evenly spaced"
        assert steps[0] - 1 < gaps.pop(), "from the first step on: no gap at the start"
        assert w._tail[key][3] == 1000, "the newest is kept for the close"
    # Every point is pending, held as the newest, or counted as dropped.
    assert w.received == 2000
    assert len(pending) + len(w._tail) + w.dropped == 2000
    assert w.settled == w.dropped
    said = [r.getMessage() for r in caplog.records]
    assert said
    assert "max_pending=100" in said[0]
    assert len(said) <= 12, "said again only when the count doubled"


def test_within_max_pending_nothing_is_dropped() -> None:
    w = writer(max_pending=100)
    for step in range(1, 51):
        w.add([(step, 0, {"loss": 1.0})], [])
    assert [p[3] for _, p in w._points] == list(range(1, 51))
    assert w.dropped == 0
    assert not w._tail


def test_a_thinning_keeps_the_newest_point_even_when_it_was_on_the_old_grid() -> None:
    w = writer(max_pending=8)
    # Ten points on the grid of stride 1 in one frame: the stride doubles, and the
    # newest (its 10th point, off the grid of 2) is kept for the close.
    w.add([(step, 0, {"loss": float(step)}) for step in range(1, 11)], [])
    assert [p[3] for _, p in w._points] == [1, 3, 5, 7, 9]
    assert w._tail["loss"][3] == 10
    assert len(w._points) + len(w._tail) + w.dropped == 10
