"""``GradientDescentOptimizer``: ``var -= learning_rate * grad``."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import final

from ._base import Optimizer
from ._elementwise import UpdateRule
from ._types import Array, LearningRate

__all__ = ["GradientDescentOptimizer"]


def _sgd(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w,), (t,), (lr,) = inputs, outputs, temps, scalars
    xp.multiply(g, lr, out=t)
    w -= t


SGD = UpdateRule(
    "sgd",
    inputs=("g",),
    outputs=("w",),
    scalars=("lr",),
    n_temps=1,
    func=_sgd,
    cuda="w -= g * lr;",
)


@final
class GradientDescentOptimizer(Optimizer):
    """Plain gradient descent, TF1's ``tf.train.GradientDescentOptimizer``.

    No slots. A row-sparse gradient updates its rows only (``scatter_sub``).
    """

    __slots__ = ()

    def __init__(self, learning_rate: LearningRate, *, name: str = "GradientDescent") -> None:
        super().__init__(learning_rate, name)

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return ()

    def _rule(self) -> UpdateRule:
        return SGD

    def _config(self) -> dict[str, object]:
        return {}
