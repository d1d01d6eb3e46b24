"""Adam (Kingma & Ba, 2015) as TF1 computes it, plus lazy and decoupled-decay variants.

Per step, with ``t`` counted by the optimizer (entries ``"<name>/beta1_power"`` and
``"<name>/beta2_power"`` hold ``beta1**t`` and ``beta2**t``, as TF1's
``beta1_power``/``beta2_power``)::

    lr_t = learning_rate * sqrt(1 - beta2**t) / (1 - beta1**t)
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    var -= lr_t * m / (sqrt(v) + epsilon)

Row-sparse gradients follow TF1: ``AdamOptimizer`` is *dense-equivalent* (it
decays all of ``m`` and ``v`` and moves every row whose moments are non-zero,
exactly as the dense update with zero rows would); ``lazy=True``
(``LazyAdamOptimizer``, TF1's contrib ``LazyAdamOptimizer``) updates only the
given rows and their moments, which is faster for large embeddings but a
different algorithm. ``AdamWOptimizer`` (TF1's contrib ``AdamWOptimizer``)
subtracts ``weight_decay * var`` before the Adam step (from the given rows only,
for a row-sparse gradient).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from types import ModuleType
from typing import final

from ..._core._state import TrainState
from ._base import Optimizer
from ._elementwise import UpdateRule, run_dense, run_rows
from ._hyper import StepValue, check_real
from ._types import Array, LearningRate

__all__ = ["AdamOptimizer", "AdamWOptimizer", "LazyAdamOptimizer"]


def _moments(
    xp: ModuleType, g: Array, m: Array, v: Array, t: Array, omb1: float, omb2: float
) -> None:
    xp.subtract(g, m, out=t)
    t *= omb1
    m += t
    xp.multiply(g, g, out=t)
    t -= v
    t *= omb2
    v += t


def _step(xp: ModuleType, w: Array, m: Array, v: Array, t: Array, lr_t: float, eps: float) -> None:
    xp.sqrt(v, out=t)
    t += eps
    xp.divide(m, t, out=t)
    t *= lr_t
    w -= t


def _adam(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, m, v), (t,), (lr_t, omb1, omb2, eps) = inputs, outputs, temps, scalars
    _moments(xp, g, m, v, t, omb1, omb2)
    _step(xp, w, m, v, t, lr_t, eps)


def _adamw(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (w, m, v), (t,), (lr_t, omb1, omb2, eps, wd) = inputs, outputs, temps, scalars
    # The moments first: the gradient may be the variable itself (an L2 loss's),
    # and must be read before the decay changes it.
    _moments(xp, g, m, v, t, omb1, omb2)
    xp.multiply(w, wd, out=t)
    w -= t
    _step(xp, w, m, v, t, lr_t, eps)


def _decay_moments(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (m, v), (b1, b2) = outputs, scalars
    m *= b1
    v *= b2


def _add_moments(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (g,), (m, v), (t,), (omb1, omb2) = inputs, outputs, temps, scalars
    xp.multiply(g, omb1, out=t)
    m += t
    xp.multiply(g, g, out=t)
    t *= omb2
    v += t


def _adam_step(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (m, v), (w,), (t,), (lr_t, eps) = inputs, outputs, temps, scalars
    _step(xp, w, m, v, t, lr_t, eps)


def _weight_decay(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (w,), (t,), (wd,) = outputs, temps, scalars
    xp.multiply(w, wd, out=t)
    w -= t


_ADAM_CUDA = "m += (g - m) * omb1;\nv += (g * g - v) * omb2;\nw -= m * lr_t / (sqrt(v) + eps);"

ADAM = UpdateRule(
    "adam",
    inputs=("g",),
    outputs=("w", "m", "v"),
    scalars=("lr_t", "omb1", "omb2", "eps"),
    n_temps=1,
    func=_adam,
    cuda=_ADAM_CUDA,
)

ADAMW = UpdateRule(
    "adamw",
    inputs=("g",),
    outputs=("w", "m", "v"),
    scalars=("lr_t", "omb1", "omb2", "eps", "wd"),
    n_temps=1,
    func=_adamw,
    cuda="w -= w * wd;\n" + _ADAM_CUDA,
)

DECAY_MOMENTS = UpdateRule(
    "adam_decay_moments",
    inputs=(),
    outputs=("m", "v"),
    scalars=("b1", "b2"),
    n_temps=0,
    func=_decay_moments,
    cuda="m *= b1;\nv *= b2;",
)

ADD_MOMENTS = UpdateRule(
    "adam_add_moments",
    inputs=("g",),
    outputs=("m", "v"),
    scalars=("omb1", "omb2"),
    n_temps=1,
    func=_add_moments,
    cuda="m += g * omb1;\nv += g * g * omb2;",
)

ADAM_STEP = UpdateRule(
    "adam_step",
    inputs=("m", "v"),
    outputs=("w",),
    scalars=("lr_t", "eps"),
    n_temps=1,
    func=_adam_step,
    cuda="w -= m * lr_t / (sqrt(v) + eps);",
)

WEIGHT_DECAY = UpdateRule(
    "weight_decay",
    inputs=(),
    outputs=("w",),
    scalars=("wd",),
    n_temps=1,
    func=_weight_decay,
    cuda="w -= w * wd;",
)


class _AdamBase(Optimizer):
    """Adam's slots, beta powers and dense/sparse updates; see the module docstring."""

    __slots__ = ("_beta1", "_beta2", "_decay_vars", "_epsilon", "_lazy", "_weight_decay")

    def __init__(
        self,
        learning_rate: LearningRate,
        beta1: float,
        beta2: float,
        epsilon: float,
        lazy: bool,
        name: str,
        weight_decay: LearningRate | None = None,
        decay_var_list: Collection[str] | None = None,
    ) -> None:
        super().__init__(learning_rate, name)
        self._beta1 = check_real(beta1, "beta1", low=0.0, high=1.0, high_open=True)
        self._beta2 = check_real(beta2, "beta2", low=0.0, high=1.0, high_open=True)
        self._epsilon = check_real(epsilon, "epsilon", low=0.0)
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy must be a bool, got {lazy!r}")
        self._lazy = lazy
        self._weight_decay = (
            None if weight_decay is None else StepValue(weight_decay, "weight_decay")
        )
        if isinstance(decay_var_list, str):
            raise TypeError("decay_var_list must be a collection of names, not a string")
        self._decay_vars = None if decay_var_list is None else frozenset(decay_var_list)

    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("m", 0.0), ("v", 0.0))

    def _non_slot_initializers(self) -> tuple[tuple[str, float], ...]:
        return (("beta1_power", self._beta1), ("beta2_power", self._beta2))

    def _rule(self) -> UpdateRule:
        return ADAM

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        beta1_power = float(state[f"{self._name}/beta1_power"])
        beta2_power = float(state[f"{self._name}/beta2_power"])
        lr_t = learning_rate * math.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)
        wd = 0.0 if self._weight_decay is None else self._weight_decay.at(state.global_step)
        return (lr_t, 1.0 - self._beta1, 1.0 - self._beta2, self._epsilon, wd)

    def _decays(self, name: str, wd: float) -> bool:
        return wd > 0 and (self._decay_vars is None or name in self._decay_vars)

    def _apply_dense(
        self,
        name: str,
        var: Array,
        grad: Array,
        slots: tuple[Array, ...],
        hyper: tuple[float, ...],
    ) -> None:
        if self._decays(name, hyper[4]):
            run_dense(ADAMW, (grad,), (var, *slots), hyper)
        else:
            run_dense(ADAM, (grad,), (var, *slots), hyper[:4])

    def _apply_sparse(
        self,
        name: str,
        var: Array,
        rows: Array,
        values: Array,
        slots: tuple[Array, ...],
        hyper: tuple[float, ...],
    ) -> None:
        lr_t, omb1, omb2, eps, wd = hyper
        decays = self._decays(name, wd)
        if self._lazy:
            if decays:
                run_rows(ADAMW, rows, (values,), (var, *slots), hyper)
            else:
                run_rows(ADAM, rows, (values,), (var, *slots), hyper[:4])
            return
        m, v = slots
        if decays:
            run_rows(WEIGHT_DECAY, rows, (), (var,), (wd,))
        run_dense(DECAY_MOMENTS, (), (m, v), (self._beta1, self._beta2))
        run_rows(ADD_MOMENTS, rows, (values,), (m, v), (omb1, omb2))
        run_dense(ADAM_STEP, (m, v), (var,), (lr_t, eps))

    def _finish(self, state: TrainState) -> None:
        beta1_power = state[f"{self._name}/beta1_power"]
        beta1_power *= self._beta1  # in place: the entry keeps its identity
        beta2_power = state[f"{self._name}/beta2_power"]
        beta2_power *= self._beta2

    def _config(self) -> dict[str, object]:
        return {"beta1": self._beta1, "beta2": self._beta2, "epsilon": self._epsilon}


@final
class AdamOptimizer(_AdamBase):
    """TF1's ``tf.train.AdamOptimizer``. Slots ``"m"``, ``"v"``; entries
    ``"<name>/beta1_power"``, ``"<name>/beta2_power"``.

    ``lazy=True`` makes row-sparse updates lazy (see :class:`LazyAdamOptimizer`).
    """

    __slots__ = ()

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        *,
        name: str = "Adam",
        lazy: bool = False,
    ) -> None:
        super().__init__(learning_rate, beta1, beta2, epsilon, lazy, name)

    def _config(self) -> dict[str, object]:
        return {**super()._config(), "lazy": self._lazy}


@final
class LazyAdamOptimizer(_AdamBase):
    """Adam whose row-sparse updates touch only the given rows (TF1 contrib's).

    Dense gradients get plain Adam. The same as ``AdamOptimizer(lazy=True)``.
    """

    __slots__ = ()

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        *,
        name: str = "LazyAdam",
    ) -> None:
        super().__init__(learning_rate, beta1, beta2, epsilon, True, name)


@final
class AdamWOptimizer(_AdamBase):
    """Adam with decoupled weight decay (Loshchilov & Hutter), TF1 contrib's ``AdamWOptimizer``.

    Each step first subtracts ``weight_decay * var``, then takes the Adam step.
    As in TF1 the decay is not multiplied by the learning rate: when you
    schedule the learning rate, schedule ``weight_decay`` alike (it may be a
    function of the global step too). ``decay_var_list`` limits the decay to
    those variables (TF1 takes it per ``minimize`` call); ``lazy`` as for Adam.
    """

    __slots__ = ()

    def __init__(
        self,
        weight_decay: LearningRate,
        learning_rate: LearningRate = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        *,
        name: str = "AdamW",
        decay_var_list: Collection[str] | None = None,
        lazy: bool = False,
    ) -> None:
        super().__init__(
            learning_rate, beta1, beta2, epsilon, lazy, name, weight_decay, decay_var_list
        )

    def _config(self) -> dict[str, object]:
        return {
            "weight_decay": self._weight_decay,
            "learning_rate": self._learning_rate,
            **super()._config(),
            "decay_var_list": None if self._decay_vars is None else sorted(self._decay_vars),
            "lazy": self._lazy,
        }
