"""``MomentumOptimizer``: heavy-ball or Nesterov momentum, TF1's form.

``accum = momentum * accum + grad``, then ``var -= lr * accum`` or, with
``use_nesterov``, ``var -= lr * grad + lr * momentum * accum``. The learning rate
multiplies the accumulated gradient (TF1's convention, unlike Keras's), so
changing it mid-run rescales past gradients too.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import final

from ..._core._state import TrainState
from ._base import Optimizer
from ._elementwise import UpdateRule
from ._hyper import check_real
from ._types import Array, LearningRate

__all__ = ["MomentumOptimizer"]


def _momentum(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, a), (t,), (lr, mu) = inputs, outputs, temps, scalars
    a *= mu
    a += g
    xp.multiply(a, lr, out=t)
    w -= t


def _nesterov(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, a), (t,), (lr, mu) = inputs, outputs, temps, scalars
    a *= mu
    a += g
    xp.multiply(g, lr, out=t)
    w -= t
    xp.multiply(a, mu * lr, out=t)
    w -= t


MOMENTUM = UpdateRule(
    "momentum",
    inputs=("g",),
    outputs=("w", "accum"),
    scalars=("lr", "mu"),
    n_temps=1,
    func=_momentum,
    cuda="accum = accum * mu + g;\nw -= accum * lr;",
)

NESTEROV = UpdateRule(
    "nesterov",
    inputs=("g",),
    outputs=("w", "accum"),
    scalars=("lr", "mu"),
    n_temps=1,
    func=_nesterov,
    cuda="accum = accum * mu + g;\nw -= g * lr + accum * mu * lr;",
)


@final
class MomentumOptimizer(Optimizer):
    """TF1's ``tf.train.MomentumOptimizer``. Slot: ``"momentum"`` (zeros).

    A row-sparse gradient updates only its rows and their accumulators.
    """

    __slots__ = ("_momentum", "_use_nesterov")

    def __init__(
        self,
        learning_rate: LearningRate,
        momentum: float,
        *,
        use_nesterov: bool = False,
        name: str = "Momentum",
    ) -> None:
        super().__init__(learning_rate, name)
        self._momentum = check_real(momentum, "momentum", low=0.0)
        if not isinstance(use_nesterov, bool):
            raise TypeError(f"use_nesterov must be a bool, got {use_nesterov!r}")
        self._use_nesterov = use_nesterov

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("momentum", 0.0),)

    def _rule(self) -> UpdateRule:
        return NESTEROV if self._use_nesterov else MOMENTUM

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        return (learning_rate, self._momentum)

    def _config(self) -> dict[str, object]:
        return {"momentum": self._momentum, "use_nesterov": self._use_nesterov}
