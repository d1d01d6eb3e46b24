"""Learning-rate schedules against TF1's formulas, written out per step."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import GradientDescentOptimizer
from monitored.train.schedules import (
    LearningRateSchedule,
    cosine_decay,
    cosine_decay_restarts,
    exponential_decay,
    inverse_time_decay,
    linear_warmup,
    natural_exp_decay,
    piecewise_constant,
    polynomial_decay,
)

STEPS = [0, 1, 2, 5, 9, 10, 11, 99, 100, 101, 1234]


def _check(schedule: LearningRateSchedule, formula: Callable[[int], float]) -> None:
    for step in STEPS:
        assert schedule(step) == pytest.approx(formula(step), rel=1e-12, abs=1e-15), step


@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_decay(staircase: bool) -> None:
    def formula(s: int) -> float:
        p = s // 10 if staircase else s / 10
        return 0.1 * 0.96**p

    _check(exponential_decay(0.1, 10, 0.96, staircase=staircase), formula)


@pytest.mark.parametrize("staircase", [False, True])
def test_natural_exp_decay(staircase: bool) -> None:
    def formula(s: int) -> float:
        p = s // 10 if staircase else s / 10
        return 0.1 * math.exp(-0.5 * p)

    _check(natural_exp_decay(0.1, 10, 0.5, staircase=staircase), formula)


@pytest.mark.parametrize("staircase", [False, True])
def test_inverse_time_decay(staircase: bool) -> None:
    def formula(s: int) -> float:
        p = s // 10 if staircase else s / 10
        return 0.1 / (1 + 0.5 * p)

    _check(inverse_time_decay(0.1, 10, 0.5, staircase=staircase), formula)


def test_piecewise_constant_boundaries_belong_to_the_earlier_piece() -> None:
    schedule = piecewise_constant([10, 100], [1.0, 0.5, 0.1])
    assert [schedule(s) for s in (0, 10, 11, 100, 101)] == [1.0, 1.0, 0.5, 0.5, 0.1]


def test_polynomial_decay() -> None:
    def formula(s: int) -> float:
        s = min(s, 100)
        return (0.1 - 0.001) * (1 - s / 100) ** 2 + 0.001

    _check(polynomial_decay(0.1, 100, end_learning_rate=0.001, power=2.0), formula)


def test_polynomial_decay_cycle() -> None:
    def formula(s: int) -> float:
        decay_steps = 100 * (1 if s == 0 else math.ceil(s / 100))
        return (0.1 - 0.001) * (1 - s / decay_steps) + 0.001

    schedule = polynomial_decay(0.1, 100, end_learning_rate=0.001, cycle=True)
    _check(schedule, formula)
    assert schedule(100) == pytest.approx(0.001)
    assert schedule(101) == pytest.approx((0.1 - 0.001) * (1 - 101 / 200) + 0.001)


def test_cosine_decay() -> None:
    def formula(s: int) -> float:
        s = min(s, 100)
        return 0.1 * ((1 - 0.1) * 0.5 * (1 + math.cos(math.pi * s / 100)) + 0.1)

    _check(cosine_decay(0.1, 100, alpha=0.1), formula)


def test_cosine_decay_restarts_periods_grow_by_t_mul() -> None:
    schedule = cosine_decay_restarts(1.0, 10, t_mul=2.0, m_mul=0.5)
    # Periods: [0, 10), [10, 30), [30, 70), [70, 150): each restart at half height.
    for start, height in [(0, 1.0), (10, 0.5), (30, 0.25), (70, 0.125), (150, 0.0625)]:
        assert schedule(start) == pytest.approx(height), start
    assert schedule(20) == pytest.approx(0.5 * 0.5)  # half-way through the second period
    assert schedule(29) < schedule(28) < schedule(10)


def test_cosine_decay_restarts_matches_tf1_closed_form_between_restarts() -> None:
    def formula(s: int) -> float:
        fraction = s / 7
        i = math.floor(math.log(1 - fraction * (1 - 1.5)) / math.log(1.5))
        sum_r = (1 - 1.5**i) / (1 - 1.5)
        within = (fraction - sum_r) / 1.5**i
        cosine = 0.5 * 0.9**i * (1 + math.cos(math.pi * within))
        return 0.2 * ((1 - 0.05) * cosine + 0.05)

    schedule = cosine_decay_restarts(0.2, 7, t_mul=1.5, m_mul=0.9, alpha=0.05)
    for step in range(3000):
        assert schedule(step) == pytest.approx(formula(step), rel=1e-9), step


def test_cosine_decay_restarts_is_exact_where_the_closed_form_rounds() -> None:
    # With t_mul=3 restarts fall on steps 1, 4, 13, 40, 121; TF1's
    # floor(log(1 + 2 * 121) / log(3)) rounds to 4, putting step 121 at the
    # bottom of the previous period instead of the top of the next.
    assert math.floor(math.log(1 + 2 * 121) / math.log(3)) == 4
    schedule = cosine_decay_restarts(1.0, 1, t_mul=3.0, m_mul=0.5)
    assert schedule(121) == pytest.approx(0.5**5)
    assert schedule(120) < 0.01


def test_cosine_decay_restarts_with_constant_periods() -> None:
    schedule = cosine_decay_restarts(1.0, 4, t_mul=1.0)
    assert [round(schedule(s), 12) for s in range(9)] == [
        round(0.5 * (1 + math.cos(math.pi * (s % 4) / 4)), 12) for s in range(9)
    ]


def test_linear_warmup_of_a_constant_and_of_a_schedule() -> None:
    warm = linear_warmup(0.1, 10, start_learning_rate=0.01)
    assert warm(0) == pytest.approx(0.01)
    assert warm(5) == pytest.approx(0.01 + 0.09 * 0.5)
    assert warm(10) == warm(1000) == 0.1
    decayed = exponential_decay(0.1, 100, 0.5)
    warm = linear_warmup(decayed, 20)
    assert warm(0) == 0.0
    assert warm(10) == pytest.approx(decayed(20) / 2)
    assert warm(20) == warm._value(20) == decayed(20)
    assert warm(50) == decayed(50)


def test_linear_warmup_checks_the_wrapped_schedule() -> None:
    warm = linear_warmup(lambda step: -1.0, 5)
    with pytest.raises(ValueError, match="returned -1.0 at step 5"):
        warm(3)


def test_schedules_drive_an_optimizer() -> None:
    state = TrainState({"w": np.zeros(1)})
    opt = GradientDescentOptimizer(piecewise_constant([1], [1.0, 0.5]))
    for _ in range(4):
        opt.apply_gradients(state, {"w": np.ones(1)})
    assert state["w"][0] == -(1.0 + 1.0 + 0.5 + 0.5)


@pytest.mark.parametrize("step", [-1, 1.5, True, "3", None])
def test_the_step_must_be_a_non_negative_integer(step: Any) -> None:
    with pytest.raises(ValueError, match="global step must be a non-negative integer"):
        exponential_decay(0.1, 10, 0.9)(step)


def test_numpy_integer_steps_are_accepted() -> None:
    assert exponential_decay(0.1, 10, 0.5)(np.int64(10)) == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: exponential_decay(0.1, 0, 0.9), ValueError, "decay_steps must be positive"),
        (lambda: exponential_decay(-0.1, 10, 0.9), ValueError, "learning_rate must be >= 0"),
        (lambda: exponential_decay(0.1, 10, 0.0), ValueError, "decay_rate must be positive"),
        (lambda: exponential_decay(0.1, 10, 0.9, staircase=1), TypeError, "staircase"),
        (lambda: exponential_decay(0.1, None, 0.9), TypeError, "take no global_step"),
        (lambda: exponential_decay(0.1, 10, float("inf")), ValueError, "must be finite"),
        (lambda: natural_exp_decay(0.1, 10, -1.0), ValueError, "decay_rate must be >= 0"),
        (lambda: inverse_time_decay(0.1, -5, 1.0), ValueError, "decay_steps must be positive"),
        (lambda: piecewise_constant([10], [1.0]), ValueError, "one more entry"),
        (lambda: piecewise_constant([10, 5], [1.0, 2.0, 3.0]), ValueError, "increase strictly"),
        (lambda: piecewise_constant("ab", [1.0]), TypeError, "sequences of numbers"),
        (lambda: polynomial_decay(0.1, 10, power=-1.0), ValueError, "power must be >= 0"),
        (lambda: polynomial_decay(0.1, 10, cycle="yes"), TypeError, "cycle"),
        (lambda: cosine_decay(0.1, 10, alpha=2.0), ValueError, "alpha must be at most 1"),
        (lambda: cosine_decay_restarts(0.1, 10, t_mul=0.5), ValueError, "t_mul must be >= 1"),
        (lambda: cosine_decay_restarts(0.1, 10, alpha=1.5), ValueError, "alpha must be at most"),
        (lambda: cosine_decay_restarts(0.1, 10, m_mul=-1.0), ValueError, "m_mul must be >= 0"),
        (lambda: linear_warmup(0.1, 0), ValueError, "warmup_steps must be a positive integer"),
        (lambda: linear_warmup(0.1, 2.5), ValueError, "warmup_steps must be a positive integer"),
        (lambda: linear_warmup(-0.1, 5), ValueError, "learning_rate must be >= 0"),
    ],
)
def test_arguments_are_checked(make: Callable[[], Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_tf1_positional_global_step_fails_loudly() -> None:
    with pytest.raises(TypeError):
        exponential_decay(0.1, 7, 100000, 0.96)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        polynomial_decay(0.1, 7, 10000)  # type: ignore[misc]


def test_reprs_show_the_call() -> None:
    assert repr(exponential_decay(0.1, 10, 0.96, staircase=True)) == (
        "exponential_decay(0.1, 10.0, 0.96, staircase=True)"
    )
    assert repr(piecewise_constant([1], [0.1, 0.01])) == "piecewise_constant([1.0], [0.1, 0.01])"
    for schedule in [
        natural_exp_decay(0.1, 10, 0.5),
        inverse_time_decay(0.1, 10, 0.5),
        polynomial_decay(0.1, 10),
        cosine_decay(0.1, 10),
        cosine_decay_restarts(0.1, 10),
        linear_warmup(0.1, 10),
    ]:
        assert repr(schedule).startswith(repr(schedule).split("(")[0] + "(0.1, ")
