"""``optimize``: run an Optuna study's trials, several at once, in one event loop.

Optuna's ``study.optimize`` runs a synchronous objective, in threads for
``n_jobs > 1``. Training sessions are async: while one trial's step awaits its
device or its input, another trial's step can run in the same loop. This runs
``concurrency`` trials at once as tasks of one task group, each through
Optuna's ask/tell interface: ``study.ask()`` for a trial, the objective awaited
with that trial as the task's current trial (so the installed ``optuna`` plugin
reports to it), and ``study.tell`` with the state that fits: ``COMPLETE`` with
the value, ``PRUNED`` after ``optuna.TrialPruned``, ``FAIL`` after an exception
or a value that is not a number. The storage is called in worker threads, so
that a study in SQLite or on a server never holds up the loop.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ._errors import OptunaConfigError
from ._trial import _trial

if TYPE_CHECKING:
    import optuna
    from optuna.trial import TrialState

    Objective = Callable[[optuna.trial.Trial], Awaitable[float | Sequence[float]]]
    Callback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]

__all__ = ["optimize"]

log = logging.getLogger("monitored.optuna")


async def optimize(
    study: optuna.Study,
    objective: Objective,
    n_trials: int,
    *,
    concurrency: int = 1,
    timeout: float | None = None,  # noqa: ASYNC109 (Optuna's: no trial starts after it)
    catch: Iterable[type[Exception]] | type[Exception] = (),
    callbacks: Iterable[Callback] = (),
) -> None:
    """Run ``n_trials`` trials of ``study``, ``concurrency`` of them at once.

    Args:
        study: the study (any storage: in memory, SQLite, a journal file, a
            database server; several processes may work on one study).
        objective: an async function taking an ``optuna.trial.Trial`` and
            returning its value (a sequence of values for a multi-objective
            study). Raising ``optuna.TrialPruned`` (as a session pruned by
            ``OptunaPruningHook`` or the ``optuna`` plugin does) marks the
            trial pruned.
        n_trials: how many trials to run in all (each task takes the next
            until they are all started).
        concurrency: how many trials run at once in this event loop.
        timeout: start no trial after this many seconds (running ones finish).
        catch: exception classes that fail one trial only: it is told
            ``FAIL`` and the others go on. Any other exception fails its trial
            too, then cancels the trials running beside it (told ``FAIL``) and
            is raised from ``optimize``, as from Optuna's ``study.optimize``
            (an ``ExceptionGroup`` only when several trials failed at once).
        callbacks: called as ``callback(study, frozen_trial)`` after each trial
            is told, in the event loop (Optuna's ``optimize`` callbacks).
    """
    import optuna  # here: importing this plugin does not import Optuna

    if not isinstance(study, optuna.Study):
        raise OptunaConfigError(f"optimize: study must be an optuna.Study, got {study!r}")
    if not callable(objective):
        raise OptunaConfigError(f"optimize: objective must be an async function, got {objective!r}")
    for name, value, least in (("n_trials", n_trials, 0), ("concurrency", concurrency, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise OptunaConfigError(
                f"optimize: {name} must be an integer >= {least}, got {value!r}"
            )
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise OptunaConfigError(f"optimize: timeout must be a number > 0, got {timeout!r}")
    caught = (catch,) if isinstance(catch, type) else tuple(catch)
    if not all(isinstance(c, type) and issubclass(c, Exception) for c in caught):
        raise OptunaConfigError(f"optimize: catch must hold exception classes, got {catch!r}")
    listeners = list(callbacks)
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    started = 0

    async def worker() -> None:
        nonlocal started
        while started < n_trials and time.monotonic() < deadline:
            started += 1
            await _run_trial(study, objective, caught, listeners)

    try:
        async with anyio.create_task_group() as group:
            for _ in range(min(concurrency, n_trials)):
                group.start_soon(worker)
    except BaseExceptionGroup as failed:
        # One trial failed (the others were cancelled, not failed): its exception, as
        # Optuna's study.optimize raises it. Several at once stay a group.
        if len(failed.exceptions) == 1:
            raise failed.exceptions[0] from None
        raise


async def _run_trial(
    study: optuna.Study,
    objective: Objective,
    catch: tuple[type[Exception], ...],
    callbacks: list[Callback],
) -> None:
    import optuna
    from optuna.trial import TrialState

    trial = await anyio.to_thread.run_sync(study.ask)
    token = _trial.set(trial)
    try:
        returned = objective(trial)
        if not inspect.isawaitable(returned):
            raise OptunaConfigError(
                f"optimize: objective must be an async function (its result is awaited), but "
                f"it returned {type(returned).__name__} for trial {trial.number}; use Optuna's "
                "study.optimize for a synchronous objective"
            )
        value = await returned
    except optuna.TrialPruned as pruned:
        log.info("Trial %d pruned: %s", trial.number, pruned)
        await _tell(study, trial, None, TrialState.PRUNED, callbacks)
        return
    except catch as exc:
        log.warning("Trial %d failed (caught, the study goes on): %r", trial.number, exc)
        await _tell(study, trial, None, TrialState.FAIL, callbacks)
        return
    except BaseException:
        # Failed, or cancelled because a trial beside it failed: either way the study
        # must not keep it RUNNING, and the exception goes on.
        with anyio.CancelScope(shield=True):
            await _tell(study, trial, None, TrialState.FAIL, callbacks)
        raise
    finally:
        _trial.reset(token)
    values = _values_of(value, len(study.directions))
    if values is None:
        log.warning(
            "Trial %d failed: the objective returned %r, not %s finite number(s)",
            trial.number,
            value,
            len(study.directions),
        )
        await _tell(study, trial, None, TrialState.FAIL, callbacks)
        return
    log.info("Trial %d finished with value(s) %s", trial.number, values)
    await _tell(study, trial, values, TrialState.COMPLETE, callbacks)


async def _tell(
    study: optuna.Study,
    trial: optuna.trial.Trial,
    values: list[float] | None,
    state: TrialState,
    callbacks: list[Callback],
) -> None:
    frozen = await anyio.to_thread.run_sync(
        lambda: study.tell(trial, values, state=state, skip_if_finished=True)
    )
    for callback in callbacks:
        callback(study, frozen)


def _values_of(value: Any, n: int) -> list[float] | None:
    """``value`` as ``n`` finite floats, or ``None`` if it is not that."""
    items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    try:
        floats = [float(item) for item in items]
    except (TypeError, ValueError):
        return None
    if len(floats) != n or not all(math.isfinite(f) for f in floats):
        return None
    return floats
