"""``Optimizer``: TF1's optimizer API over a ``TrainState``.

Variables are entries of the state, so every method takes the state:
``compute_gradients(state, fn)`` calls the user's ``fn(state) -> (loss, grads)``
(we do not differentiate; ``grads`` maps names to gradients the user computed),
``apply_gradients(state, grads_and_vars)`` updates the variables and slots in
place and counts the step, ``minimize`` does both.

Slots live in the state as ``"<variable>/<optimizer name>/<slot>"`` (Adam's first
moment of ``"w"`` is ``"w/Adam/m"``), per-optimizer values as
``"<optimizer name>/<value>"`` (``"Adam/beta1_power"``), so a checkpoint holds
them and a restored run continues bit for bit. ``create_slots`` makes them up
front; ``apply_gradients`` makes missing ones itself while the state is not yet
finalized.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from ..._core._backend import array_module, is_array, is_device_array
from ..._core._state import TrainState
from ._elementwise import UpdateRule, run_dense, run_rows
from ._hyper import StepValue, check_name, check_real
from ._indexed_slices import IndexedSlices, summed_rows_of
from ._types import Array, LearningRate
from ._variables import (
    check_trainable,
    check_var_list,
    describe,
    ensure_entry,
    lookup_variable,
    trainable_variables,
)

__all__ = ["GradsAndVars", "Optimizer"]

#: A gradient per variable: a mapping ``name -> gradient`` or TF's list of
#: ``(gradient, name)`` pairs. A gradient is an array of the variable's shape and
#: dtype, an :class:`IndexedSlices`, or ``None`` (skipped).
GradsAndVars: TypeAlias = Mapping[str, Any] | Iterable[tuple[Any, str]]

#: ``fn(state) -> (loss, {name: gradient})``.
LossAndGradsFn: TypeAlias = Callable[[TrainState], tuple[Any, Mapping[str, Any]]]


#: What a per-optimizer entry looks like: a 0-d float64 NumPy array.
_HOST_SCALAR = np.empty((), np.float64)


class _Gradient(NamedTuple):
    name: str
    var: Array
    dense: Array | None
    rows: Array | None
    values: Array | None


class Optimizer(abc.ABC):
    """Base class of the optimizers: slots, validation, and the apply loop.

    Subclasses declare their slots (:meth:`_slot_initializers`), the per-step
    scalars (:meth:`_prepare`) and the elementwise update (:meth:`_rule`); the
    base class applies the rule to a dense gradient, or to the rows of a
    row-sparse one only (TF1's sparse semantics for every optimizer but Adam,
    which overrides :meth:`_apply_sparse`).
    """

    __slots__ = ("_learning_rate", "_name")

    def __init__(self, learning_rate: LearningRate, name: str) -> None:
        self._learning_rate = StepValue(learning_rate, "learning_rate")
        self._name = check_name(name)

    # -- names ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The optimizer's name, the middle component of its slots' entry names."""
        return self._name

    def get_name(self) -> str:
        """The optimizer's name (TF1's spelling of :attr:`name`)."""
        return self._name

    @property
    def learning_rate(self) -> LearningRate:
        """The learning rate: a number or a function of the global step.

        Settable between steps, which is how a TF1 script that fed its rate
        through a placeholder every step ports: a hook's ``before_run`` (or the
        step function) assigns ``opt.learning_rate = rate`` and the next
        :meth:`apply_gradients` uses it. The value is checked on assignment (a
        negative, NaN or non-numeric rate is refused there). A rate set this way
        is not saved in checkpoints, so compute it from ``state.global_step``
        (or keep it in the state) for a resumed run to use the same rates.
        """
        return self._learning_rate.value

    @learning_rate.setter
    def learning_rate(self, value: LearningRate) -> None:
        self._learning_rate = StepValue(value, f"{type(self).__name__}.learning_rate")

    def get_slot_names(self) -> list[str]:
        """The names of the slots this optimizer keeps per variable, sorted (as TF1)."""
        return sorted(name for name, _ in self._slot_initializers())

    def slot_key(self, var_name: str, slot_name: str) -> str:
        """The ``TrainState`` entry holding slot ``slot_name`` of ``var_name``."""
        if slot_name not in self.get_slot_names():
            raise ValueError(
                f"{type(self).__name__} has no slot {slot_name!r}; its slots are "
                f"{self.get_slot_names()}"
            )
        return f"{var_name}/{self._name}/{slot_name}"

    def non_slot_keys(self) -> list[str]:
        """The ``TrainState`` entries this optimizer keeps once, not per variable."""
        return [f"{self._name}/{name}" for name, _ in self._non_slot_initializers()]

    def get_slot(self, state: TrainState, var_name: str, slot_name: str) -> Array | None:
        """Slot ``slot_name`` of variable ``var_name``, or ``None`` if not created yet."""
        key = self.slot_key(var_name, slot_name)
        return state.get(key)

    # -- slots --------------------------------------------------------------------------
    def create_slots(self, state: TrainState, var_list: Iterable[str] | None = None) -> None:
        """Create the slots of ``var_list`` (default: every trainable variable) in ``state``.

        Existing slots are kept, so this is safe to call again and after a restore.
        Call it before the session is created (``Scaffold.init_fn``): a finalized
        state cannot gain entries. ``var_list=None`` means
        :func:`~monitored.train.optimizers.trainable_variables`.
        """
        what = f"{type(self).__name__}.create_slots"
        names = trainable_variables(state) if var_list is None else check_var_list(var_list, what)
        for name in names:
            check_trainable(state, name, what)
        variables = [(name, lookup_variable(state, name, what)) for name in names]
        self._ensure_slots(state, variables)

    def _ensure_slots(self, state: TrainState, variables: Sequence[tuple[str, Array]]) -> None:
        owner = f"{type(self).__name__} {self._name!r}"
        how = f"call {type(self).__name__}.create_slots(state)"
        for name, var in variables:
            for slot, fill in self._slot_initializers():
                key = f"{name}/{self._name}/{slot}"
                ensure_entry(state, key, var, fill, owner, how)
        for name, value in self._non_slot_initializers():
            key = f"{self._name}/{name}"
            ensure_entry(state, key, _HOST_SCALAR, value, owner, how)

    # -- the TF1 API ------------------------------------------------------------------
    def compute_gradients(
        self,
        state: TrainState,
        fn: LossAndGradsFn,
        var_list: Iterable[str] | None = None,
    ) -> tuple[Any, list[tuple[Any, str]]]:
        """Call ``fn(state) -> (loss, grads)`` and pair the gradients with their names.

        Returns ``(loss, [(gradient, name), ...])`` in TF1's pair order, for
        ``var_list`` (a missing gradient is ``None``, as TF1 gives for a variable
        the loss does not depend on) or, by default, for every name in ``grads``.
        Process the pairs (clip them, say), then :meth:`apply_gradients`.
        """
        what = f"{type(self).__name__}.compute_gradients"
        result = fn(state)
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError(
                f"{what}: fn(state) must return a (loss, grads) tuple, got {type(result).__name__}"
            )
        loss, grads = result
        if not isinstance(grads, Mapping):
            raise TypeError(
                f"{what}: fn(state) must return (loss, grads) with grads a mapping from "
                f"variable names to gradients, got {type(grads).__name__}"
            )
        names = list(grads) if var_list is None else check_var_list(var_list, what)
        for name in names:
            lookup_variable(state, name, what)
            check_trainable(state, name, what)
        return loss, [(grads.get(name), name) for name in names]

    def apply_gradients(
        self,
        state: TrainState,
        grads_and_vars: GradsAndVars,
        global_step: bool = True,
        *,
        learning_rate: float | None = None,
    ) -> None:
        """Update the variables (and slots) in ``state`` in place, then count the step.

        ``grads_and_vars`` maps names to gradients, or is TF1's list of
        ``(gradient, name)`` pairs. ``None`` gradients are skipped, as in TF1;
        every other gradient is checked (known variable, shape, dtype, array
        module, trainable, row range) before anything is updated. A 0-d entry
        takes a 0-d NumPy or CuPy array or a NumPy scalar (``err.mean()``, an
        ``np.float32``) of its dtype, as TF1's took a 0-d tensor.
        ``state.global_step`` is incremented unless ``global_step=False``.

        ``learning_rate`` (a number) overrides the optimizer's rate for this
        call only: TF1's ``feed_dict={lr: rate}``, for a step function that
        receives the rate as an argument (``await sess.run(step, batch, lr)``).
        """
        what = f"{type(self).__name__}.apply_gradients"
        if not isinstance(global_step, bool):
            raise TypeError(
                f"{what}: global_step must be True (increment state.global_step) or False, "
                f"got {global_step!r}"
            )
        fed = (
            None
            if learning_rate is None
            else check_real(learning_rate, f"{what}: learning_rate", low=0.0)
        )
        pairs = _pairs(grads_and_vars, what)
        gradients = [
            _check_gradient(state, name, grad, what) for name, grad in pairs if grad is not None
        ]
        if not gradients:
            raise ValueError(
                f"{what}: no gradients provided for any variable: {[name for name, _ in pairs]}"
            )
        gradients = _sum_sparse_rows(gradients, what)
        rate = self._learning_rate.at(state.global_step) if fed is None else fed
        self._ensure_slots(state, [(g.name, g.var) for g in gradients])
        hyper = self._prepare(rate, state)
        slot_names = [slot for slot, _ in self._slot_initializers()]
        for grad in gradients:
            slots = tuple(state[f"{grad.name}/{self._name}/{slot}"] for slot in slot_names)
            if grad.dense is not None:
                self._apply_dense(grad.name, grad.var, grad.dense, slots, hyper)
            else:
                self._apply_sparse(grad.name, grad.var, grad.rows, grad.values, slots, hyper)
        self._finish(state)
        if global_step:
            state.global_step += 1

    def minimize(
        self,
        state: TrainState,
        fn: LossAndGradsFn,
        var_list: Iterable[str] | None = None,
        global_step: bool = True,
        *,
        learning_rate: float | None = None,
    ) -> Any:
        """:meth:`compute_gradients` then :meth:`apply_gradients`; returns the loss.

        ``learning_rate`` overrides the optimizer's rate for this call (a fed rate).
        """
        loss, grads_and_vars = self.compute_gradients(state, fn, var_list)
        self.apply_gradients(
            state, grads_and_vars, global_step=global_step, learning_rate=learning_rate
        )
        return loss

    def __repr__(self) -> str:
        config = self._config()
        if "learning_rate" not in config:
            config = {"learning_rate": self._learning_rate, **config}
        config["name"] = self._name
        args = ", ".join(f"{key}={value!r}" for key, value in config.items())
        return f"{type(self).__name__}({args})"

    # -- what subclasses define ------------------------------------------------------
    @abc.abstractmethod
    def _slot_initializers(self) -> tuple[tuple[str, float], ...]:
        """``(slot name, initial value)`` per slot, in the order the rule takes them."""

    def _non_slot_initializers(self) -> tuple[tuple[str, float], ...]:
        """``(name, initial value)`` of 0-d float64 entries kept once per optimizer."""
        return ()

    @abc.abstractmethod
    def _rule(self) -> UpdateRule:
        """The elementwise update of a variable and its slots."""

    @abc.abstractmethod
    def _config(self) -> dict[str, object]:
        """The constructor arguments besides ``learning_rate`` and ``name`` (for repr)."""

    def _prepare(self, learning_rate: float, state: TrainState) -> tuple[float, ...]:
        """The rule's scalars for this step, computed once per ``apply_gradients``."""
        del state
        return (learning_rate,)

    def _apply_dense(
        self,
        name: str,
        var: Array,
        grad: Array,
        slots: tuple[Array, ...],
        hyper: tuple[float, ...],
    ) -> None:
        """The dense update of variable ``name`` (``var``) and its slots."""
        run_dense(self._rule(), (grad,), (var, *slots), hyper)

    def _apply_sparse(
        self,
        name: str,
        var: Array,
        rows: Array,
        values: Array,
        slots: tuple[Array, ...],
        hyper: tuple[float, ...],
    ) -> None:
        """TF1's sparse update: only rows ``rows`` of the variable and its slots change."""
        run_rows(self._rule(), rows, (values,), (var, *slots), hyper)

    def _finish(self, state: TrainState) -> None:
        """Update per-optimizer entries after all variables (Adam's beta powers)."""
        del state


def _pairs(grads_and_vars: GradsAndVars, what: str) -> list[tuple[str, Any]]:
    if isinstance(grads_and_vars, Mapping):
        for name in grads_and_vars:
            if not isinstance(name, str):
                raise TypeError(f"{what}: variable names must be strings, got {name!r}")
        return list(grads_and_vars.items())
    if (
        isinstance(grads_and_vars, str | bytes | IndexedSlices)
        or is_array(grads_and_vars)
        or not isinstance(grads_and_vars, Iterable)
    ):
        raise TypeError(
            f"{what}: grads_and_vars must be a mapping name -> gradient or a list of "
            f"(gradient, name) pairs, got {type(grads_and_vars).__name__}"
        )
    pairs: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for item in grads_and_vars:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise TypeError(
                f"{what}: expected (gradient, name) pairs, got an item of type "
                f"{type(item).__name__}"
            )
        grad, name = item
        if not isinstance(name, str):
            if isinstance(grad, str):
                raise TypeError(
                    f"{what}: pairs are (gradient, name), TF1's order; got (name, gradient) "
                    f"for {grad!r}"
                )
            raise TypeError(f"{what}: variable names must be strings, got {name!r}")
        if name in seen:
            raise ValueError(f"{what}: variable {name!r} has more than one gradient")
        seen.add(name)
        pairs.append((name, grad))
    return pairs


def _check_gradient(state: TrainState, name: str, grad: Any, what: str) -> _Gradient:
    var = lookup_variable(state, name, what)
    check_trainable(state, name, what)
    if isinstance(grad, IndexedSlices):
        return _check_sparse(name, var, grad, what)
    if isinstance(grad, np.generic):
        # A NumPy scalar (``err.mean()`` is an ``np.float32``) is a 0-d value, as
        # TF1's 0-d tensors were: an array of the variable's module from here on,
        # checked like any other gradient (so only a 0-d variable takes it).
        grad = array_module(var).asarray(grad)
    if not is_array(grad):
        raise TypeError(
            f"{what}: the gradient of {name!r} must be a NumPy or CuPy array or an "
            f"IndexedSlices, got {type(grad).__name__}; wrap it with numpy.asarray(...)"
        )
    _check_module(name, var, grad, what)
    if grad.shape != var.shape or grad.dtype != var.dtype:
        raise ValueError(
            f"{what}: the gradient of {name!r} is {describe(grad)}, but the variable is "
            f"{describe(var)}; shape and dtype must match"
        )
    return _Gradient(name, var, grad, None, None)


def _check_sparse(name: str, var: Array, grad: IndexedSlices, what: str) -> _Gradient:
    values = grad.values
    _check_module(name, var, values, what)
    if var.ndim == 0:
        raise ValueError(
            f"{what}: variable {name!r} is a scalar; an IndexedSlices gradient needs a "
            "variable with rows"
        )
    if values.dtype != var.dtype or tuple(values.shape[1:]) != tuple(var.shape[1:]):
        raise ValueError(
            f"{what}: the IndexedSlices gradient of {name!r} has rows of {values.dtype} "
            f"{tuple(values.shape[1:])}, but the variable ({describe(var)}) has rows of "
            f"{var.dtype} {tuple(var.shape[1:])}"
        )
    if grad.dense_shape is not None and grad.dense_shape != tuple(var.shape):
        raise ValueError(
            f"{what}: the IndexedSlices gradient of {name!r} has dense_shape "
            f"{grad.dense_shape}, but the variable is {describe(var)}"
        )
    # Rows still as given: _sum_sparse_rows sums duplicates and checks the range.
    return _Gradient(name, var, None, grad.indices, values)


def _sum_sparse_rows(gradients: list[_Gradient], what: str) -> list[_Gradient]:
    """The sparse gradients with their duplicate rows summed and their rows checked.

    All of them at once: on CuPy, their row counts and extremes reach the host in
    one transfer (:func:`summed_rows_of`).
    """
    sparse = [i for i, g in enumerate(gradients) if g.dense is None]
    if not sparse:
        return gradients
    summed = summed_rows_of(
        [
            (
                gradients[i].values,
                gradients[i].rows,
                gradients[i].var.shape[0],
                f"{what}: the IndexedSlices gradient of {gradients[i].name!r}",
            )
            for i in sparse
        ]
    )
    done = list(gradients)
    for i, (rows, values) in zip(sparse, summed, strict=True):
        done[i] = done[i]._replace(rows=rows, values=values)
    return done


def _check_module(name: str, var: Array, grad: Array, what: str) -> None:
    if type(grad) is type(var) and not is_device_array(var):
        return
    if is_device_array(grad) != is_device_array(var):
        raise TypeError(
            f"{what}: the gradient of {name!r} is {describe(grad)}, but the variable is "
            f"{describe(var)}; both must be NumPy or both CuPy"
        )
    if is_device_array(var) and grad.device.id != var.device.id:  # pragma: no cover - GPU
        raise ValueError(
            f"{what}: the gradient of {name!r} is on GPU {grad.device.id}, but the variable "
            f"is on GPU {var.device.id}"
        )
