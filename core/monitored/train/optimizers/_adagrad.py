"""``AdagradOptimizer``: per-element learning rates from the summed squared gradients.

``accum += grad**2; var -= lr * grad / sqrt(accum)`` (TF1's ``ApplyAdagrad``: no
epsilon; the accumulator starts at ``initial_accumulator_value > 0`` instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import final

from ._base import Optimizer
from ._elementwise import UpdateRule
from ._hyper import check_real
from ._types import Array, LearningRate

__all__ = ["AdagradOptimizer"]


def _adagrad(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, acc), (t,), (lr,) = inputs, outputs, temps, scalars
    xp.multiply(g, g, out=t)
    acc += t
    xp.sqrt(acc, out=t)
    xp.divide(g, t, out=t)
    t *= lr
    w -= t


ADAGRAD = UpdateRule(
    "adagrad",
    inputs=("g",),
    outputs=("w", "accum"),
    scalars=("lr",),
    n_temps=1,
    func=_adagrad,
    cuda="accum += g * g;\nw -= g * lr / sqrt(accum);",
)


@final
class AdagradOptimizer(Optimizer):
    """TF1's ``tf.train.AdagradOptimizer``. Slot: ``"accumulator"``.

    A row-sparse gradient updates only its rows and their accumulators.
    """

    __slots__ = ("_initial_accumulator_value",)

    def __init__(
        self,
        learning_rate: LearningRate,
        initial_accumulator_value: float = 0.1,
        *,
        name: str = "Adagrad",
    ) -> None:
        super().__init__(learning_rate, name)
        self._initial_accumulator_value = check_real(
            initial_accumulator_value, "initial_accumulator_value", low=0.0, low_open=True
        )

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("accumulator", self._initial_accumulator_value),)

    def _rule(self) -> UpdateRule:
        return ADAGRAD

    def _config(self) -> dict[str, object]:
        return {"initial_accumulator_value": self._initial_accumulator_value}
