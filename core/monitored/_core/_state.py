"""``TrainState``: everything a checkpoint must hold to resume bit for bit.

The named arrays (parameters, optimizer slots, moving averages), the global step
and the random number generator. Until the session is created hooks and init
functions may add entries; after ``after_create_session`` the set of names, and
each entry's shape, dtype and array module, is fixed (TF1 finalizes its graph at
the same point), so a checkpoint written later always matches.

Entries are trainable unless marked otherwise (TF1's ``trainable=False``): a
non-trainable entry (batch-norm statistics, a loss average, a frozen
preprocessing constant) is left out of ``trainable_variables()``, so optimizers
and ``ExponentialMovingAverage`` skip it when no ``var_list`` is given. The
marker belongs to the code-defined layout of the state, not to its values:
checkpoints do not store it, replacing or restoring an entry keeps it, and
``TrainState(..., non_trainable=[...])`` may name entries that an ``init_fn`` or a
restore creates later.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Final, TypeGuard, final

import numpy as np

from ._backend import is_array, is_device_array

__all__ = ["TrainState", "decode_rng_state", "encode_rng_state"]

#: dtypes of the arrays inside NumPy's bit generator states, and the most items one
#: may have (MT19937's key, the largest, has 624).
_RNG_DTYPES: Final = frozenset({"uint32", "uint64"})
_RNG_MAX_ITEMS: Final = 1 << 16


@final
class TrainState(MutableMapping[str, Any]):
    """Named NumPy or CuPy arrays, the global step and the RNG of one training run.

    ``state["w"] = new_w`` replaces an entry (in-place updates work too),
    ``state.global_step`` counts completed training steps and ``state.rng`` is a
    :class:`numpy.random.Generator` whose full state is saved with checkpoints.

    ``non_trainable`` names entries that are not model variables (TF1's
    ``trainable=False``); they may be added later (in ``Scaffold.init_fn``, or by
    a checkpoint restore), and each must exist once the session is created.
    :meth:`add` with ``trainable=False`` and :meth:`set_trainable` mark entries too.
    """

    __slots__ = ("_arrays", "_finalized", "_non_trainable", "global_step", "initialized", "rng")

    def __init__(
        self,
        arrays: Mapping[str, Any] | None = None,
        /,
        *,
        global_step: int = 0,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
        non_trainable: Iterable[str] = (),
    ) -> None:
        if seed is not None and rng is not None:
            raise ValueError("TrainState: pass either seed or rng, not both")
        self._arrays: dict[str, Any] = {}
        self._finalized = False
        self._non_trainable: set[str] = set()
        if isinstance(non_trainable, str):
            raise TypeError(
                f"TrainState: non_trainable must be a list of entry names, not the string "
                f"{non_trainable!r}"
            )
        for name in non_trainable:
            self._non_trainable.add(_check_name(name))
        self.global_step: int = _check_step(global_step)
        self.rng: np.random.Generator = rng if rng is not None else np.random.default_rng(seed)
        #: Set by the chief's session manager once the state is initialized or
        #: restored; workers wait for it.
        self.initialized = False
        for name, value in (arrays or {}).items():
            self[name] = value

    # -- mapping protocol ---------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        try:
            return self._arrays[name]
        except KeyError:
            raise KeyError(
                f"TrainState has no entry {name!r}; it has {sorted(self._arrays)}"
            ) from None

    def __setitem__(self, name: str, value: Any) -> None:
        if self._arrays.get(name) is value:
            # ``state["w"] -= lr * g`` updates in place, then stores the same array
            # again: it was checked when it was stored.
            return
        _check_name(name)
        if not is_array(value):
            raise TypeError(
                f"TrainState entry {name!r} must be a NumPy or CuPy array, got "
                f"{type(value).__name__}; wrap it with numpy.asarray(...)"
            )
        if self._finalized:
            old = self._arrays.get(name)
            if old is None:
                raise KeyError(
                    f"cannot add TrainState entry {name!r} after the session was created; "
                    "add it before (in Scaffold.init_fn or a hook's begin)"
                )
            if (
                value.shape != old.shape
                or value.dtype != old.dtype
                or is_device_array(value) != is_device_array(old)
            ):
                raise ValueError(
                    f"TrainState entry {name!r} is {_describe(old)}; cannot replace it with "
                    f"{_describe(value)} after the session was created"
                )
        self._arrays[name] = value

    def __delitem__(self, name: str) -> None:
        if self._finalized:
            raise KeyError(f"cannot delete TrainState entry {name!r} after the session was created")
        del self._arrays[name]
        self._non_trainable.discard(name)  # a new entry of this name starts trainable

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    # -- trainable marker -------------------------------------------------------------
    def add(self, name: str, value: Any, *, trainable: bool = True) -> None:
        """Add the new entry ``name``; ``trainable=False`` marks it as not a model variable.

        TF1's ``tf.Variable(value, name=name, trainable=trainable)``. Unlike
        ``state[name] = value`` this refuses to replace an existing entry, so two
        pieces of code cannot silently claim one name.
        """
        if name in self._arrays:
            raise KeyError(
                f"TrainState already has an entry {name!r} ({_describe(self._arrays[name])}); "
                f"replace it with state[{name!r}] = value"
            )
        trainable = _check_flag(trainable, "trainable")
        self[name] = value
        self._mark(name, trainable)

    def set_trainable(self, name: str, trainable: bool) -> None:
        """Mark the existing entry ``name`` as trainable or not.

        Checkpoints do not store the marker, so set it in code that runs on a
        resumed run too: the constructor's ``non_trainable`` (the simplest),
        ``Scaffold.local_init_fn`` (runs after the init or the restore), or the
        step itself. A marker set only in ``Scaffold.init_fn`` (or by :meth:`add`
        there) is missing when a run resumes from a checkpoint, since ``init_fn``
        does not run then.
        """
        trainable = _check_flag(trainable, "trainable")
        if name not in self._arrays:
            raise self._missing(name, "set_trainable")
        self._mark(name, trainable)

    def is_trainable(self, name: str) -> bool:
        """Whether entry ``name`` is trainable (not marked ``trainable=False``)."""
        if name not in self._arrays:
            raise self._missing(name, "is_trainable")
        return name not in self._non_trainable

    @property
    def non_trainable(self) -> frozenset[str]:
        """The names marked ``trainable=False`` (including declared, not yet added ones)."""
        return frozenset(self._non_trainable)

    def _mark(self, name: str, trainable: bool) -> None:
        if trainable:
            self._non_trainable.discard(name)
        else:
            self._non_trainable.add(name)

    def _missing(self, name: str, what: str) -> KeyError:
        close = difflib.get_close_matches(name, list(self._arrays), n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        return KeyError(f"TrainState.{what}: the state has no entry {name!r}{hint}")

    # -- lifecycle ------------------------------------------------------------------
    @property
    def finalized(self) -> bool:
        """Whether the set of entries is fixed (the session has been created)."""
        return self._finalized

    def finalize(self) -> None:
        """Fix the set of entries and their shapes, dtypes and array modules.

        Every name declared non-trainable must exist by now: a name that does
        not is most likely misspelled, and would otherwise leave the entry it
        meant trainable without a word.
        """
        missing = sorted(self._non_trainable - set(self._arrays))
        if missing:
            hints = []
            for name in missing:
                close = difflib.get_close_matches(name, list(self._arrays), n=1)
                hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise KeyError(
                f"TrainState: entries {', '.join(hints)} were declared non-trainable but do "
                "not exist when the session is created; add them (in Scaffold.init_fn) or "
                "fix the names in non_trainable=[...]"
            )
        self._finalized = True

    def unfinalize(self) -> None:
        """Allow adding and removing entries again.

        The session calls it on exit when it finalized the state itself, as TF1
        un-finalizes its graph: a later session on the same state (evaluation
        after training, a re-run in a notebook) may add entries in ``begin``.
        """
        self._finalized = False

    # -- RNG ------------------------------------------------------------------------
    @property
    def rng_state(self) -> dict[str, Any]:
        """The generator's complete state, as NumPy gives it.

        PCG64's is plain JSON; Philox's, MT19937's and SFC64's hold NumPy arrays:
        :func:`encode_rng_state` makes any of them JSON, :func:`decode_rng_state`
        turns that back into a value this property accepts.
        """
        return dict(self.rng.bit_generator.state)

    @rng_state.setter
    def rng_state(self, value: Mapping[str, Any]) -> None:
        name = value.get("bit_generator")
        if name != type(self.rng.bit_generator).__name__:
            raise ValueError(
                f"RNG state is for bit generator {name!r}, but this TrainState uses "
                f"{type(self.rng.bit_generator).__name__!r}"
            )
        self.rng.bit_generator.state = dict(value)

    def __repr__(self) -> str:
        entries = ", ".join(f"{name}: {_describe(v)}" for name, v in self._arrays.items())
        return f"TrainState(global_step={self.global_step}, {{{entries}}})"


def encode_rng_state(value: Any) -> Any:
    """``value`` (``TrainState.rng_state``) with NumPy arrays and scalars made JSON values.

    Arrays become ``{"__ndarray__": dtype, "data": [...]}``, which
    :func:`decode_rng_state` turns back into arrays; what a checkpoint manifest or
    a message to other processes carries.
    """
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.dtype.name, "data": value.tolist()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): encode_rng_state(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode_rng_state(v) for v in value]
    return value


def decode_rng_state(value: Any) -> Any:
    """Undo :func:`encode_rng_state`.

    The value may come from a file someone else wrote: arrays are rebuilt only
    with an allow-listed dtype (``uint32``, ``uint64``) from a flat list of at
    most 65536 integers, so the input never chooses how much memory is
    allocated. ``ValueError`` says what is wrong.
    """
    if isinstance(value, dict):
        if "__ndarray__" in value:
            dtype, data = value["__ndarray__"], value.get("data")
            if dtype not in _RNG_DTYPES:
                raise ValueError(f"an RNG array has the dtype {_short(dtype)}")
            if not isinstance(data, list) or len(data) > _RNG_MAX_ITEMS:
                raise ValueError("an RNG array's data is not a list of at most 65536 items")
            if not all(_is_int(v) for v in data):
                raise ValueError("an RNG array's data holds non-integers")
            return np.asarray(data, dtype=np.dtype(dtype))
        return {k: decode_rng_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_rng_state(v) for v in value]
    if isinstance(value, bool):
        # No bit generator's state holds one, and NumPy would take it as 0 or 1.
        raise ValueError(f"an RNG state holds the boolean {value!r} where integers belong")
    return value


def _short(value: object) -> str:
    text = repr(value)  # from someone else's file: may be huge
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(array: Any) -> str:
    where = "cupy" if is_device_array(array) else "numpy"
    return f"{where} {array.dtype} {tuple(array.shape)}"


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"TrainState entry names must be non-empty strings, got {name!r}")
    return name


def _check_flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return value


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"global_step must be a non-negative integer, got {step!r}")
    return int(step)


def check_global_step(step: Any, step_fn: object) -> int:
    """The global step a step function left, as a Python int.

    A NumPy integer is converted; anything else (a float, an array: a CuPy 0-d
    array would cost a device sync on every read) is an error naming the step.
    """
    try:
        return _check_step(step)
    except ValueError:
        raise TypeError(
            f"step function {getattr(step_fn, '__name__', step_fn)!r} left "
            f"state.global_step = {step!r} ({type(step).__name__}); it must be a "
            "non-negative Python int (use state.global_step += 1)"
        ) from None
