"""``FtrlOptimizer``: FTRL-Proximal (McMahan et al., 2013), TF1's ``ApplyFtrlV2``.

With ``p = -learning_rate_power`` (0.5 by default, computed with ``sqrt``)::

    new_accum = accum + grad**2
    linear += grad + 2 * l2_shrinkage * var - (new_accum**p - accum**p) / lr * var
    quadratic = new_accum**p / lr + 2 * l2
    var = (sign(linear) * l1 - linear) / quadratic  if |linear| > l1  else 0
    accum = new_accum
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import final

import numpy as np

from ..._core._state import TrainState
from ._base import Optimizer
from ._elementwise import UpdateRule
from ._hyper import check_real
from ._types import Array, LearningRate

__all__ = ["FtrlOptimizer"]


def _ftrl(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
    use_sqrt: bool,
) -> None:
    (g,), (w, acc, lin), (t, u), (lr, l1, l2x2, shrink_x2, p) = inputs, outputs, temps, scalars
    if use_sqrt:
        xp.sqrt(acc, out=t)
    else:
        xp.power(acc, p, out=t)
    xp.multiply(g, g, out=u)
    acc += u
    if use_sqrt:
        xp.sqrt(acc, out=u)
    else:
        xp.power(acc, p, out=u)
    xp.subtract(u, t, out=t)
    t /= lr
    if shrink_x2:
        t -= shrink_x2
    t *= w
    lin += g
    lin -= t
    u /= lr
    u += l2x2
    # (clip(linear, -l1, l1) - linear) is sign(linear) * l1 - linear where
    # |linear| > l1 and exactly 0 elsewhere: TF1's select without a mask.
    xp.maximum(lin, -l1, out=t)
    xp.minimum(t, l1, out=t)
    t -= lin
    if l2x2 > 0:
        xp.divide(t, u, out=w)
        return
    # Without L2 the quadratic term is 0 where the accumulator is still 0 (an
    # initial_accumulator_value of 0 and only zero gradients so far). TF1's
    # select gives 0 where |linear| <= l1 (not 0 / 0) and +-inf elsewhere (only
    # with L2 shrinkage can linear move then), as the CUDA kernel does.
    with np.errstate(divide="ignore", invalid="ignore"):
        xp.divide(t, u, out=w)
    xp.copyto(w, 0, where=(u == 0) & (t == 0))


def _ftrl_sqrt(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    _ftrl(xp, inputs, outputs, temps, scalars, use_sqrt=True)


def _ftrl_pow(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    _ftrl(xp, inputs, outputs, temps, scalars, use_sqrt=False)


_FTRL_TAIL = (
    "lin += g + shrink_x2 * w - (s_new - s_old) / lr * w;\n"
    "const T quadratic = s_new / lr + l2x2;\n"
    "w = fabs(lin) > l1 ? (copysign(l1, lin) - lin) / quadratic : (T)0;\n"
    "accum = new_accum;"
)

FTRL_SQRT = UpdateRule(
    "ftrl_sqrt",
    inputs=("g",),
    outputs=("w", "accum", "lin"),
    scalars=("lr", "l1", "l2x2", "shrink_x2", "p"),
    n_temps=2,
    func=_ftrl_sqrt,
    cuda=(
        "const T new_accum = accum + g * g;\n"
        "const T s_old = sqrt(accum);\n"
        "const T s_new = sqrt(new_accum);\n" + _FTRL_TAIL
    ),
)

FTRL_POW = UpdateRule(
    "ftrl_pow",
    inputs=("g",),
    outputs=("w", "accum", "lin"),
    scalars=("lr", "l1", "l2x2", "shrink_x2", "p"),
    n_temps=2,
    func=_ftrl_pow,
    cuda=(
        "const T new_accum = accum + g * g;\n"
        "const T s_old = pow(accum, p);\n"
        "const T s_new = pow(new_accum, p);\n" + _FTRL_TAIL
    ),
)


@final
class FtrlOptimizer(Optimizer):
    """TF1's ``tf.train.FtrlOptimizer``. Slots: ``"accum"`` and ``"linear"`` (zeros).

    ``learning_rate`` must be positive. ``l2_shrinkage_regularization_strength``
    (TF1's later addition) adds an L2 penalty to the loss itself, where
    ``l2_regularization_strength`` only stabilizes the update. A row-sparse
    gradient updates only its rows and their slots.
    """

    __slots__ = ("_initial", "_l1", "_l2", "_lr_power", "_shrinkage")

    def __init__(
        self,
        learning_rate: LearningRate,
        learning_rate_power: float = -0.5,
        initial_accumulator_value: float = 0.1,
        l1_regularization_strength: float = 0.0,
        l2_regularization_strength: float = 0.0,
        *,
        name: str = "Ftrl",
        l2_shrinkage_regularization_strength: float = 0.0,
    ) -> None:
        super().__init__(learning_rate, name)
        self._lr_power = check_real(learning_rate_power, "learning_rate_power", high=0.0)
        self._initial = check_real(initial_accumulator_value, "initial_accumulator_value", low=0.0)
        self._l1 = check_real(l1_regularization_strength, "l1_regularization_strength", low=0.0)
        self._l2 = check_real(l2_regularization_strength, "l2_regularization_strength", low=0.0)
        self._shrinkage = check_real(
            l2_shrinkage_regularization_strength, "l2_shrinkage_regularization_strength", low=0.0
        )
        if not callable(learning_rate) and self._learning_rate.at(0) == 0:
            raise ValueError("FtrlOptimizer: learning_rate must be positive, got 0.0")

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("accum", self._initial), ("linear", 0.0))

    def _rule(self) -> UpdateRule:
        return FTRL_SQRT if self._lr_power == -0.5 else FTRL_POW

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        if learning_rate == 0:
            raise ValueError(
                f"FtrlOptimizer: the learning rate is 0 at global step {state.global_step}; "
                "FTRL divides by it, so it must stay positive"
            )
        return (learning_rate, self._l1, 2.0 * self._l2, 2.0 * self._shrinkage, -self._lr_power)

    def _config(self) -> dict[str, object]:
        return {
            "learning_rate_power": self._lr_power,
            "initial_accumulator_value": self._initial,
            "l1_regularization_strength": self._l1,
            "l2_regularization_strength": self._l2,
            "l2_shrinkage_regularization_strength": self._shrinkage,
        }
