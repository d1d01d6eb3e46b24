"""``Scaffold`` and ``SessionManager``: how the state is made ready.

The chief restores the state (from a checkpoint given to the session manager,
else through the ``restore_state`` hook a checkpoint plugin implements) or, when
nothing is restored, initializes it with the scaffold's ``init_fn``; then, as
TF1 does, it runs ``local_init_fn`` once ``ready_for_local_init_fn`` says the
state allows it, and checks the state with ``ready_fn``. A worker waits until
the chief has made the state ready, up to ``max_wait_secs``.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, final

import anyio

from ._capabilities import find_provider
from ._errors import DeadlineExceededError
from ._printable import printable
from ._state import TrainState

if TYPE_CHECKING:
    from ._session import MonitoredSession

__all__ = ["Saver", "Scaffold", "SessionManager"]

log = logging.getLogger("monitored")

StateFn = Callable[["TrainState"], Any]

_UNSET: Any = object()


class Saver(Protocol):
    """What a session manager restores checkpoints with.

    ``restore(state, path)`` fills ``state`` from the checkpoint at ``path`` (it may
    be async); ``latest_checkpoint(checkpoint_dir)``, when the saver has it, names
    the newest checkpoint in a directory (otherwise the installed provider of
    ``"checkpoint"`` is asked, through its ``latest_checkpoint`` hook).
    """

    def restore(self, state: TrainState, save_path: str) -> Any: ...


@final
class Scaffold:
    """The functions that initialize a state and tell whether it is ready.

    ``init_fn(state)`` fills a fresh state (runs on the chief when nothing was
    restored); ``ready_fn(state)`` returns ``None`` when the state is ready or a
    message saying what is missing; ``local_init_fn(state)`` runs on every
    process each time its session is created, once
    ``ready_for_local_init_fn(state)`` (same convention as ``ready_fn``) allows
    it. Each may be ``async``. ``copy_from_scaffold`` starts from another
    scaffold's functions; the ones given here replace them.
    """

    __slots__ = ("init_fn", "local_init_fn", "ready_fn", "ready_for_local_init_fn")

    def __init__(
        self,
        init_fn: StateFn | None = _UNSET,
        ready_fn: Callable[[TrainState], Any] | None = _UNSET,
        local_init_fn: StateFn | None = _UNSET,
        ready_for_local_init_fn: Callable[[TrainState], Any] | None = _UNSET,
        *,
        copy_from_scaffold: Scaffold | None = None,
    ) -> None:
        if copy_from_scaffold is not None and not isinstance(copy_from_scaffold, Scaffold):
            kind = type(copy_from_scaffold).__name__
            raise TypeError(f"copy_from_scaffold is not a Scaffold instance: {kind}")

        def pick(given: Any, name: str) -> Any:
            if given is not _UNSET:
                return given
            return None if copy_from_scaffold is None else getattr(copy_from_scaffold, name)

        self.init_fn: StateFn | None = pick(init_fn, "init_fn")
        self.ready_fn: Callable[[TrainState], Any] | None = pick(ready_fn, "ready_fn")
        self.local_init_fn: StateFn | None = pick(local_init_fn, "local_init_fn")
        self.ready_for_local_init_fn: Callable[[TrainState], Any] | None = pick(
            ready_for_local_init_fn, "ready_for_local_init_fn"
        )

    async def not_ready(self, state: TrainState) -> str | None:
        """``None`` if ``state`` is ready, else why it is not."""
        if not state.initialized:
            return "the chief has not initialized or restored the state yet"
        return await _message(self.ready_fn, state)

    async def not_ready_for_local_init(self, state: TrainState) -> str | None:
        """``None`` if ``local_init_fn`` may run on ``state``, else why not."""
        return await _message(self.ready_for_local_init_fn, state)


@final
class SessionManager:
    """Prepares the state on the chief, waits for it on workers.

    ``saver`` with ``checkpoint_dir`` or ``checkpoint_filename_with_path`` makes
    every session this manager creates restore that checkpoint (TF1's
    ``ChiefSessionCreator`` arguments); without them the chief asks the
    ``restore_state`` hook.
    """

    __slots__ = (
        "checkpoint_dir",
        "checkpoint_filename_with_path",
        "recovery_wait_secs",
        "saver",
        "scaffold",
    )

    def __init__(
        self,
        scaffold: Scaffold | None = None,
        recovery_wait_secs: float = 30,
        *,
        saver: Saver | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_filename_with_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.scaffold = scaffold or Scaffold()
        scaffold = self.scaffold
        if scaffold.ready_for_local_init_fn is not None and scaffold.local_init_fn is None:
            raise ValueError(
                "If you pass a ready_for_local_init_fn you must also pass a local_init_fn"
            )
        _check_one_checkpoint(checkpoint_dir, checkpoint_filename_with_path)
        self.recovery_wait_secs = recovery_wait_secs
        self.saver = saver
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_filename_with_path = checkpoint_filename_with_path

    async def prepare_session(
        self,
        target: MonitoredSession | TrainState,
        *,
        recreating: bool = False,
        saver: Saver | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_filename_with_path: str | os.PathLike[str] | None = None,
        wait_for_checkpoint: bool = False,
        max_wait_secs: float = 7200,
    ) -> Any:
        """Restore or initialize the state on the chief; return what was restored.

        ``target`` is a session (its ``restore_state`` hook may restore) or a bare
        :class:`~monitored.TrainState`. When the session is re-created after an
        ``AbortedError`` and nothing can be restored, the state in memory is kept
        (TF1 would re-initialize it and lose the progress made since the start).
        """
        state = _state_of(target)
        restored = await self._restore(
            target,
            saver,
            checkpoint_dir,
            checkpoint_filename_with_path,
            wait_for_checkpoint,
            max_wait_secs,
        )
        scaffold = self.scaffold
        if restored is None and not recreating and scaffold.init_fn is not None:
            await _maybe_await(scaffold.init_fn(state))
        state.initialized = True
        message = await self._local_init(state)
        if message is not None:
            raise RuntimeError(
                f"Init operations did not make model ready for local_init: {message}"
            )
        message = await scaffold.not_ready(state)
        if message is not None:
            if restored is None and scaffold.init_fn is None and scaffold.local_init_fn is None:
                raise RuntimeError(
                    "The state is not ready, no checkpoint was restored and no init_fn or "
                    f"local_init_fn was given: {message}"
                )
            raise RuntimeError(f"Init operations did not make model ready: {message}")
        return restored

    async def recover_session(
        self,
        target: MonitoredSession | TrainState,
        *,
        saver: Saver | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_filename_with_path: str | os.PathLike[str] | None = None,
        wait_for_checkpoint: bool = False,
        max_wait_secs: float = 7200,
    ) -> tuple[Any, bool]:
        """Restore the state if a checkpoint allows it; never initialize it.

        Returns ``(restored_from, ready)``: ``ready`` is true when a checkpoint was
        restored and the state is then ready. ``local_init_fn`` runs whether or not
        anything was restored (as in TF1), when ``ready_for_local_init_fn`` allows.
        """
        state = _state_of(target)
        restored = await self._restore(
            target,
            saver,
            checkpoint_dir,
            checkpoint_filename_with_path,
            wait_for_checkpoint,
            max_wait_secs,
        )
        local_message = await self._local_init(state)
        if restored is None:
            return None, False
        if local_message is not None:
            log.info(
                "Restoring the state from %s did not make it ready for local init: %s",
                printable(restored),
                local_message,
            )
            return restored, False
        state.initialized = True
        message = await self.scaffold.not_ready(state)
        if message is not None:
            state.initialized = False
            log.info(
                "Restoring the state from %s did not make it ready: %s",
                printable(restored),
                message,
            )
            return restored, False
        log.info("Restored the state from %s", printable(restored))
        return restored, True

    async def wait_for_session(
        self, target: MonitoredSession | TrainState, max_wait_secs: float
    ) -> None:
        """On a worker: wait until the chief has made the state ready.

        Each try runs ``local_init_fn`` once the chief has initialized the state
        and ``ready_for_local_init_fn`` allows, then checks ``ready_fn``.
        """
        state = _state_of(target)
        deadline = time.monotonic() + max_wait_secs
        warned = False
        while True:
            if not state.initialized:
                message = await self.scaffold.not_ready(state)
            else:
                message = await self._local_init(state)
                if message is None:
                    message = await self.scaffold.not_ready(state)
            if message is None:
                return
            if not warned:
                log.warning("Worker waiting for the chief (up to %gs): %s", max_wait_secs, message)
                warned = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceededError(
                    f"Session was not ready after waiting {max_wait_secs} secs (worker waited "
                    f"{max_wait_secs}s for the chief); the state is not ready: {message}"
                )
            log.info("Waiting for the chief: %s; sleeping %.1fs", message, self.recovery_wait_secs)
            await anyio.sleep(min(self.recovery_wait_secs, remaining))

    async def _local_init(self, state: TrainState) -> str | None:
        """Run ``local_init_fn`` if the state is ready for it; else say why not."""
        if self.scaffold.local_init_fn is None:
            return None
        message = await self.scaffold.not_ready_for_local_init(state)
        if message is not None:
            return message
        await _maybe_await(self.scaffold.local_init_fn(state))
        return None

    async def _restore(
        self,
        target: MonitoredSession | TrainState,
        saver: Saver | None,
        checkpoint_dir: str | os.PathLike[str] | None,
        path: str | os.PathLike[str] | None,
        wait_for_checkpoint: bool,
        max_wait_secs: float,
    ) -> Any:
        """Restore from the given checkpoint (or the manager's); else the restore hook."""
        _check_one_checkpoint(checkpoint_dir, path)
        if checkpoint_dir is None and path is None:
            checkpoint_dir, path = self.checkpoint_dir, self.checkpoint_filename_with_path
        saver = saver if saver is not None else self.saver
        state = _state_of(target)
        if saver is None or (checkpoint_dir is None and path is None):
            if isinstance(target, TrainState):
                return None
            return await target.call_first("restore_state", target)
        if path is None:
            assert checkpoint_dir is not None
            deadline = time.monotonic() + max_wait_secs
            while (path := _latest_checkpoint(saver, checkpoint_dir)) is None:
                remaining = deadline - time.monotonic()
                if not wait_for_checkpoint or remaining <= 0:
                    return None
                log.info("Waiting for a checkpoint in %s", printable(checkpoint_dir))
                await anyio.sleep(min(self.recovery_wait_secs, remaining))
        await _maybe_await(saver.restore(state, os.fspath(path)))
        return os.fspath(path)


def _check_one_checkpoint(checkpoint_dir: object, path: object) -> None:
    if checkpoint_dir is not None and path is not None:
        raise ValueError("Can not provide both checkpoint_dir and checkpoint_filename_with_path.")


def _latest_checkpoint(saver: Saver, checkpoint_dir: str | os.PathLike[str]) -> str | None:
    finder: Callable[[str | os.PathLike[str]], Any] | None = getattr(
        saver, "latest_checkpoint", None
    )
    if finder is None:
        checkpoints = find_provider("checkpoint")
        if checkpoints is None:
            raise TypeError(
                f"saver {type(saver).__name__} has no latest_checkpoint(checkpoint_dir) and "
                "no installed plugin provides 'checkpoint' (pip install monitored-checkpoint): "
                "pass checkpoint_filename_with_path"
            )
        found = checkpoints.call("latest_checkpoint", checkpoint_dir=os.fspath(checkpoint_dir))
    else:
        found = finder(checkpoint_dir)
    return None if found is None else str(found)


def _state_of(target: MonitoredSession | TrainState) -> TrainState:
    return target if isinstance(target, TrainState) else target.state


async def _message(check: Callable[[TrainState], Any] | None, state: TrainState) -> str | None:
    if check is None:
        return None
    message = await _maybe_await(check(state))
    return None if message is None else str(message)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
