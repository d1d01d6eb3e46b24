"""``get_variable``: TF's ``tf.get_variable`` inside a ``model_fn``, over a ``TrainState``.

The estimator calls ``model_fn`` with the state it trains, evaluates or
predicts from set as the *current* state; ``get_variable(name, shape, ...)``
returns that state's entry, creating it on the first call of a run (the
estimator's build call, before the session: TF built its graph then). After
that the set of entries is fixed, as TF finalized its graph.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .._core._state import TrainState
from ._errors import EstimatorError

__all__ = [
    "current_state",
    "get_global_step",
    "get_variable",
    "glorot_uniform_initializer",
    "zeros_initializer",
]

#: ``initializer(shape, dtype, rng) -> array``.
Initializer = Callable[[tuple[int, ...], np.dtype[Any], np.random.Generator], Any]

_CURRENT: contextvars.ContextVar[TrainState | None] = contextvars.ContextVar(
    "monitored_estimator_state", default=None
)


@contextlib.contextmanager
def using_state(state: TrainState) -> Iterator[TrainState]:
    """Make ``state`` the one :func:`get_variable` reads while ``model_fn`` runs."""
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)


def current_state() -> TrainState:
    """The :class:`~monitored.TrainState` the running ``model_fn`` works on.

    What an optimizer takes (``optimizer.minimize(current_state(), ...)``); a
    ``model_fn`` may also take it as an argument named ``state``.
    """
    state = _CURRENT.get()
    if state is None:
        raise EstimatorError(
            "no model_fn is running: monitored.estimator.get_variable and current_state "
            "work inside a model_fn called by an Estimator"
        )
    return state


def get_global_step() -> int:
    """The global step of the current state: TF's ``tf.train.get_global_step()``."""
    return current_state().global_step


def zeros_initializer() -> Initializer:
    """TF's ``tf.zeros_initializer()``."""

    def initialize(shape: tuple[int, ...], dtype: np.dtype[Any], rng: np.random.Generator) -> Any:
        return np.zeros(shape, dtype)

    return initialize


def glorot_uniform_initializer() -> Initializer:
    """TF's ``tf.glorot_uniform_initializer()``, ``tf.get_variable``'s default.

    Uniform in ``±sqrt(6 / (fan_in + fan_out))``, the fans computed as TF does
    (the last two dimensions, times the receptive field for convolution kernels),
    drawn from the state's generator.
    """

    def initialize(shape: tuple[int, ...], dtype: np.dtype[Any], rng: np.random.Generator) -> Any:
        if len(shape) == 0:
            fan_in = fan_out = 1
        elif len(shape) == 1:
            fan_in = fan_out = shape[0]
        else:
            receptive = math.prod(shape[:-2])
            fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
        limit = math.sqrt(6.0 / max(1.0, fan_in + fan_out))
        return rng.uniform(-limit, limit, shape).astype(dtype)

    return initialize


def get_variable(
    name: str,
    shape: Sequence[int] | None = None,
    dtype: Any = np.float32,
    initializer: Initializer | Any = None,
    *,
    trainable: bool = True,
) -> Any:
    """The entry ``name`` of the current state, created on first use.

    ``initializer`` is a function ``(shape, dtype, rng) -> array``
    (:func:`glorot_uniform_initializer`, TF's default, when ``None``), or an
    array or number to start from (``shape`` is then optional). The state's
    generator draws the initial values, so a run with a seed starts the same
    every time. An existing entry must match ``shape`` and ``dtype``;
    ``trainable=False`` marks it as not a model variable (a counter, a moving
    average).
    """
    state = current_state()
    if not isinstance(name, str) or not name:
        raise EstimatorError(f"get_variable: the name must be a non-empty string, not {name!r}")
    wanted = None if shape is None else tuple(int(n) for n in shape)
    kind = np.dtype(dtype)
    if name in state:
        value = state[name]
        if wanted is not None and tuple(value.shape) != wanted:
            raise EstimatorError(
                f"get_variable({name!r}, shape={wanted}): the state's entry has shape "
                f"{tuple(value.shape)}; is another variable using this name?"
            )
        return value
    if state.finalized:
        raise EstimatorError(
            f"get_variable({name!r}): the state has no such entry and its entries are fixed "
            "(the checkpoint restored, or the build call of this run, did not create it); "
            "create every variable on every call of model_fn, whatever the mode"
        )
    if initializer is None:
        initializer = glorot_uniform_initializer()
    if callable(initializer):
        if wanted is None:
            raise EstimatorError(f"get_variable({name!r}): an initializer function needs a shape")
        value = initializer(wanted, kind, state.rng)
    else:
        value = np.array(initializer, dtype=kind)
        if wanted is not None:
            value = np.broadcast_to(value, wanted).copy()
    if wanted is not None and tuple(value.shape) != wanted:
        raise EstimatorError(
            f"get_variable({name!r}): the initializer made shape {tuple(value.shape)}, not {wanted}"
        )
    state.add(name, value, trainable=trainable)
    return state[name]
