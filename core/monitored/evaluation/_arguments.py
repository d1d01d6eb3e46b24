"""Checks of ``Experiment``, ``TrainSpec`` and ``EvalSpec`` arguments, one message each.

Each raises :class:`ExperimentConfigError` naming where the value was given
(``Experiment(train_steps=0)``, ``EvalSpec(throttle_secs=-1)``) and what to give.
"""

from __future__ import annotations

from ._errors import ExperimentConfigError

__all__ = ["check_count", "check_seconds"]


def check_count(where: str, name: str, value: object, *, zero: bool = False) -> None:
    """``value`` is ``None`` or a positive int (with ``zero``, a non-negative one)."""
    if value is None:
        return
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if zero else "a positive"
        raise ExperimentConfigError(f"{where}({name}={value!r}): give {kind} int or None")


def check_seconds(where: str, name: str, value: object) -> None:
    """``value`` is a number of seconds, ``>= 0`` (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ExperimentConfigError(f"{where}({name}={value!r}): give a number of seconds >= 0")
