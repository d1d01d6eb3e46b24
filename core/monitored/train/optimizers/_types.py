"""Type aliases shared by the training toolkit.

Arrays are NumPy or CuPy ``ndarray`` objects; CuPy has no type stubs and must not
be imported on CPU-only machines, so both are spelled :data:`Array` (``Any``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

__all__ = ["Array", "LearningRate"]

#: A NumPy or CuPy ``ndarray``.
Array: TypeAlias = Any

#: A learning rate: a constant, or a function of the global step such as the
#: schedules in :mod:`monitored.train.schedules` return.
LearningRate: TypeAlias = float | Callable[[int], float]
