"""Validation of hyperparameters, and evaluation of step-dependent ones.

A learning rate (and AdamW's weight decay) is a number or a function of the
global step; it is checked when the optimizer is built, and each value a function
returns is checked when it is used, so a bad schedule fails at the step it goes
wrong with the step and the schedule named.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import final

__all__ = ["StepValue", "check_name", "check_real"]


def check_real(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float within the given bounds, or a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number!r}")
    if low is not None and (number < low or (low_open and number == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {number!r}")
    if high is not None and (number > high or (high_open and number == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {number!r}")
    return number


def check_name(name: object) -> str:
    """An optimizer's or moving average's name: non-empty, without ``/``."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(
            f"name must be a non-empty string without '/', got {name!r} "
            "(it is a component of the names of the TrainState entries it creates)"
        )
    return name


@final
class StepValue:
    """A hyperparameter that is a non-negative number or a function of the global step."""

    __slots__ = ("_name", "_value")

    def __init__(self, value: float | Callable[[int], float], name: str) -> None:
        self._name = name
        if callable(value):
            self._value: float | Callable[[int], float] = value
        else:
            self._value = check_real(value, name, low=0.0)

    @property
    def value(self) -> float | Callable[[int], float]:
        """The number or function as given."""
        return self._value

    def at(self, step: int) -> float:
        """The value at global step ``step``: finite and non-negative, or a ``ValueError``."""
        if not callable(self._value):
            return self._value
        result = self._value(step)
        try:
            return check_real(result, self._name, low=0.0)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{self._name} {self._value!r} returned {result!r} at global step {step}; "
                "it must return a finite non-negative number"
            ) from error

    def __repr__(self) -> str:
        return repr(self._value)
