"""Resolving hooks' fetch structures into host values, in one batched transfer.

Each hook names what it wants (step outputs or state entries, in any nesting of
lists, tuples and dicts). All requests of a step are flattened into one list of
distinct names, looked up, moved to the host together by
:func:`~monitored._backend.to_host`, and rebuilt into each hook's own structure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, final

import numpy as np

from ._backend import to_host
from ._errors import FetchError
from ._state import TrainState

__all__ = ["GLOBAL_STEP", "OptionalFetch", "fetch_many", "leaves", "optional"]

#: The fetch name of the global step (unless a step output or entry is so named).
GLOBAL_STEP = "global_step"


@final
class OptionalFetch(str):
    """A fetch name that may be missing: the hook then receives ``None`` for it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"optional({str(self)!r})"


def optional(name: str) -> OptionalFetch:
    """Mark fetch ``name`` as optional: ``None`` when neither output nor state entry exists.

    For installed plugins, which cannot know every script's outputs:
    ``SessionRunArgs({"loss": monitored.optional("loss")})`` watches the loss where a
    step returns one and receives ``None`` elsewhere, instead of a ``FetchError``.
    """
    if not isinstance(name, str):
        raise TypeError(f"optional() takes a fetch name (a str), got {type(name).__name__}")
    return OptionalFetch(name)


def leaves(fetches: Any, describe: Callable[[], str]) -> Iterator[str]:
    """The names in a fetch structure, depth first; ``describe`` names the asker."""
    if isinstance(fetches, str):
        yield fetches
    elif isinstance(fetches, Mapping):
        for value in fetches.values():
            yield from leaves(value, describe)
    elif isinstance(fetches, list | tuple):
        for value in fetches:
            yield from leaves(value, describe)
    else:
        raise TypeError(
            f"{describe()} asked to fetch {fetches!r} ({type(fetches).__name__}); fetches "
            "are names of step outputs or state entries, in lists, tuples or dicts"
        )


def _rebuild(fetches: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(fetches, str):
        return values[fetches]
    if isinstance(fetches, Mapping):
        return {key: _rebuild(value, values) for key, value in fetches.items()}
    if isinstance(fetches, tuple) and hasattr(fetches, "_make"):  # a namedtuple
        return fetches._make(_rebuild(v, values) for v in fetches)
    rebuilt = [_rebuild(value, values) for value in fetches]
    return tuple(rebuilt) if isinstance(fetches, tuple) else rebuilt


def lookup(name: str, outputs: Mapping[str, Any], state: TrainState) -> Any:
    """The value called ``name``: a step output first, then a state entry."""
    if name in outputs:
        return outputs[name]
    if name in state:
        return state[name]
    if name == GLOBAL_STEP:
        return np.int64(state.global_step)
    raise KeyError(name)


def fetch_many(
    requests: Sequence[tuple[Any, Callable[[], str]]],
    outputs: Mapping[str, Any],
    state: TrainState,
) -> list[Any]:
    """Resolve each ``(fetches, describe)`` request; one host transfer for all."""
    names: dict[str, None] = {}
    for fetches, describe in requests:
        for name in leaves(fetches, describe):
            names[name] = None
    found: list[str] = []
    values = []
    for name in names:
        try:
            values.append(lookup(name, outputs, state))
        except KeyError:
            name = str(name)  # the plain name, for the message
            required = [d() for f, d in requests for leaf in leaves(f, d) if _requires(leaf, name)]
            if required:
                raise FetchError(
                    f"{', '.join(dict.fromkeys(required))} asked to fetch {name!r} at step "
                    f"{state.global_step}, but the step returned outputs {sorted(outputs)} and "
                    f"the state has entries {sorted(state)} (monitored.optional({name!r}) "
                    "accepts a missing value as None)"
                ) from None
            continue
        found.append(name)
    host: dict[str, Any] = dict.fromkeys(names)
    host.update(zip(found, to_host(values), strict=True))
    return [_rebuild(fetches, host) for fetches, _ in requests]


def _requires(leaf: str, name: str) -> bool:
    """Whether fetch ``leaf`` is ``name`` asked for without :func:`optional`."""
    return leaf == name and type(leaf) is not OptionalFetch
