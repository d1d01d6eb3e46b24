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

A signal that stops the trials' sessions (Ctrl-C or SIGTERM, with
``monitored-checkpoint`` handling it: each session saves a checkpoint and
closes normally, so its objective returns) ends the search, as
``KeyboardInterrupt`` ends Optuna's ``study.optimize``: no trial starts after
it, and the value the interrupted objectives return is not taken for a
result. After SIGINT the running trials are told ``FAIL`` and queued again
(``WAITING``, with their parameters: Optuna's retry, see :mod:`._retry`), so
the next ``optimize`` on the study resumes them from their checkpoints, and
``optimize`` raises ``KeyboardInterrupt``; after SIGTERM (a preemption: the
job is meant to come back) they are left ``RUNNING``, marked with the user
attribute ``preempted_by``, to be resumed from their checkpoints with
:func:`resume_trial` (or, on a storage with heartbeats, retried once they
are stale), and ``optimize`` returns, as a preempted session does.

On a storage with heartbeats (an ``RDBStorage`` made with
``heartbeat_interval``) each running trial records its heartbeat from a
thread, and the stale trials of the study (their process died) are failed and
handed to the storage's retry callback before each new trial, as Optuna's own
``study.optimize`` does.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import time
import types
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ._errors import OptunaConfigError
from ._retry import (
    FAILED_TRIAL_ATTR,
    Heartbeat,
    ask,
    fail_stale_trials,
    heartbeat_interval,
    retry,
    system_attrs,
)
from ._trial import _stop_signals, _trial

if TYPE_CHECKING:
    import optuna
    from optuna.trial import TrialState

    Objective = Callable[[optuna.trial.Trial], Awaitable[float | Sequence[float]]]
    Callback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]

__all__ = ["optimize", "resume_trial"]

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
            is raised from ``optimize`` as itself, as from Optuna's
            ``study.optimize``, never wrapped in an ``ExceptionGroup``: when
            several trials failed at once, the first failure is raised and the
            others are named in its notes (``exc.__notes__``).
        callbacks: called as ``callback(study, frozen_trial)`` after each trial
            is told, in the event loop (Optuna's ``optimize`` callbacks).

    Raises:
        TypeError: ``objective`` is a synchronous function (``def``, not
            ``async def``: refused before any trial), or it returned something
            that is not awaitable, or its value is itself awaitable (an
            ``await`` forgotten in it).
        KeyboardInterrupt: Ctrl-C stopped the trials' sessions (they saved
            their checkpoints; the running trials are told ``FAIL`` and queued
            again, for the next ``optimize`` to resume).
    """
    import optuna  # here: importing this plugin does not import Optuna

    if not isinstance(study, optuna.Study):
        raise OptunaConfigError(f"optimize: study must be an optuna.Study, got {study!r}")
    if not callable(objective):
        raise OptunaConfigError(f"optimize: objective must be an async function, got {objective!r}")
    if _is_synchronous_def(objective):
        raise TypeError(
            f"optimize: objective must be an async function (async def ...) taking a trial; "
            f"{_name_of(objective)} is a synchronous function. Use Optuna's study.optimize for "
            "a synchronous objective; a function that returns a coroutine is written "
            "`async def objective(trial): return await train(trial)`"
        )
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
    run = _Run(study, objective, caught, list(callbacks))
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    started = 0

    async def worker() -> None:
        nonlocal started
        while started < n_trials and time.monotonic() < deadline and not run.ended:
            started += 1
            await _run_trial(run)

    chosen: BaseException | None = None
    try:
        async with anyio.create_task_group() as group:
            for _ in range(min(concurrency, n_trials)):
                group.start_soon(worker)
    except BaseExceptionGroup as failed:
        chosen = _one_of(failed, run.failures)
    if chosen is not None:
        # Raised here, outside the ``except``: the exception keeps its own cause and
        # context (a storage's StorageInternalError keeps the database error under it),
        # and the group it came in is not chained to it.
        raise chosen
    if run.signal == "SIGINT":
        log.warning(
            "optimize: interrupted (SIGINT); trial(s) %s told FAIL with their checkpoints "
            "saved, and queued again (WAITING, with their parameters): the next optimize on "
            "this study resumes them from their checkpoints (kept under "
            "monitored_optuna.original_trial_number(trial)); no further trial started",
            sorted(run.stopped),
        )
        raise KeyboardInterrupt
    if run.signal is not None:
        log.warning(
            "optimize: stopped by %s; trial(s) %s left RUNNING with their checkpoints, to be "
            "resumed with monitored_optuna.resume_trial(study, number); no further trial started",
            run.signal,
            sorted(run.stopped),
        )


@dataclass
class _Run:
    """One ``optimize`` call: its arguments, and what its trials met so far."""

    study: optuna.Study
    objective: Objective
    catch: tuple[type[Exception], ...]
    callbacks: list[Callback]
    #: The signal that stopped trials' sessions ("SIGINT", "SIGTERM"), if one did.
    signal: str | None = None
    #: The numbers of the trials it stopped.
    stopped: list[int] = field(default_factory=list)
    #: The trials' failures (not cancellations), in the order they happened.
    failures: list[BaseException] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        """Whether no trial is to start: a signal stopped trials, or one failed."""
        return self.signal is not None or bool(self.failures)


async def _run_trial(run: _Run) -> None:
    from optuna.trial import TrialState

    study = run.study
    trial = await anyio.to_thread.run_sync(_ask, study)
    if run.ended:
        # The search ended while this trial was being asked for: it never ran.
        with anyio.CancelScope(shield=True):
            await _tell(study, trial, None, TrialState.FAIL, run.callbacks)
            if FAILED_TRIAL_ATTR in await anyio.to_thread.run_sync(system_attrs, trial):
                # A retry taken from the queue: back into it, not lost.
                await anyio.to_thread.run_sync(retry, study, trial._trial_id)
        return
    interval = heartbeat_interval(study._storage)
    heartbeat = None
    if interval is not None:
        heartbeat = Heartbeat(study._storage, trial._trial_id, trial.number, interval)
        heartbeat.start()
    try:
        await _run_asked_trial(run, trial)
    finally:
        if heartbeat is not None:
            # No join: a beat in flight after the tell does no harm, and the loop
            # does not wait on the database here.
            heartbeat.stop()


def _ask(study: optuna.Study) -> optuna.trial.Trial:
    """The next trial, after failing (and retrying) the stale ones, as Optuna's optimize does."""
    fail_stale_trials(study)
    return ask(study)


async def _run_asked_trial(run: _Run, trial: optuna.trial.Trial) -> None:
    import optuna
    from optuna.trial import TrialState

    study, catch, callbacks = run.study, run.catch, run.callbacks
    token = _trial.set(trial)
    signals: list[str] = []
    signals_token = _stop_signals.set(signals)
    try:
        returned = run.objective(trial)
        if not inspect.isawaitable(returned):
            raise TypeError(
                f"optimize: objective must be an async function (its result is awaited), but "
                f"{_name_of(run.objective)} returned {type(returned).__name__} for trial "
                f"{trial.number}; use Optuna's study.optimize for a synchronous objective"
            )
        value = await returned
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited on purpose: no "never awaited" warning
            raise TypeError(
                f"optimize: the objective returned {type(value).__name__} {value!r} for trial "
                f"{trial.number}, which is awaitable, not a value: did you forget `await` "
                "in the objective?"
            )
    except optuna.TrialPruned as pruned:
        log.info("Trial %d pruned: %s", trial.number, pruned)
        await _tell(study, trial, None, TrialState.PRUNED, callbacks)
        return
    except catch as exc:
        if signals:
            await _stopped_by_signal(run, trial, signals[0])
            return
        log.warning("Trial %d failed (caught, the study goes on): %r", trial.number, exc)
        await _tell(study, trial, None, TrialState.FAIL, callbacks)
        return
    except BaseException as exc:
        # Failed, or cancelled because a trial beside it failed: either way the study
        # must not keep it RUNNING, and the exception goes on.
        if not isinstance(exc, anyio.get_cancelled_exc_class()):
            run.failures.append(exc)
        with anyio.CancelScope(shield=True):
            await _tell(study, trial, None, TrialState.FAIL, callbacks)
        raise
    finally:
        _stop_signals.reset(signals_token)
        _trial.reset(token)
    if signals:
        # Its sessions stopped cleanly on a signal, so the objective returned: the
        # value of a model trained part of the way, not the trial's result.
        await _stopped_by_signal(run, trial, signals[0])
        return
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


async def _stopped_by_signal(run: _Run, trial: optuna.trial.Trial, signal: str) -> None:
    """End ``trial``, whose sessions ``signal`` stopped: ``FAIL`` after SIGINT, else kept."""
    from optuna.trial import TrialState

    if run.signal is None:
        run.signal = signal
    run.stopped.append(trial.number)
    if signal == "SIGINT":
        log.warning("Trial %d interrupted (SIGINT): told FAIL, and queued again", trial.number)
        with anyio.CancelScope(shield=True):
            await _tell(run.study, trial, None, TrialState.FAIL, run.callbacks)
            await anyio.to_thread.run_sync(retry, run.study, trial._trial_id)
        return
    log.warning("Trial %d stopped by %s: left RUNNING, to be resumed", trial.number, signal)
    await anyio.to_thread.run_sync(trial.set_user_attr, "preempted_by", signal)


def _one_of(failed: BaseExceptionGroup[BaseException], order: list[BaseException]) -> BaseException:
    """The exception ``optimize`` raises for what its task group raised: one, never a group.

    A ``KeyboardInterrupt`` wins; otherwise the trial failure that came first,
    with the others (trials that failed at about the same time) in its notes.
    """
    leaves = _leaves(failed)
    for exc in leaves:
        if isinstance(exc, KeyboardInterrupt):
            return exc
    ranked = [exc for exc in order if exc in leaves] + [exc for exc in leaves if exc not in order]
    first, others = ranked[0], ranked[1:]
    if others:
        first.add_note(
            f"optimize: {len(others)} other trial(s) failed at the same time: "
            + "; ".join(f"{type(exc).__name__}: {exc}" for exc in others)
        )
    return first


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def _is_synchronous_def(objective: Callable[..., Any]) -> bool:
    """Whether ``objective`` is a plain ``def`` function (not a lambda, not ``async def``).

    Such a function computes its result when called, so ``optimize`` would run
    a whole trial before finding it is not awaitable. A lambda (which cannot be
    ``async``) may return a coroutine: it is checked on its first call.
    """
    while isinstance(objective, functools.partial):
        objective = objective.func
    return (
        isinstance(objective, types.FunctionType)
        and objective.__name__ != "<lambda>"
        and not inspect.iscoroutinefunction(objective)
        and not inspect.isasyncgenfunction(objective)
    )


def _name_of(objective: object) -> str:
    """The function's qualified name (a ``partial``'s function's), for error messages."""
    while isinstance(objective, functools.partial):
        objective = objective.func
    name = getattr(objective, "__qualname__", None)
    return name.rpartition("<locals>.")[2] if isinstance(name, str) else repr(objective)


def resume_trial(study: optuna.Study, number: int) -> optuna.trial.Trial:
    """The trial ``number`` of ``study``, to go on with: it must still be ``RUNNING``.

    For a trial stopped by a preemption (left ``RUNNING`` by :func:`optimize`,
    marked ``preempted_by``) or by a crash: run the objective on it again, with
    the same checkpoint directory, and tell the study its result. Its
    ``suggest_*`` calls return the parameters it had, and its sessions resume
    from its checkpoints. Raises :class:`~monitored_optuna.OptunaConfigError` for
    a number the study does not hold or a trial that has finished.
    """
    import optuna
    from optuna.trial import TrialState

    if not isinstance(study, optuna.Study):
        raise OptunaConfigError(f"resume_trial: study must be an optuna.Study, got {study!r}")
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not found:
        raise OptunaConfigError(
            f"resume_trial: study {study.study_name!r} has no trial {number!r} "
            f"(it holds {len(study.trials)} trial(s))"
        )
    frozen = found[0]
    if frozen.state != TrialState.RUNNING:
        raise OptunaConfigError(
            f"resume_trial: trial {number} of study {study.study_name!r} is "
            f"{frozen.state.name}, not RUNNING: only a trial that has not been told its result "
            "can go on (run a new trial with its params: study.enqueue_trial(trial.params))"
        )
    # Optuna's Trial is made from the storage's id of the trial, which its public
    # API hands out only as FrozenTrial._trial_id.
    return optuna.trial.Trial(study, frozen._trial_id)


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
