"""``TrainState``: everything a checkpoint must hold to resume bit for bit.

The named arrays (parameters, optimizer slots, moving averages), the global step
and the random number generator. Until the session is created hooks and init
functions may add entries; after ``after_create_session`` the set of names, and
each entry's shape, dtype and array module, is fixed (TF1 finalizes its graph at
the same point), so a checkpoint written later always matches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, final

import numpy as np

from ._backend import is_array, is_device_array

__all__ = ["TrainState"]


@final
class TrainState(MutableMapping[str, Any]):
    """Named NumPy or CuPy arrays, the global step and the RNG of one training run.

    ``state["w"] = new_w`` replaces an entry (in-place updates work too),
    ``state.global_step`` counts completed training steps and ``state.rng`` is a
    :class:`numpy.random.Generator` whose full state is saved with checkpoints.
    """

    __slots__ = ("_arrays", "_finalized", "global_step", "initialized", "rng")

    def __init__(
        self,
        arrays: Mapping[str, Any] | None = None,
        /,
        *,
        global_step: int = 0,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        if seed is not None and rng is not None:
            raise ValueError("TrainState: pass either seed or rng, not both")
        self._arrays: dict[str, Any] = {}
        self._finalized = False
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
        if not isinstance(name, str) or not name:
            raise TypeError(f"TrainState entry names must be non-empty strings, got {name!r}")
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

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    # -- lifecycle ------------------------------------------------------------------
    @property
    def finalized(self) -> bool:
        """Whether the set of entries is fixed (the session has been created)."""
        return self._finalized

    def finalize(self) -> None:
        """Fix the set of entries and their shapes, dtypes and array modules."""
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
        """The generator's complete state, JSON-serializable (for checkpoints)."""
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


def _describe(array: Any) -> str:
    where = "cupy" if is_device_array(array) else "numpy"
    return f"{where} {array.dtype} {tuple(array.shape)}"


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
