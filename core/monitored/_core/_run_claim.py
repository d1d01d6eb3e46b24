"""The session's side of run ownership: claim what its hooks write, before ``begin``.

The chief's session asks every hook for its ``run_directories`` once its hooks
are known and claims them all (:mod:`._ownership`) before any ``begin``, so a
second writer is refused before it restores or writes anything; the claims are
released when the session has closed (after its last save). A claim and a
release each sync a record to disk: they run in a worker thread, so that sessions
sharing an event loop open and close side by side instead of each waiting, loop
blocked, for the others' ``fsync``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ._errors import PluginError
from ._ownership import RunOwner, claim_runs

if TYPE_CHECKING:
    from ._calling import CallPlan

__all__ = ["claim_session_directories", "release_all", "release_all_off_loop"]


async def claim_session_directories(plan: CallPlan, session: Any) -> list[RunOwner]:
    """Claim the directories the session's hooks write to (``run_directories``)."""
    if not plan["run_directories"]:
        return []
    directories: list[str] = []
    for call, returned in await plan.call_each("run_directories", session):
        if returned is None:
            continue
        if isinstance(returned, str | os.PathLike) or not isinstance(returned, Sequence):
            raise PluginError(
                f"hook 'run_directories' of {call.info.describe()} returned "
                f"{type(returned).__name__}; it must return a list of directories or None",
                plugin=call.info.name,
                distribution=call.info.distribution,
                hook="run_directories",
            )
        directories.extend(os.fspath(d) for d in returned)
    if not directories:
        return []
    claim = functools.partial(claim_runs, directories, what=f"a session of process {os.getpid()}")
    # Shielded: claims made reach the session (which releases them when it closes),
    # even if the task opening it is cancelled meanwhile.
    with anyio.CancelScope(shield=True):
        owners: list[RunOwner] = await anyio.to_thread.run_sync(claim)
    return owners


def release_all(owners: Sequence[RunOwner]) -> None:
    """Release ``owners`` (the session's claims), each once."""
    for owner in owners:
        owner.release()


async def release_all_off_loop(owners: Sequence[RunOwner]) -> None:
    """:func:`release_all` in a worker thread, shielded from cancellation."""
    if not owners:
        return
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(release_all, owners)
