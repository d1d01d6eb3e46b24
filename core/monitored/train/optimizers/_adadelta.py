"""``AdadeltaOptimizer``: step sizes from running averages of gradients and updates.

``accum = rho * accum + (1 - rho) * grad**2``,
``update = sqrt(accum_update + eps) / sqrt(accum + eps) * grad``,
``var -= lr * update``, ``accum_update = rho * accum_update + (1 - rho) * update**2``
(TF1's ``ApplyAdadelta``; the paper's rule is ``learning_rate=1.0``).
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

__all__ = ["AdadeltaOptimizer"]


def _adadelta(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, acc, acc_up), (t, u), (lr, one_minus_rho, eps) = inputs, outputs, temps, scalars
    xp.multiply(g, g, out=t)
    t -= acc
    t *= one_minus_rho
    acc += t
    xp.add(acc, eps, out=t)
    xp.sqrt(t, out=t)
    xp.add(acc_up, eps, out=u)
    xp.sqrt(u, out=u)
    u /= t
    u *= g
    xp.multiply(u, u, out=t)
    t -= acc_up
    t *= one_minus_rho
    acc_up += t
    u *= lr
    w -= u


ADADELTA = UpdateRule(
    "adadelta",
    inputs=("g",),
    outputs=("w", "accum", "accum_update"),
    scalars=("lr", "one_minus_rho", "eps"),
    n_temps=2,
    func=_adadelta,
    cuda=(
        "accum += (g * g - accum) * one_minus_rho;\n"
        "const T update = sqrt(accum_update + eps) / sqrt(accum + eps) * g;\n"
        "w -= update * lr;\n"
        "accum_update += (update * update - accum_update) * one_minus_rho;"
    ),
)


@final
class AdadeltaOptimizer(Optimizer):
    """TF1's ``tf.train.AdadeltaOptimizer``. Slots: ``"accum"``, ``"accum_update"`` (zeros).

    A row-sparse gradient updates only its rows and their accumulators.
    """

    __slots__ = ("_epsilon", "_rho")

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        rho: float = 0.95,
        epsilon: float = 1e-8,
        *,
        name: str = "Adadelta",
    ) -> None:
        super().__init__(learning_rate, name)
        self._rho = check_real(rho, "rho", low=0.0, high=1.0)
        # With epsilon 0 the update is 0 / sqrt(accum) from the start: no progress.
        self._epsilon = check_real(epsilon, "epsilon", low=0.0, low_open=True)

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("accum", 0.0), ("accum_update", 0.0))

    def _rule(self) -> UpdateRule:
        return ADADELTA

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        return (learning_rate, 1.0 - self._rho, self._epsilon)

    def _config(self) -> dict[str, object]:
        return {"rho": self._rho, "epsilon": self._epsilon}
