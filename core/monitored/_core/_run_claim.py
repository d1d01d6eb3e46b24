"""The session's side of run ownership: claim what its hooks write, before ``begin``.

The chief's session asks every hook for its ``run_directories`` once its hooks
are known and claims them all (:mod:`._ownership`) before any ``begin``, so a
second writer is refused before it restores or writes anything; the claims are
released when the session has closed (after its last save).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._errors import PluginError
from ._ownership import RunOwner, claim_runs

if TYPE_CHECKING:
    from ._calling import CallPlan

__all__ = ["claim_session_directories", "release_all"]


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
    return claim_runs(directories, what=f"a session of process {os.getpid()}")


def release_all(owners: Sequence[RunOwner]) -> None:
    """Release ``owners`` (the session's claims), each once."""
    for owner in owners:
        owner.release()
