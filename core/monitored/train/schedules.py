"""Learning-rate schedules: TF1's ``tf.train.*_decay`` as functions of the global step.

TF1's functions take the global step tensor and return a tensor; these return a
:class:`LearningRateSchedule`, a callable ``schedule(global_step) -> float`` that
optimizers accept wherever a learning rate goes (they call it with
``state.global_step`` once per ``apply_gradients``). Drop TF1's ``global_step``
argument and keep the others::

    # TF1: tf.train.exponential_decay(0.1, global_step, 100000, 0.96, staircase=True)
    lr = exponential_decay(0.1, 100000, 0.96, staircase=True)
    opt = GradientDescentOptimizer(lr)

Flags (``staircase``, ``cycle``, ...) are keyword-only, so a TF1 call that still
passes ``global_step`` positionally fails instead of shifting every argument.
Values are computed in float64.
"""

from __future__ import annotations

import abc
import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from numbers import Real
from typing import final

import numpy as np

__all__ = [
    "LearningRateSchedule",
    "cosine_decay",
    "cosine_decay_restarts",
    "exponential_decay",
    "inverse_time_decay",
    "linear_warmup",
    "natural_exp_decay",
    "piecewise_constant",
    "polynomial_decay",
]


class LearningRateSchedule(abc.ABC):
    """A learning rate as a function of the global step: ``schedule(step) -> float``."""

    __slots__ = ()

    def __call__(self, global_step: int) -> float:
        """The learning rate at ``global_step`` (a non-negative integer)."""
        if (
            isinstance(global_step, bool)
            or not isinstance(global_step, int | np.integer)
            or global_step < 0
        ):
            raise ValueError(
                f"{self!r}: the global step must be a non-negative integer, got {global_step!r}"
            )
        return self._value(int(global_step))

    @abc.abstractmethod
    def _value(self, step: int) -> float:
        """The learning rate at ``step``."""

    @abc.abstractmethod
    def __repr__(self) -> str:
        """The call that builds this schedule."""


# -- validation ---------------------------------------------------------------------


def _number(value: object, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{what}: {name} must be a number, got {type(value).__name__}; schedules take no "
            "global_step argument (they return a function of it)"
        )
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what}: {name} must be finite, got {number}")
    return number


def _at_least(value: object, name: str, what: str, low: float) -> float:
    number = _number(value, name, what)
    if number < low:
        raise ValueError(f"{what}: {name} must be >= {low}, got {number}")
    return number


def _positive(value: object, name: str, what: str) -> float:
    number = _number(value, name, what)
    if number <= 0:
        raise ValueError(f"{what}: {name} must be positive, got {number}")
    return number


def _flag(value: object, name: str, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be a bool, got {value!r}")
    return value


def _progress(step: int, decay_steps: float, staircase: bool) -> float:
    progress = step / decay_steps
    return math.floor(progress) if staircase else progress


# -- exponential family ---------------------------------------------------------------


class _RateDecay(LearningRateSchedule):
    """``learning_rate`` decayed by ``decay_rate`` over ``step / decay_steps``
    (floored with ``staircase``); subclasses give the decay law."""

    __slots__ = ("_decay_rate", "_decay_steps", "_learning_rate", "_staircase")
    _name = ""

    def __init__(
        self, learning_rate: float, decay_steps: float, decay_rate: float, staircase: bool
    ) -> None:
        self._learning_rate = learning_rate
        self._decay_steps = decay_steps
        self._decay_rate = decay_rate
        self._staircase = staircase

    def _value(self, step: int) -> float:
        return self._decayed(_progress(step, self._decay_steps, self._staircase))

    def _decayed(self, progress: float) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (
            f"{self._name}({self._learning_rate!r}, {self._decay_steps!r}, "
            f"{self._decay_rate!r}, staircase={self._staircase!r})"
        )


@final
class _ExponentialDecay(_RateDecay):
    __slots__ = ()
    _name = "exponential_decay"

    def _decayed(self, progress: float) -> float:
        return float(self._learning_rate * self._decay_rate**progress)


def exponential_decay(
    learning_rate: float, decay_steps: float, decay_rate: float, *, staircase: bool = False
) -> LearningRateSchedule:
    """``learning_rate * decay_rate ** (step / decay_steps)``.

    With ``staircase=True`` the exponent is ``floor(step / decay_steps)``: the
    rate drops by ``decay_rate`` every ``decay_steps`` steps.
    """
    what = "exponential_decay"
    return _ExponentialDecay(
        _at_least(learning_rate, "learning_rate", what, 0.0),
        _positive(decay_steps, "decay_steps", what),
        _positive(decay_rate, "decay_rate", what),
        _flag(staircase, "staircase", what),
    )


@final
class _NaturalExpDecay(_RateDecay):
    __slots__ = ()
    _name = "natural_exp_decay"

    def _decayed(self, progress: float) -> float:
        return self._learning_rate * math.exp(-self._decay_rate * progress)


def natural_exp_decay(
    learning_rate: float, decay_steps: float, decay_rate: float, *, staircase: bool = False
) -> LearningRateSchedule:
    """``learning_rate * exp(-decay_rate * step / decay_steps)`` (floored with ``staircase``)."""
    what = "natural_exp_decay"
    return _NaturalExpDecay(
        _at_least(learning_rate, "learning_rate", what, 0.0),
        _positive(decay_steps, "decay_steps", what),
        _at_least(decay_rate, "decay_rate", what, 0.0),
        _flag(staircase, "staircase", what),
    )


@final
class _InverseTimeDecay(_RateDecay):
    __slots__ = ()
    _name = "inverse_time_decay"

    def _decayed(self, progress: float) -> float:
        return self._learning_rate / (1.0 + self._decay_rate * progress)


def inverse_time_decay(
    learning_rate: float, decay_steps: float, decay_rate: float, *, staircase: bool = False
) -> LearningRateSchedule:
    """``learning_rate / (1 + decay_rate * step / decay_steps)`` (floored with ``staircase``)."""
    what = "inverse_time_decay"
    return _InverseTimeDecay(
        _at_least(learning_rate, "learning_rate", what, 0.0),
        _positive(decay_steps, "decay_steps", what),
        _at_least(decay_rate, "decay_rate", what, 0.0),
        _flag(staircase, "staircase", what),
    )


# -- piecewise and polynomial ------------------------------------------------------------


@final
class _PiecewiseConstant(LearningRateSchedule):
    __slots__ = ("_boundaries", "_values")

    def __init__(self, boundaries: tuple[float, ...], values: tuple[float, ...]) -> None:
        self._boundaries = boundaries
        self._values = values

    def _value(self, step: int) -> float:
        return self._values[bisect.bisect_left(self._boundaries, step)]

    def __repr__(self) -> str:
        return f"piecewise_constant({list(self._boundaries)!r}, {list(self._values)!r})"


def piecewise_constant(
    boundaries: Sequence[float], values: Sequence[float]
) -> LearningRateSchedule:
    """``values[0]`` while ``step <= boundaries[0]``, ``values[1]`` while
    ``step <= boundaries[1]``, ..., ``values[-1]`` after the last boundary.

    ``boundaries`` must increase strictly and ``values`` have one more entry.
    """
    what = "piecewise_constant"
    if isinstance(boundaries, str) or isinstance(values, str):
        raise TypeError(f"{what}: boundaries and values must be sequences of numbers")
    bounds = tuple(_number(b, "each boundary", what) for b in boundaries)
    rates = tuple(_at_least(v, "each value", what, 0.0) for v in values)
    if len(rates) != len(bounds) + 1:
        raise ValueError(
            f"{what}: values must have one more entry than boundaries, got {len(rates)} values "
            f"for {len(bounds)} boundaries"
        )
    if any(b >= c for b, c in itertools.pairwise(bounds)):
        raise ValueError(f"{what}: boundaries must increase strictly, got {list(bounds)}")
    return _PiecewiseConstant(bounds, rates)


@final
class _PolynomialDecay(LearningRateSchedule):
    __slots__ = ("_cycle", "_decay_steps", "_end", "_learning_rate", "_power")

    def __init__(
        self, learning_rate: float, decay_steps: float, end: float, power: float, cycle: bool
    ) -> None:
        self._learning_rate = learning_rate
        self._decay_steps = decay_steps
        self._end = end
        self._power = power
        self._cycle = cycle

    def _value(self, step: int) -> float:
        if self._cycle:
            multiplier = 1.0 if step == 0 else math.ceil(step / self._decay_steps)
            decay_steps = self._decay_steps * multiplier
            done = float(step)
        else:
            decay_steps = self._decay_steps
            done = min(float(step), decay_steps)
        fraction = 1.0 - done / decay_steps
        return float((self._learning_rate - self._end) * fraction**self._power + self._end)

    def __repr__(self) -> str:
        return (
            f"polynomial_decay({self._learning_rate!r}, {self._decay_steps!r}, "
            f"end_learning_rate={self._end!r}, power={self._power!r}, cycle={self._cycle!r})"
        )


def polynomial_decay(
    learning_rate: float,
    decay_steps: float,
    *,
    end_learning_rate: float = 0.0001,
    power: float = 1.0,
    cycle: bool = False,
) -> LearningRateSchedule:
    """From ``learning_rate`` to ``end_learning_rate`` over ``decay_steps`` steps.

    ``(learning_rate - end) * (1 - step / decay_steps) ** power + end``, then
    ``end_learning_rate``; with ``cycle=True`` the decay restarts, each time over
    the next multiple of ``decay_steps`` (TF1's rule).
    """
    what = "polynomial_decay"
    return _PolynomialDecay(
        _at_least(learning_rate, "learning_rate", what, 0.0),
        _positive(decay_steps, "decay_steps", what),
        _at_least(end_learning_rate, "end_learning_rate", what, 0.0),
        _at_least(power, "power", what, 0.0),
        _flag(cycle, "cycle", what),
    )


# -- cosine --------------------------------------------------------------------------


@final
class _CosineDecay(LearningRateSchedule):
    __slots__ = ("_alpha", "_decay_steps", "_learning_rate")

    def __init__(self, learning_rate: float, decay_steps: float, alpha: float) -> None:
        self._learning_rate = learning_rate
        self._decay_steps = decay_steps
        self._alpha = alpha

    def _value(self, step: int) -> float:
        done = min(float(step), self._decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * done / self._decay_steps))
        return self._learning_rate * ((1.0 - self._alpha) * cosine + self._alpha)

    def __repr__(self) -> str:
        return (
            f"cosine_decay({self._learning_rate!r}, {self._decay_steps!r}, alpha={self._alpha!r})"
        )


def cosine_decay(
    learning_rate: float, decay_steps: float, *, alpha: float = 0.0
) -> LearningRateSchedule:
    """Half a cosine from ``learning_rate`` down to ``alpha * learning_rate`` (SGDR, no restarts).

    ``learning_rate * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) /
    decay_steps)) + alpha)``.
    """
    what = "cosine_decay"
    alpha = _at_least(alpha, "alpha", what, 0.0)
    if alpha > 1.0:
        raise ValueError(f"{what}: alpha must be at most 1, got {alpha}")
    return _CosineDecay(
        _at_least(learning_rate, "learning_rate", what, 0.0),
        _positive(decay_steps, "decay_steps", what),
        alpha,
    )


@final
class _CosineDecayRestarts(LearningRateSchedule):
    __slots__ = ("_alpha", "_first_decay_steps", "_learning_rate", "_m_mul", "_t_mul")

    def __init__(
        self,
        learning_rate: float,
        first_decay_steps: float,
        t_mul: float,
        m_mul: float,
        alpha: float,
    ) -> None:
        self._learning_rate = learning_rate
        self._first_decay_steps = first_decay_steps
        self._t_mul = t_mul
        self._m_mul = m_mul
        self._alpha = alpha

    def _period_start(self, restart: int) -> float:
        """Where period ``restart`` starts, in units of the first period."""
        if self._t_mul == 1.0:
            return float(restart)
        return (1.0 - self._t_mul**restart) / (1.0 - self._t_mul)

    def _value(self, step: int) -> float:
        fraction = step / self._first_decay_steps
        if self._t_mul == 1.0:
            restart = math.floor(fraction)
        else:
            # TF1's closed form, then nudged so that rounding in the logarithm
            # cannot put a step exactly on a restart into the previous period.
            restart = math.floor(
                math.log(1.0 - fraction * (1.0 - self._t_mul)) / math.log(self._t_mul)
            )
            while self._period_start(restart + 1) <= fraction:
                restart += 1
            while restart > 0 and self._period_start(restart) > fraction:
                restart -= 1
        within = (fraction - self._period_start(restart)) / self._t_mul**restart
        cosine = 0.5 * self._m_mul**restart * (1.0 + math.cos(math.pi * within))
        return self._learning_rate * ((1.0 - self._alpha) * cosine + self._alpha)

    def __repr__(self) -> str:
        return (
            f"cosine_decay_restarts({self._learning_rate!r}, {self._first_decay_steps!r}, "
            f"t_mul={self._t_mul!r}, m_mul={self._m_mul!r}, alpha={self._alpha!r})"
        )


def cosine_decay_restarts(
    learning_rate: float,
    first_decay_steps: float,
    *,
    t_mul: float = 2.0,
    m_mul: float = 1.0,
    alpha: float = 0.0,
) -> LearningRateSchedule:
    """Cosine decay with warm restarts (SGDR, Loshchilov & Hutter 2017).

    The first period lasts ``first_decay_steps`` steps, each next one ``t_mul``
    times longer, and each restart begins ``m_mul`` times lower. ``t_mul`` must
    be at least 1 (with shrinking periods the restarts would pile up at a finite
    step, after which TF1 yields NaN).
    """
    what = "cosine_decay_restarts"
    alpha = _at_least(alpha, "alpha", what, 0.0)
    if alpha > 1.0:
        raise ValueError(f"{what}: alpha must be at most 1, got {alpha}")
    return _CosineDecayRestarts(
        _at_least(learning_rate, "learning_rate", what, 0.0),
        _positive(first_decay_steps, "first_decay_steps", what),
        _at_least(t_mul, "t_mul", what, 1.0),
        _at_least(m_mul, "m_mul", what, 0.0),
        alpha,
    )


# -- warm-up -------------------------------------------------------------------------


@final
class _LinearWarmup(LearningRateSchedule):
    __slots__ = ("_learning_rate", "_start", "_warmup_steps")

    def __init__(
        self,
        learning_rate: float | Callable[[int], float],
        warmup_steps: int,
        start: float,
    ) -> None:
        self._learning_rate = learning_rate
        self._warmup_steps = warmup_steps
        self._start = start

    def _after(self, step: int) -> float:
        if not callable(self._learning_rate):
            return self._learning_rate
        value = self._learning_rate(step)
        try:
            return _at_least(value, "the wrapped learning rate", repr(self), 0.0)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{self!r}: {self._learning_rate!r} returned {value!r} at step {step}; it must "
                "return a finite non-negative number"
            ) from error

    def _value(self, step: int) -> float:
        if step >= self._warmup_steps:
            return self._after(step)
        end = self._after(self._warmup_steps)
        return self._start + (end - self._start) * step / self._warmup_steps

    def __repr__(self) -> str:
        return (
            f"linear_warmup({self._learning_rate!r}, {self._warmup_steps!r}, "
            f"start_learning_rate={self._start!r})"
        )


def linear_warmup(
    learning_rate: float | Callable[[int], float],
    warmup_steps: int,
    *,
    start_learning_rate: float = 0.0,
) -> LearningRateSchedule:
    """Ramp linearly from ``start_learning_rate`` to ``learning_rate`` over ``warmup_steps``.

    ``learning_rate`` is a number or another schedule; from step ``warmup_steps``
    on it is used as is (a wrapped schedule sees the true global step, so its
    decay counts from step 0), and the ramp ends at its value at
    ``warmup_steps``, so the rate is continuous.
    """
    what = "linear_warmup"
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps <= 0:
        raise ValueError(f"{what}: warmup_steps must be a positive integer, got {warmup_steps!r}")
    rate: float | Callable[[int], float] = (
        learning_rate
        if callable(learning_rate)
        else _at_least(learning_rate, "learning_rate", what, 0.0)
    )
    return _LinearWarmup(
        rate, warmup_steps, _at_least(start_learning_rate, "start_learning_rate", what, 0.0)
    )
