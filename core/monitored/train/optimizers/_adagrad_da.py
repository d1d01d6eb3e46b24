"""``AdagradDAOptimizer``: Adagrad dual averaging, for sparse linear models.

With ``T = global_step + 1``, ``g_acc += grad``, ``gg_acc += grad**2`` and then
``var = -lr * sign(g_acc) * max(|g_acc| - l1 * T, 0) / (l2 * T * lr + sqrt(gg_acc))``
(TF1's ``ApplyAdagradDA``). The variable is recomputed from the accumulators
alone, so its initial value only matters until the first update.
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

__all__ = ["AdagradDAOptimizer"]


def _adagrad_da(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, gacc, gsq), (t, u), (lr, l1t, l2tlr) = inputs, outputs, temps, scalars
    gacc += g
    xp.multiply(g, g, out=t)
    gsq += t
    if l1t > 0:
        xp.abs(gacc, out=t)
        t -= l1t
        xp.maximum(t, 0, out=t)
        xp.copysign(t, gacc, out=t)
    else:
        xp.copyto(t, gacc)
    t *= -lr
    xp.sqrt(gsq, out=u)
    u += l2tlr
    xp.divide(t, u, out=w)


ADAGRAD_DA = UpdateRule(
    "adagrad_da",
    inputs=("g",),
    outputs=("w", "gacc", "gsq"),
    scalars=("lr", "l1t", "l2tlr"),
    n_temps=2,
    func=_adagrad_da,
    cuda=(
        "gacc += g;\n"
        "gsq += g * g;\n"
        "w = -lr * copysign(fmax(fabs(gacc) - l1t, (T)0), gacc) / (l2tlr + sqrt(gsq));"
    ),
)


@final
class AdagradDAOptimizer(Optimizer):
    """TF1's ``tf.train.AdagradDAOptimizer``; ``T`` is ``state.global_step + 1``.

    Slots: ``"gradient_accumulator"`` (zeros) and ``"gradient_squared_accumulator"``
    (``initial_gradient_squared_accumulator_value``). TF1 takes the global step
    tensor as an argument; here it is the state's. A row-sparse gradient updates
    its rows only.
    """

    __slots__ = ("_initial", "_l1", "_l2")

    def __init__(
        self,
        learning_rate: LearningRate,
        initial_gradient_squared_accumulator_value: float = 0.1,
        l1_regularization_strength: float = 0.0,
        l2_regularization_strength: float = 0.0,
        *,
        name: str = "AdagradDA",
    ) -> None:
        super().__init__(learning_rate, name)
        self._initial = check_real(
            initial_gradient_squared_accumulator_value,
            "initial_gradient_squared_accumulator_value",
            low=0.0,
            low_open=True,
        )
        self._l1 = check_real(l1_regularization_strength, "l1_regularization_strength", low=0.0)
        self._l2 = check_real(l2_regularization_strength, "l2_regularization_strength", low=0.0)

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("gradient_accumulator", 0.0), ("gradient_squared_accumulator", self._initial))

    def _rule(self) -> UpdateRule:
        return ADAGRAD_DA

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        steps = float(state.global_step + 1)
        return (learning_rate, self._l1 * steps, self._l2 * steps * learning_rate)

    def _config(self) -> dict[str, object]:
        return {
            "initial_gradient_squared_accumulator_value": self._initial,
            "l1_regularization_strength": self._l1,
            "l2_regularization_strength": self._l2,
        }
