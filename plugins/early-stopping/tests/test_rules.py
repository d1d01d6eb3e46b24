"""The stop decisions: Keras's EarlyStopping and TF1 Estimator's stop_if_no_decrease_hook.

The expected figures are Keras's decisions for the same sequences, worked out
from its documented semantics (a "check" here is Keras's epoch): ``wait`` grows
by one per observed check, resets on an improvement beyond ``min_delta`` only if
it also beats ``baseline``, an improvement never stops, and the first observed
check never stops.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from monitored_early_stopping import (
    EarlyStoppingConfigError,
    KerasRule,
    NoImprovementRule,
    infer_mode,
)


def checks_until_stop(values: list[float], mode: Any = "min", **kwargs: Any) -> int | None:
    """How many values Keras consumes before it stops (``None``: it never stops)."""
    rule = KerasRule(mode, **kwargs)
    for index, value in enumerate(values):
        if rule.observe(index, value).stop:
            return index + 1
    return None


@pytest.mark.parametrize(
    ("values", "mode", "kwargs", "expected"),
    [
        # Keras's own patience example: no improvement for two epochs after the first.
        ([0.0860, 0.1096, 0.1040, 0.1019], "min", {"patience": 2}, 3),
        ([1.0, 2.0], "min", {"patience": 0}, 2),
        ([1.0, 0.9, 0.8, 0.7], "min", {"patience": 0}, None),
        # The first observed check never stops, even a NaN one with patience 0.
        ([math.nan, 1.0, 0.5], "max", {"patience": 0}, 3),
        # min_delta: 0.05 better is not better enough; its sign does not matter.
        ([1.0, 0.95, 0.92, 0.85], "min", {"patience": 1, "min_delta": 0.1}, 2),
        ([1.0, 0.95, 0.92, 0.85], "min", {"patience": 2, "min_delta": -0.1}, 3),
        ([1.0, 0.95, 0.80, 0.78], "min", {"patience": 2, "min_delta": 0.1}, None),
        # Equal is not better.
        ([0.5, 0.5, 0.5], "max", {"patience": 2}, 3),
        # baseline: improvements below it do not reset wait, but never stop either.
        ([0.55, 0.74, 0.81, 0.81, 0.80, 0.79], "max", {"patience": 2, "baseline": 0.75}, 5),
        ([0.5, 0.6, 0.7, 0.8, 0.85], "max", {"patience": 3, "baseline": 0.9}, None),
        ([0.5, 0.6, 0.55], "max", {"patience": 3, "baseline": 0.9}, 3),
        ([0.5, 0.4, 0.45], "max", {"patience": 1, "baseline": 0.9}, 2),
        # start_from (start_from_epoch): the first checks are not looked at.
        ([5.0, 6.0, 7.0, 8.0], "min", {"patience": 0, "start_from": 2}, 4),
        ([5.0, 6.0, 7.0, 6.5, 6.9], "min", {"patience": 1, "start_from": 2}, 5),
        ([9.0, 1.0, 2.0, 3.0, 4.0], "min", {"patience": 3, "start_from": 1}, 5),
    ],
)
def test_keras_rule_stops_where_keras_stops(
    values: list[float], mode: str, kwargs: dict[str, Any], expected: int | None
) -> None:
    assert checks_until_stop(values, mode, **kwargs) == expected


def test_keras_rule_tracks_the_best_and_the_first_check_as_the_state_to_restore() -> None:
    rule = KerasRule("min", patience=5)
    decisions = [rule.observe(step, v) for step, v in [(10, math.nan), (20, 3.0), (30, 4.0)]]
    assert [d.snapshot for d in decisions] == [True, True, False]
    assert (rule.best, rule.best_step, rule.wait) == (3.0, 20, 1)


def test_keras_rule_state_round_trips() -> None:
    straight = KerasRule("min", patience=2)
    resumed = KerasRule("min", patience=2)
    values = [3.0, 2.0, 2.5, 2.4, 2.6]
    for i, v in enumerate(values[:2]):
        straight.observe(i, v)
        resumed.observe(i, v)
    copy = KerasRule("min", patience=2)
    copy.load_state_dict(resumed.state_dict())
    assert [straight.observe(i, v).stop for i, v in enumerate(values[2:], 2)] == [
        copy.observe(i, v).stop for i, v in enumerate(values[2:], 2)
    ]


@pytest.mark.parametrize(
    ("observations", "mode", "max_steps", "min_steps", "expected"),
    [
        ([(1, 0.1), (2, 5.0), (3, 4.0), (4, 4.5), (5, 4.2), (6, 4.1)], "min", 3, 2, 6),
        ([(100, 5.0), (200, 5.0), (300, 5.0)], "min", 200, 0, 300),  # equal is not a decrease
        ([(100, 5.0), (200, 4.0), (300, 3.0)], "min", 100, 0, None),
        ([(10, 0.5), (20, 0.6), (30, 0.6), (40, 0.59)], "max", 20, 0, 40),
        ([(10, 0.5), (20, 0.6)], "max", 0, 0, 10),  # 0 steps without increase: stop at once
    ],
)
def test_estimator_rule_counts_steps_since_the_best(
    observations: list[tuple[int, float]], mode: Any, max_steps: int, min_steps: int, expected: Any
) -> None:
    rule = NoImprovementRule(mode, max_steps, min_steps)
    stopped = next((s for s, v in observations if rule.observe(s, v).stop), None)
    assert stopped == expected


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("loss", "min"),
        ("val_loss", "min"),
        ("eval/cross_entropy_loss", "min"),
        ("error_rate", "min"),
        ("accuracy", "max"),
        ("val_acc", "max"),
        ("auc", "max"),
        ("f1", "max"),
    ],
)
def test_auto_mode_reads_the_name(name: str, mode: str) -> None:
    assert infer_mode(name, "auto", "X") == mode


def test_auto_mode_refuses_to_guess_and_unknown_modes_are_errors() -> None:
    with pytest.raises(EarlyStoppingConfigError, match="X: cannot tell from the name 'grad_norm'"):
        infer_mode("grad_norm", "auto", "X")
    with pytest.raises(EarlyStoppingConfigError, match="X: mode must be 'auto', 'min' or 'max'"):
        infer_mode("loss", "down", "X")
