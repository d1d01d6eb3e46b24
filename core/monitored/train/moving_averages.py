"""``ExponentialMovingAverage``: TF1's shadow variables, kept in the ``TrainState``.

``ema.apply(state, ["w"])`` updates the shadow entry ``"w/ExponentialMovingAverage"``
(created as a copy of ``w`` the first time) in place::

    shadow -= (1 - decay) * (shadow - w)

With ``num_updates`` (an int, or a callable such as ``lambda: state.global_step``)
the decay is ``min(decay, (1 + n) / (10 + n))``, TF1's warm-up that lets early
averages move fast. Shadows are state entries, so checkpoints hold them; create
them before the session is created (call ``apply`` once in ``Scaffold.init_fn``:
the first update of a fresh shadow changes nothing). Evaluate with the averaged
weights inside ``with ema.averaged(state): ...``.

Values that are not state entries (TF1 averaged loss tensors) are averaged with
``ema.apply(state, values={"loss": loss})``: the average is a new entry
``"loss/ExponentialMovingAverage"``, marked ``trainable=False``, that starts at
zero (TF1 initializes averages of tensors with zeros) and, with
``zero_debias=True``, is divided by the bias of that zero start.
:func:`assign_moving_average` is TF1's function of the same name for one entry,
with ``zero_debias`` (on by default, as in TF1).

Zero debiasing (Kingma and Ba, Adam, section 3; TF1's ``_zero_debias``) keeps a
biased average ``b`` and an update count ``t`` next to the average ``a``::

    b -= (1 - decay) * (b - value)     # from b = 0
    t += 1
    a  = b / (1 - decay ** t)

so a constant value ``c`` is averaged to exactly ``c`` from the first update on.
The biased average and the count are entries ``"<average>/biased"`` and
``"<average>/local_step"`` (an int64 scalar), kept in checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from numbers import Real
from types import ModuleType
from typing import Any, final

import numpy as np

from .._core._backend import array_module, is_array, is_device_array
from .._core._state import TrainState
from .optimizers._elementwise import UpdateRule, run_dense
from .optimizers._hyper import check_name, check_real
from .optimizers._types import Array
from .optimizers._variables import (
    check_var_list,
    describe,
    ensure_entry,
    lookup_variable,
    trainable_variables,
)

__all__ = ["ExponentialMovingAverage", "assign_moving_average", "ensure_zero_debias"]


def _ema(
    xp: ModuleType,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    temps: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    (x,), (s,), (t,), (one_minus_decay,) = inputs, outputs, temps, scalars
    xp.subtract(s, x, out=t)
    t *= one_minus_decay
    s -= t


#: How to create the averages of values, for the error on a finalized state.
_CREATE_HOW = "call ema.create_averages(state, values={name: example_value})"

EMA = UpdateRule(
    "ema",
    inputs=("x",),
    outputs=("s",),
    scalars=("one_minus_decay",),
    n_temps=1,
    func=_ema,
    cuda="s -= (s - x) * one_minus_decay;",
)


@final
class ExponentialMovingAverage:
    """Moving averages of state entries, TF1's ``tf.train.ExponentialMovingAverage``.

    ``decay`` is in ``[0, 1]`` (close to 1: 0.999, 0.9999). Shadow entries are
    named :meth:`average_name` (``"<variable>/<name>"``). ``zero_debias`` (TF1's
    flag, off by default as there) debiases the averages of values, which start
    at zero; shadows of variables start as copies and need no debiasing.
    """

    __slots__ = ("_decay", "_name", "_num_updates", "_zero_debias")

    def __init__(
        self,
        decay: float,
        num_updates: int | Callable[[], int] | None = None,
        *,
        zero_debias: bool = False,
        name: str = "ExponentialMovingAverage",
    ) -> None:
        self._decay = check_real(decay, "decay", low=0.0, high=1.0)
        if num_updates is not None and not callable(num_updates):
            _check_count(num_updates)
        if not isinstance(zero_debias, bool):
            raise TypeError(f"zero_debias must be True or False, got {zero_debias!r}")
        if zero_debias and self._decay == 1.0:
            raise ValueError("decay must be < 1 with zero_debias=True (it divides by 1 - decay**t)")
        self._num_updates = num_updates
        self._zero_debias = zero_debias
        self._name = check_name(name)

    @property
    def name(self) -> str:
        """The name, the last component of the shadow entries' names."""
        return self._name

    def average_name(self, var_name: str) -> str:
        """The ``TrainState`` entry holding the moving average of ``var_name``."""
        return f"{var_name}/{self._name}"

    def average(self, state: TrainState, var_name: str) -> Array | None:
        """The moving average of ``var_name``, or ``None`` if it has none yet."""
        return state.get(self.average_name(var_name))

    def current_decay(self) -> float:
        """The decay the next :meth:`apply` uses (``num_updates`` taken into account)."""
        if self._num_updates is None:
            return self._decay
        count = self._num_updates() if callable(self._num_updates) else self._num_updates
        count = _check_count(count)
        return min(self._decay, (1.0 + count) / (10.0 + count))

    def apply(
        self,
        state: TrainState,
        var_list: Iterable[str] | None = None,
        *,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Update the moving averages of ``var_list`` and of ``values``.

        ``var_list`` defaults to all trainable variables, or to none when only
        ``values`` are given. A missing shadow is created as a copy of its
        variable, which a finalized state does not allow: apply once (or
        :meth:`create_averages`) before the session is created.

        ``values`` maps names that are not state entries to values (a loss: a
        number or an array), TF1's ``ema.apply([loss_tensor])``. Each average is
        the entry :meth:`average_name` of its name, starting at zero, marked
        ``trainable=False``; debiased when the average was built with
        ``zero_debias=True``. Create these before the session with
        :meth:`create_averages`.
        """
        what = "ExponentialMovingAverage.apply"
        owner = f"ExponentialMovingAverage {self._name!r}"
        decay = self.current_decay()
        pending = self._check_values(state, values, what)
        # Values first: their averages get their trainable=False marker before the
        # default var_list is computed (a restored state has no markers yet).
        for key, value in pending:
            self._ensure_value_average(state, key, value, owner, _CREATE_HOW)
        if var_list is None and values is not None:
            names: list[str] = []
        elif var_list is None:
            names = trainable_variables(state)
        else:
            names = check_var_list(var_list, what)
        variables = [(name, lookup_variable(state, name, what)) for name in names]
        how = "call ema.apply(state, var_list) once"
        for name, var in variables:
            ensure_entry(state, self.average_name(name), var, None, owner, how)
        one_minus_decay = 1.0 - decay
        for name, var in variables:
            run_dense(EMA, (var,), (state[self.average_name(name)],), (one_minus_decay,))
        for key, value in pending:
            _update(state, self.average_name(key), value, decay, self._zero_debias)

    def create_averages(
        self,
        state: TrainState,
        var_list: Iterable[str] | None = None,
        *,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the averages :meth:`apply` keeps, without updating any (for ``init_fn``).

        Shadows of ``var_list`` (default: all trainable variables, or none when
        ``values`` are given) start as copies of their variables; averages of
        ``values`` (example values: only their shape, dtype and array module
        count) start at zero and are marked ``trainable=False``, with their
        zero-debias entries when ``zero_debias=True``. Existing entries are
        kept, so this is safe after a restore.
        """
        what = "ExponentialMovingAverage.create_averages"
        owner = f"ExponentialMovingAverage {self._name!r}"
        for key, value in self._check_values(state, values, what):
            self._ensure_value_average(state, key, value, owner, _CREATE_HOW)
        if var_list is None and values is not None:
            return
        names = trainable_variables(state) if var_list is None else check_var_list(var_list, what)
        for name in names:
            var = lookup_variable(state, name, what)
            how = "call ema.create_averages(state, var_list)"
            ensure_entry(state, self.average_name(name), var, None, owner, how)

    def _check_values(
        self, state: TrainState, values: Mapping[str, Any] | None, what: str
    ) -> list[tuple[str, Array]]:
        if values is None:
            return []
        if not isinstance(values, Mapping):
            raise TypeError(
                f"{what}: values must be a mapping name -> value, got {type(values).__name__}"
            )
        checked = []
        for key, value in values.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"{what}: value names must be non-empty strings, got {key!r}")
            if key in state:
                raise ValueError(
                    f"{what}: {key!r} is a TrainState entry; average it through var_list "
                    "(values are for what the state does not hold, such as a loss)"
                )
            checked.append((key, _as_float_array(value, f"{what}: value {key!r}")))
        return checked

    def _ensure_value_average(
        self, state: TrainState, key: str, value: Array, owner: str, how: str
    ) -> None:
        average = self.average_name(key)
        if average in state:  # later values may differ in dtype: they are cast to the average's
            state.set_trainable(average, False)  # again after a restore, which has no markers
        else:
            _ensure_zeros(state, average, value, owner, how)
        if self._zero_debias:
            ensure_zero_debias(state, average)

    def variables_to_restore(
        self, state: TrainState, moving_avg_variables: Iterable[str] | None = None
    ) -> dict[str, str]:
        """Checkpoint entry to load into each state entry, for evaluating with averages.

        Maps :meth:`average_name` of each of ``moving_avg_variables`` (default: the
        state's trainable variables) to the variable's own name, and every other
        entry of ``state`` to itself; shadows themselves are left out. Give this
        to a restore that reads ``checkpoint[key]`` into ``state[value]``.
        """
        what = "ExponentialMovingAverage.variables_to_restore"
        averaged = (
            trainable_variables(state)
            if moving_avg_variables is None
            else check_var_list(moving_avg_variables, what)
        )
        mapping = {self.average_name(name): name for name in averaged}
        skip = set(averaged)
        for name in state:
            if name not in skip and name not in mapping:
                mapping[name] = name
        return mapping

    @contextmanager
    def averaged(self, state: TrainState, var_list: Iterable[str] | None = None) -> Iterator[None]:
        """Swap the averages into the variables for the ``with`` block, then swap back.

        ``var_list`` defaults to every variable that has a shadow. The swap copies
        in place, so the arrays keep their identity (and a finalized state
        accepts it); the trained values come back even if the block raises.
        """
        what = "ExponentialMovingAverage.averaged"
        if var_list is None:
            names = [name for name in state if self.average_name(name) in state]
        else:
            names = check_var_list(var_list, what)
        pairs = []
        for name in names:
            var = lookup_variable(state, name, what)
            shadow = self.average(state, name)
            if shadow is None:
                raise KeyError(f"{what}: variable {name!r} has no moving average in the state")
            pairs.append((var, shadow))
        saved = [var.copy() for var, _ in pairs]
        for var, shadow in pairs:
            var[...] = shadow
        try:
            yield
        finally:
            for (var, _), kept in zip(pairs, saved, strict=True):
                var[...] = kept

    def __repr__(self) -> str:
        debias = ", zero_debias=True" if self._zero_debias else ""
        return (
            f"ExponentialMovingAverage(decay={self._decay!r}, "
            f"num_updates={self._num_updates!r}{debias}, name={self._name!r})"
        )


def assign_moving_average(
    state: TrainState,
    name: str,
    value: Any,
    decay: float,
    *,
    zero_debias: bool = True,
) -> None:
    """Move entry ``name`` towards ``value``: TF1's ``tf.train.assign_moving_average``.

    ``state[name] -= (1 - decay) * (state[name] - value)``, in place. With
    ``zero_debias`` (the default, as in TF1) the entry is taken to have started
    at zero and is set to the debiased average ``b / (1 - decay ** t)`` (see the
    module docstring); the entries ``"<name>/biased"`` and ``"<name>/local_step"``
    it needs are created by :func:`ensure_zero_debias`, which must run before the
    session is created (in ``Scaffold.init_fn``). Batch-norm style statistics
    that start from a real value use ``zero_debias=False``.

    ``value`` is an array (or a number, for a 0-d entry) of the entry's shape;
    it is cast to the entry's dtype and moved to its array module.
    """
    what = "assign_moving_average"
    decay = check_real(decay, f"{what}: decay", low=0.0, high=1.0)
    if not isinstance(zero_debias, bool):
        raise TypeError(f"{what}: zero_debias must be True or False, got {zero_debias!r}")
    if zero_debias and decay == 1.0:
        raise ValueError(f"{what}: decay must be < 1 with zero_debias=True")
    lookup_variable(state, name, what)
    if zero_debias:
        for key in (f"{name}/biased", f"{name}/local_step"):
            if key not in state:
                raise KeyError(
                    f"{what}: entry {name!r} has no zero-debias entry {key!r}; call "
                    f"ensure_zero_debias(state, {name!r}) before the session is created "
                    "(in Scaffold.init_fn), or pass zero_debias=False"
                )
    _update(state, name, _as_float_array(value, f"{what}: value"), decay, zero_debias)


def ensure_zero_debias(state: TrainState, name: str) -> None:
    """Create the entries zero debiasing of entry ``name`` keeps, unless they exist.

    ``"<name>/biased"`` (zeros like the entry) and ``"<name>/local_step"`` (an
    int64 scalar 0 on the host), both marked ``trainable=False``: TF1 creates the
    same two variables the first time ``assign_moving_average`` debiases an entry.
    """
    what = "ensure_zero_debias"
    var = lookup_variable(state, name, what)
    how = f"call ensure_zero_debias(state, {name!r})"
    _ensure_zeros(state, f"{name}/biased", var, what, how)
    step = f"{name}/local_step"
    if step not in state:
        if state.finalized:
            raise RuntimeError(
                f"{what}: TrainState entry {step!r} does not exist and the state is "
                f"finalized; {how} before the session is created, e.g. in Scaffold.init_fn"
            )
        state.add(step, np.zeros((), np.int64), trainable=False)
    elif state[step].shape != () or state[step].dtype != np.int64:
        raise ValueError(
            f"{what}: TrainState entry {step!r} is {describe(state[step])}, but it must be "
            "numpy int64 (); is another entry using this name?"
        )


def _ensure_zeros(state: TrainState, key: str, like: Array, owner: str, how: str) -> None:
    """Entry ``key`` as zeros shaped like ``like`` (if missing), marked non-trainable."""
    ensure_entry(state, key, like, 0.0, owner, how)
    state.set_trainable(key, False)  # again after a restore, which does not store markers


def _update(state: TrainState, name: str, value: Array, decay: float, zero_debias: bool) -> None:
    """One moving-average update of entry ``name`` (and its debias entries) in place."""
    var = state[name]
    value = _to_module(value, var, name)
    if value.shape != var.shape:
        raise ValueError(
            f"moving average {name!r} is {describe(var)}, but the value averaged into it "
            f"is {describe(value)}; the shapes must match"
        )
    xp = array_module(var)
    one_minus_decay = 1.0 - decay
    if not zero_debias:
        var -= (var - value.astype(var.dtype, copy=False)) * one_minus_decay
        return
    biased = state[f"{name}/biased"]
    local_step = state[f"{name}/local_step"]
    biased -= (biased - value.astype(biased.dtype, copy=False)) * one_minus_decay
    local_step += 1
    factor = 1.0 - decay ** int(local_step)
    xp.divide(biased, factor, out=var)  # same dtype: a Python float does not promote


def _as_float_array(value: Any, what: str) -> Array:
    if isinstance(value, np.generic):
        value = np.asarray(value)  # a NumPy scalar keeps its dtype (float32 stays float32)
    elif isinstance(value, Real) and not isinstance(value, bool):
        return np.asarray(float(value))
    if not is_array(value):
        raise TypeError(
            f"{what} must be a number or a NumPy or CuPy array, got {type(value).__name__}"
        )
    array = value
    if array.dtype.kind != "f":
        raise TypeError(f"{what} is {describe(array)}; only floating-point values are averaged")
    return array


def _to_module(value: Array, like: Array, name: str) -> Array:
    if is_device_array(like) == is_device_array(value):
        return value
    if is_device_array(value):
        return value.get()
    return array_module(like).asarray(value)


def _check_count(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
        raise ValueError(f"num_updates must be a non-negative integer, got {count!r}")
    return int(count)
