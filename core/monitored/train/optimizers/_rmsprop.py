"""``RMSPropOptimizer``: gradients scaled by a running RMS, with momentum.

``ms = decay * ms + (1 - decay) * grad**2``,
``mom = momentum * mom + lr * grad / sqrt(ms + eps)``, ``var -= mom``; centered,
also ``mg = decay * mg + (1 - decay) * grad`` and ``sqrt(ms - mg**2 + eps)``
(TF1's ``ApplyRMSProp`` / ``ApplyCenteredRMSProp``). As in TF1 the mean square
starts at one, not zero.
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

__all__ = ["RMSPropOptimizer"]


def _rmsprop(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, ms, mom), (t,), (lr, one_minus_decay, mu, eps) = inputs, outputs, temps, scalars
    xp.multiply(g, g, out=t)
    t -= ms
    t *= one_minus_decay
    ms += t
    xp.add(ms, eps, out=t)
    xp.sqrt(t, out=t)
    xp.divide(g, t, out=t)
    t *= lr
    mom *= mu
    mom += t
    w -= mom


def _centered_rmsprop(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, ms, mom, mg), (t,), (lr, one_minus_decay, mu, eps) = inputs, outputs, temps, scalars
    xp.multiply(g, g, out=t)
    t -= ms
    t *= one_minus_decay
    ms += t
    xp.subtract(g, mg, out=t)
    t *= one_minus_decay
    mg += t
    xp.multiply(mg, mg, out=t)
    xp.subtract(ms, t, out=t)
    t += eps
    xp.sqrt(t, out=t)
    xp.divide(g, t, out=t)
    t *= lr
    mom *= mu
    mom += t
    w -= mom


RMSPROP = UpdateRule(
    "rmsprop",
    inputs=("g",),
    outputs=("w", "ms", "mom"),
    scalars=("lr", "one_minus_decay", "mu", "eps"),
    n_temps=1,
    func=_rmsprop,
    cuda=(
        "ms += (g * g - ms) * one_minus_decay;\n"
        "mom = mom * mu + g * lr / sqrt(ms + eps);\n"
        "w -= mom;"
    ),
)

CENTERED_RMSPROP = UpdateRule(
    "centered_rmsprop",
    inputs=("g",),
    outputs=("w", "ms", "mom", "mg"),
    scalars=("lr", "one_minus_decay", "mu", "eps"),
    n_temps=1,
    func=_centered_rmsprop,
    cuda=(
        "ms += (g * g - ms) * one_minus_decay;\n"
        "mg += (g - mg) * one_minus_decay;\n"
        "mom = mom * mu + g * lr / sqrt(ms - mg * mg + eps);\n"
        "w -= mom;"
    ),
)


@final
class RMSPropOptimizer(Optimizer):
    """TF1's ``tf.train.RMSPropOptimizer``.

    Slots: ``"rms"`` (ones), ``"momentum"`` (zeros) and, when ``centered``,
    ``"mg"`` (zeros). A row-sparse gradient updates only its rows and their
    slots (TF1's documented difference from the dense update).
    """

    __slots__ = ("_centered", "_decay", "_epsilon", "_momentum")

    def __init__(
        self,
        learning_rate: LearningRate,
        decay: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-10,
        *,
        centered: bool = False,
        name: str = "RMSProp",
    ) -> None:
        super().__init__(learning_rate, name)
        self._decay = check_real(decay, "decay", low=0.0, high=1.0)
        self._momentum = check_real(momentum, "momentum", low=0.0)
        self._epsilon = check_real(epsilon, "epsilon", low=0.0)
        if not isinstance(centered, bool):
            raise TypeError(f"centered must be a bool, got {centered!r}")
        self._centered = centered

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        slots = (("rms", 1.0), ("momentum", 0.0))
        return (*slots, ("mg", 0.0)) if self._centered else slots

    def _rule(self) -> UpdateRule:
        return CENTERED_RMSPROP if self._centered else RMSPROP

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        return (learning_rate, 1.0 - self._decay, self._momentum, self._epsilon)

    def _config(self) -> dict[str, object]:
        return {
            "decay": self._decay,
            "momentum": self._momentum,
            "epsilon": self._epsilon,
            "centered": self._centered,
        }
