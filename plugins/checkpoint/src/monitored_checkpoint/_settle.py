"""A consistent view of a directory that a live trainer is writing and rotating.

``monitored checkpoint ls`` and ``verify`` read a directory entry by entry: beside
a trainer that saves every step and keeps two checkpoints, a manifest listed a
moment ago may be rotated away before its data file is sized, and a data file
may be renamed into place a moment before its manifest. Taken at face value,
that is "damage" on a healthy directory.

So a read is trusted only if the directory did not change while it ran: the
names and stamps (inode, size, times) of its entries are taken before and
after. A read that found a problem while the directory changed is retried, a
few times, with growing pauses (at most :data:`SETTLE_SECS` in all). If the
directory never holds still (a writer saving back to back), the last read is
kept, and each problem that names a file that changed during it is reported as
"being written", not as damage; a problem about files that held still is real.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar, final

from ._saver import STATE_FILENAME
from ._store import Store

__all__ = ["SETTLE_SECS", "Settled", "settle"]

T = TypeVar("T")

#: How long, in all, reads of a changing directory are retried.
SETTLE_SECS: Final = 3.0
_FIRST_PAUSE: Final = 0.02


def _fingerprint(store: Store) -> dict[str, tuple[object, ...] | None]:
    return {name: store.stamp(name) for name in store.list() if not name.startswith(".")}


@final
@dataclass(frozen=True, slots=True)
class Settled:
    """A read's result, and the entries that changed during it (empty when it held still)."""

    changed: frozenset[str]
    reads: int

    def in_flux(self, problem: str) -> bool:
        """Whether ``problem`` names a file that changed while it was read."""
        return any(_names(problem, name) for name in self.changed)


def _names(problem: str, name: str) -> bool:
    """Whether ``problem`` names the file ``name`` or the checkpoint it belongs to."""
    if name == STATE_FILENAME:  # "checkpoint" is a word of many messages: its path only
        return any(f"/{name}{end}" in problem for end in (" ", ":", ")")) or problem.startswith(
            f"{name} "
        )
    stem = name.split(".safetensors")[0].split(".json")[0]
    return name in problem or (stem != name and _word(problem, stem))


def _word(text: str, stem: str) -> bool:
    start = text.find(stem)
    while start >= 0:
        end = start + len(stem)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before in "-_") and not after.isdigit():
            return True
        start = text.find(stem, end)
    return False


def settle(
    store: Store,
    read: Callable[[], T],
    problems: Callable[[T], Sequence[str]],
    *,
    budget: float = SETTLE_SECS,
) -> tuple[T, Settled]:
    """``read()`` of ``store``'s directory, retried while it found problems and the
    directory changed during it; with what changed during the last read."""
    deadline = time.monotonic() + budget
    pause = _FIRST_PAUSE
    reads = 0
    while True:
        before = _fingerprint(store)
        result = read()
        after = _fingerprint(store)
        reads += 1
        changed = frozenset(
            name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
        )
        if not changed or not problems(result) or time.monotonic() + pause > deadline:
            return result, Settled(changed, reads)
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
