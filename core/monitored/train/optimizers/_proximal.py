"""Proximal (FOBOS) optimizers: a gradient step, then L1 shrinkage and L2 scaling.

``ProximalGradientDescentOptimizer``: ``p = var - lr * grad`` then
``var = sign(p) * max(|p| - lr * l1, 0) / (1 + lr * l2)``.
``ProximalAdagradOptimizer``: the same with Adagrad's per-element rate
``lr / sqrt(accum)`` after ``accum += grad**2`` (TF1's ``ApplyProximalAdagrad``).
L1 shrinkage sets small weights exactly to zero, hence sparse models.
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

__all__ = ["ProximalAdagradOptimizer", "ProximalGradientDescentOptimizer"]


def _proximal_gd(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w,), (t,), (lr, lr_l1, l2_scale) = inputs, outputs, temps, scalars
    xp.multiply(g, lr, out=t)
    w -= t
    if lr_l1 > 0:
        xp.abs(w, out=t)
        t -= lr_l1
        xp.maximum(t, 0, out=t)
        xp.copysign(t, w, out=w)
    if l2_scale != 1:
        w /= l2_scale


def _proximal_adagrad(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, acc), (rate, t, u), (lr, l1, l2) = inputs, outputs, temps, scalars
    xp.multiply(g, g, out=t)
    acc += t
    xp.sqrt(acc, out=rate)
    xp.divide(lr, rate, out=rate)
    xp.multiply(g, rate, out=t)
    w -= t
    if l1 > 0:
        xp.abs(w, out=t)
        xp.multiply(rate, l1, out=u)
        t -= u
        xp.maximum(t, 0, out=t)
        xp.copysign(t, w, out=w)
    if l2 > 0:
        rate *= l2
        rate += 1
        w /= rate


PROXIMAL_GD = UpdateRule(
    "proximal_gd",
    inputs=("g",),
    outputs=("w",),
    scalars=("lr", "lr_l1", "l2_scale"),
    n_temps=1,
    func=_proximal_gd,
    cuda=("const T p = w - g * lr;\nw = copysign(fmax(fabs(p) - lr_l1, (T)0), p) / l2_scale;"),
)

PROXIMAL_ADAGRAD = UpdateRule(
    "proximal_adagrad",
    inputs=("g",),
    outputs=("w", "accum"),
    scalars=("lr", "l1", "l2"),
    n_temps=3,
    func=_proximal_adagrad,
    cuda=(
        "accum += g * g;\n"
        "const T rate = lr / sqrt(accum);\n"
        "const T p = w - g * rate;\n"
        "w = copysign(fmax(fabs(p) - rate * l1, (T)0), p) / ((T)1 + rate * l2);"
    ),
)


@final
class ProximalGradientDescentOptimizer(Optimizer):
    """TF1's ``tf.train.ProximalGradientDescentOptimizer``. No slots.

    A row-sparse gradient updates (and shrinks) its rows only.
    """

    __slots__ = ("_l1", "_l2")

    def __init__(
        self,
        learning_rate: LearningRate,
        l1_regularization_strength: float = 0.0,
        l2_regularization_strength: float = 0.0,
        *,
        name: str = "ProximalGradientDescent",
    ) -> None:
        super().__init__(learning_rate, name)
        self._l1 = check_real(l1_regularization_strength, "l1_regularization_strength", low=0.0)
        self._l2 = check_real(l2_regularization_strength, "l2_regularization_strength", low=0.0)

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return ()

    def _rule(self) -> UpdateRule:
        return PROXIMAL_GD

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        return (learning_rate, learning_rate * self._l1, 1.0 + learning_rate * self._l2)

    def _config(self) -> dict[str, object]:
        return {
            "l1_regularization_strength": self._l1,
            "l2_regularization_strength": self._l2,
        }


@final
class ProximalAdagradOptimizer(Optimizer):
    """TF1's ``tf.train.ProximalAdagradOptimizer``. Slot: ``"accumulator"``.

    A row-sparse gradient updates only its rows and their accumulators.
    """

    __slots__ = ("_initial_accumulator_value", "_l1", "_l2")

    def __init__(
        self,
        learning_rate: LearningRate,
        initial_accumulator_value: float = 0.1,
        l1_regularization_strength: float = 0.0,
        l2_regularization_strength: float = 0.0,
        *,
        name: str = "ProximalAdagrad",
    ) -> None:
        super().__init__(learning_rate, name)
        self._initial_accumulator_value = check_real(
            initial_accumulator_value, "initial_accumulator_value", low=0.0, low_open=True
        )
        self._l1 = check_real(l1_regularization_strength, "l1_regularization_strength", low=0.0)
        self._l2 = check_real(l2_regularization_strength, "l2_regularization_strength", low=0.0)

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("accumulator", self._initial_accumulator_value),)

    def _rule(self) -> UpdateRule:
        return PROXIMAL_ADAGRAD

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        return (learning_rate, self._l1, self._l2)

    def _config(self) -> dict[str, object]:
        return {
            "initial_accumulator_value": self._initial_accumulator_value,
            "l1_regularization_strength": self._l1,
            "l2_regularization_strength": self._l2,
        }
