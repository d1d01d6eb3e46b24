"""Which ``TrainState`` entries are model variables, and how auxiliary entries are made.

Optimizer slots and moving averages live in the ``TrainState`` next to the
variables they belong to, named ``<variable>/<owner>/<slot>`` and
``<variable>/<owner>`` ("w/Adam/m", "w/ExponentialMovingAverage"), so checkpoints
hold them. :func:`trainable_variables` (what ``var_list=None`` means) is every
floating-point entry that is neither such an auxiliary entry nor marked
``trainable=False`` on the state.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Final

from ..._core._backend import array_module, is_device_array
from ..._core._state import TrainState
from ._types import Array

__all__ = [
    "NON_SLOT_SUFFIXES",
    "check_trainable",
    "check_var_list",
    "describe",
    "ensure_entry",
    "lookup_variable",
    "trainable_variables",
]

#: Last name components of the optimizers' per-optimizer (non-slot) entries, such
#: as Adam's ``"Adam/beta1_power"``; 0-d entries named so are never variables.
NON_SLOT_SUFFIXES: Final = frozenset({"beta1_power", "beta2_power"})


def trainable_variables(state: TrainState) -> list[str]:
    """Names of the state's model variables, in the state's order.

    These are the floating-point entries except entries marked
    ``trainable=False`` (TF1's non-trainable variables: ``TrainState(...,
    non_trainable=[...])``, ``state.add(name, value, trainable=False)``) and
    auxiliary ones: an entry whose name extends another entry's name
    (``"w/Adam/m"`` next to ``"w"``: a slot or a moving average) and optimizers'
    0-d non-slot entries (``"Adam/beta1_power"``).
    """
    present = set(state)
    skip = state.non_trainable
    names = []
    for name in state:
        value = state[name]
        if value.dtype.kind != "f" or name in skip:
            continue
        parts = name.split("/")
        if any("/".join(parts[:i]) in present for i in range(1, len(parts))):
            continue
        if len(parts) > 1 and parts[-1] in NON_SLOT_SUFFIXES and value.ndim == 0:
            continue
        names.append(name)
    return names


def check_var_list(var_list: Iterable[str], what: str) -> list[str]:
    """``var_list`` as a list of names, refusing a bare string and duplicates."""
    if isinstance(var_list, str):
        raise TypeError(f"{what}: var_list must be a list of names, not the string {var_list!r}")
    names = list(var_list)
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: variable names must be strings, got {name!r}")
        if name in seen:
            raise ValueError(f"{what}: variable {name!r} is listed twice")
        seen.add(name)
    return names


def check_trainable(state: TrainState, name: str, what: str) -> None:
    """Refuse to train entry ``name`` when it is marked ``trainable=False``."""
    if name in state.non_trainable:
        raise ValueError(
            f"{what}: TrainState entry {name!r} is marked trainable=False, so optimizers do "
            "not update it; leave it out of the gradients and var_list, or mark it with "
            f"state.set_trainable({name!r}, True) before the session is created"
        )


def lookup_variable(state: TrainState, name: str, what: str) -> Array:
    """``state[name]``, which must exist and be floating point."""
    if name not in state:
        close = difflib.get_close_matches(name, list(state), n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise KeyError(f"{what}: the TrainState has no variable {name!r}{hint}")
    value = state[name]
    if value.dtype.kind != "f":
        raise TypeError(
            f"{what}: variable {name!r} is {describe(value)}; only floating-point "
            "variables (float16, float32, float64) can be trained or averaged"
        )
    # CuPy's flags have no ``writeable`` (its arrays are always writable).
    if not is_device_array(value) and not value.flags.writeable:
        raise ValueError(
            f"{what}: variable {name!r} is a read-only array (a broadcast or a view of "
            "read-only memory); updates are in place, so store a writable copy "
            f"(state[{name!r}] = state[{name!r}].copy())"
        )
    return value


def ensure_entry(
    state: TrainState,
    key: str,
    like: Array,
    fill: float | None,
    owner: str,
    how_to_create: str,
) -> None:
    """Create entry ``key`` shaped like ``like`` unless it exists already.

    ``fill=None`` copies ``like``, a number fills with it. An existing entry is
    kept (a resumed run restores it) but must have ``like``'s shape, dtype and
    array module. On a finalized state a missing entry is an error that says to
    create it before the session, with ``how_to_create``.
    """
    if key in state:
        existing = state[key]
        if (
            existing.shape != like.shape
            or existing.dtype != like.dtype
            or (
                type(existing) is not type(like)
                and is_device_array(existing) != is_device_array(like)
            )
        ):
            raise ValueError(
                f"{owner}: TrainState entry {key!r} is {describe(existing)}, but it must be "
                f"{describe(like)}; is another entry using this name?"
            )
        return
    if state.finalized:
        raise RuntimeError(
            f"{owner}: TrainState entry {key!r} does not exist and the state is finalized "
            f"(the session was created), so it cannot be added now; {how_to_create} before "
            "the session is created, e.g. in Scaffold.init_fn"
        )
    xp = array_module(like)
    if fill is None:
        state[key] = like.copy(order="C")
    else:
        state[key] = xp.full(like.shape, fill, dtype=like.dtype)


def describe(value: Array) -> str:
    """``"numpy float32 (3, 4)"``: an array's module, dtype and shape, for messages."""
    where = "cupy" if is_device_array(value) else "numpy"
    return f"{where} {value.dtype} {tuple(value.shape)}"
