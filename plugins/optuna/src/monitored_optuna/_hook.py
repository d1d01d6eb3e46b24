"""``OptunaPruningHook``: report a watched value to an Optuna trial and prune it.

The value is an evaluation result (the ``after_evaluate`` hook: ``EvaluationHook``,
``train_and_evaluate``) or, with ``every_n_steps=N``, a step output or state
entry fetched every ``N`` global steps. Each value is reported with
``trial.report(value, step)`` at the global step it belongs to; when
``trial.should_prune()`` says so, the hook stops the session through its one
stop decision and asks it to raise ``optuna.TrialPruned`` once it has closed:
the last step's checkpoint and summaries are written and ``end`` runs, as
after any other stop, and then the objective sees the same exception Optuna's
own integrations raise.

On steps where nothing is due the session does not call the hook at all
(``MonitoredSession.skip_step_hooks``). Reports go to a storage outside the
process (SQLite, a journal file, a database server) in a worker thread, so
that they do not hold up the other trials running in the same event loop; an
in-memory study is reported to directly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard, final

import anyio.to_thread

from monitored import SessionRunArgs, optional, printable, to_scalar

from ._errors import MonitoredValueError, OptunaConfigError
from ._retry import retry_chain
from ._trial import check_trial, current_trial, note_session_closed

if TYPE_CHECKING:
    import optuna

    from monitored import (
        Coordinator,
        MonitoredSession,
        SessionRunContext,
        SessionRunValues,
        TrainState,
    )

__all__ = ["OptunaPruningHook"]

log = logging.getLogger("monitored.optuna")


class OptunaPruningHook:
    """Reports ``monitor`` to ``trial`` and prunes the trial when its pruner says so.

    Args:
        trial: the ``optuna.trial.Trial`` this session trains for (the
            objective's argument). ``None`` takes the current trial of the task
            when the session begins (the one :func:`~monitored_optuna.optimize`
            runs); with none there either, the hook does nothing.
        monitor: the evaluation metric (``every_n_steps=0``) or the step output
            or state entry (``every_n_steps > 0``) to report.
        every_n_steps: 0 (the default) reports each evaluation result as it is
            reported to the session; ``N`` fetches ``monitor`` after every
            ``N``-th global step (multiples of ``N``, so that a resumed run
            reports the same steps) and reports it.

    Only the chief reports (under ``mpiexec`` the other processes hold no
    trial); the prune reaches every process through the stop agreement. The
    hook's state (the last step reported, the step it pruned at) goes into
    checkpoints: a trial resumed from its checkpoint reports no step twice, and
    a pruned trial resumed stays pruned (the session stops before its first
    step and raises ``TrialPruned`` again). The state also names the trial it
    belongs to (study, number, parameters): a checkpoint of another trial (a
    directory left by an earlier study, another trial's directory) is refused
    with an :class:`~monitored_optuna.OptunaConfigError` before the first step,
    rather than trained on under the new trial's parameters.
    """

    #: 1 saved the steps only; 2 adds the trial's identity (``study``, ``trial``,
    #: ``params``). A version-1 state is read as is, with no identity to check.
    plugin_state_version = 2
    #: Passed in ``hooks=[...]``, it owns pruning: the installed ``optuna`` plugin
    #: (and its options) steps aside.
    provides: ClassVar[frozenset[str]] = frozenset({"pruning"})

    def __new__(
        cls,
        trial: optuna.trial.BaseTrial | None,
        monitor: str,
        *,
        every_n_steps: int = 0,
    ) -> OptunaPruningHook:
        # Watching evaluations, the hook has no per-step hooks at all, so the session
        # calls nothing of it on a step; watching a step output, it is one that does.
        steps = isinstance(every_n_steps, int) and not isinstance(every_n_steps, bool)
        kind = _StepPruningHook if steps and every_n_steps > 0 else OptunaPruningHook
        return object.__new__(kind)

    def __init__(
        self,
        trial: optuna.trial.BaseTrial | None,
        monitor: str,
        *,
        every_n_steps: int = 0,
    ) -> None:
        where = "OptunaPruningHook"
        if trial is not None:
            check_trial(trial, where)
        if not isinstance(monitor, str) or not monitor:
            raise OptunaConfigError(f"{where}: monitor must be a name, got {monitor!r}")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int):
            raise OptunaConfigError(
                f"{where}: every_n_steps must be an integer >= 0, got {every_n_steps!r}"
            )
        if every_n_steps < 0:
            raise OptunaConfigError(
                f"{where}: every_n_steps must be an integer >= 0, got {every_n_steps!r}"
            )
        self.monitor = monitor
        self.every_n_steps = every_n_steps
        #: Keys this hook's state in checkpoints.
        self.plugin_name = "optuna_pruning"
        self._trial = trial
        self._args = SessionRunArgs({monitor: optional(monitor)})
        self._active = False
        self._next_check = -1
        self._due = False
        self._state: TrainState | None = None
        #: The last global step reported to the trial (-1: none).
        self.last_reported_step = -1
        #: The global step at which the trial was pruned, if it was.
        self.pruned_step: int | None = None
        #: The trial the restored state was saved for (``None``: nothing restored, or
        #: a version-1 state, which does not say); checked once the session is created.
        self._restored_identity: dict[str, Any] | None = None

    @property
    def trial(self) -> optuna.trial.BaseTrial | None:
        """The trial reported to (known once the session has begun, for ``trial=None``)."""
        return self._trial

    @property
    def active(self) -> bool:
        """Whether this session reports: a trial is known and this process is the chief."""
        return self._active

    # -- hooks ----------------------------------------------------------------------------------
    def begin(self, session: MonitoredSession) -> None:
        if self._trial is None:
            self._trial = current_trial()
        self._active = self._trial is not None and session.is_chief
        if self._trial is None:
            log.debug("OptunaPruningHook: no trial in this task; nothing is reported")

    async def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        if not self._active:
            return
        retried = self._check_identity(session)
        if self.pruned_step is not None:
            # Restored from a checkpoint written after the prune: it stays pruned.
            coord.request_stop()
            session.raise_after_close(
                _pruned(
                    f"Trial {_number(self._trial)} was pruned at step {self.pruned_step} "
                    "(resumed from a checkpoint written after the prune)"
                )
            )
            return
        # Steps the trial holds already (reported after the checkpoint this run resumed
        # from, before a preemption) are not reported again.
        held = await anyio.to_thread.run_sync(_last_step_held, self._trial)
        if retried:
            # The checkpoint's steps were reported to the trial this one retries: this
            # trial holds only what it holds (inherited, or nothing).
            self.last_reported_step = held
        else:
            self.last_reported_step = max(self.last_reported_step, held)
        n = self.every_n_steps
        self._next_check = (session.state.global_step // n + 1) * n if n else -1
        self._state = session.state
        if n:
            # Nothing to do on the steps in between: the session does not call this hook.
            session.skip_step_hooks(self, self._next_check)

    def after_evaluate(
        self, session: MonitoredSession, step: int, metrics: Mapping[str, Any]
    ) -> Any:
        """Report ``metrics[monitor]`` for ``step`` (with ``every_n_steps=0``).

        A hook watching a step output ignores evaluation results, so a name that
        is both is never reported twice for one step.
        """
        if self.every_n_steps or not self._active:
            return None
        if self.monitor not in metrics:
            raise MonitoredValueError(
                f"OptunaPruningHook: monitor {self.monitor!r} is not among the evaluation "
                f"metrics {sorted(metrics)} reported for step {step}"
            )
        return self.report(session, step, self._scalar(metrics[self.monitor], step))

    def before_close(self, session: MonitoredSession) -> None:
        note_session_closed(session)

    def plugin_state(self) -> dict[str, Any] | None:
        if not self._active:
            return None
        return {
            "last_reported_step": self.last_reported_step,
            "pruned_step": self.pruned_step,
            **_identity(self._trial),
        }

    def load_plugin_state(self, state: Mapping[str, Any], version: int) -> None:
        last, pruned = state.get("last_reported_step"), state.get("pruned_step")
        if not _is_step(last) or not (pruned is None or _is_step(pruned)):
            raise MonitoredValueError(
                "OptunaPruningHook: the saved state is malformed: expected integer steps "
                f"'last_reported_step' and 'pruned_step' (or None), got {last!r} and {pruned!r}"
            )
        identity = None
        if version >= 2:
            identity = {key: state.get(key) for key in ("study", "trial", "params")}
            study, number, params = identity["study"], identity["trial"], identity["params"]
            if (
                not (study is None or isinstance(study, str))
                or not (isinstance(number, int) and not isinstance(number, bool))
                or not isinstance(params, Mapping)
            ):
                raise MonitoredValueError(
                    "OptunaPruningHook: the saved state is malformed: expected the trial's "
                    "'study' (a name or None), 'trial' (a number) and 'params' (a mapping), "
                    f"got {study!r}, {number!r} and {_short(params)}"
                )
        self.last_reported_step = last
        self.pruned_step = pruned
        self._restored_identity = identity

    def _check_identity(self, session: MonitoredSession) -> bool:
        """Refuse to go on from a checkpoint saved for another trial than this one.

        A checkpoint of a trial this one retries (Optuna's retry of a dead or
        interrupted trial, with its parameters) is this trial's own work: it
        is taken, and ``True`` returned.
        """
        saved, self._restored_identity = self._restored_identity, None
        if saved is None:
            return False
        current = _identity(self._trial)
        if dict(saved["params"]) == current["params"] and saved["study"] == current["study"]:
            if saved["trial"] == current["trial"]:
                return False
            if self._trial is not None and saved["trial"] in retry_chain(self._trial):
                log.info(
                    "OptunaPruningHook: trial %s retries trial %s: going on from its checkpoint",
                    current["trial"],
                    saved["trial"],
                )
                return True
        restored = session.restored_from  # a path found on disk: printed escaped
        where = printable(restored) if restored is not None else "a checkpoint"
        raise OptunaConfigError(
            f"OptunaPruningHook: {where} was saved by trial {saved['trial']} of study "
            f"{saved['study']!r} with params {_short(saved['params'])}, but this session trains "
            f"trial {current['trial']} of study {current['study']!r} with params "
            f"{_short(current['params'])}; resuming would train the old trial's model under the "
            "new trial's name and parameters. Give each study its own directory "
            "(e.g. runs/<study name>/trial-<number>), or delete the old checkpoints"
        )

    # -- internals ----------------------------------------------------------------------------
    async def report(
        self,
        session: MonitoredSession,
        step: int,
        value: float,
        run_context: SessionRunContext | None = None,
    ) -> bool:
        """Report ``value`` for global ``step`` and prune if the trial's pruner says so.

        What ``after_run`` and ``after_evaluate`` do with the watched value; call
        it with a value computed elsewhere. Nothing is reported without a trial,
        off the chief, for a step reported already or once pruned. A prune stops
        the session after the current step (``run_context.request_stop()``
        inside a step's hooks, else the coordinator's) and makes it raise
        ``optuna.TrialPruned`` once closed. Returns whether it pruned.
        """
        trial = self._trial
        if (
            trial is None
            or not self._active
            or step <= self.last_reported_step
            or self.pruned_step is not None
        ):
            return False

        def report_and_ask() -> bool:
            trial.report(value, step)
            return trial.should_prune()

        if _in_memory(trial):
            prune = report_and_ask()  # microseconds: a thread would cost more than it saves
        else:
            prune = await anyio.to_thread.run_sync(report_and_ask)
        self.last_reported_step = step
        if not prune:
            return False
        self.pruned_step = step
        log.info(
            "OptunaPruningHook: trial %s pruned at step %d (%s = %g)",
            _number(trial),
            step,
            self.monitor,
            value,
        )
        # The stop first, so that the log names this hook as the one that asked for it.
        if run_context is not None:
            run_context.request_stop()
        else:
            session.coord.request_stop()
        session.raise_after_close(
            _pruned(
                f"Trial {_number(trial)} was pruned at step {step} ({self.monitor} = {value:g})"
            )
        )
        return True

    def _scalar(self, value: Any, step: int) -> float:
        return to_scalar(
            value, f"OptunaPruningHook: monitor {self.monitor!r}", step, MonitoredValueError
        )


def _identity(trial: optuna.trial.BaseTrial | None) -> dict[str, Any]:
    """What names ``trial`` in a checkpoint: its study's name, its number and its params."""
    study = getattr(trial, "study", None)
    return {
        "study": getattr(study, "study_name", None),
        "trial": getattr(trial, "number", None),
        "params": dict(getattr(trial, "params", {})),
    }


def _short(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (a saved state may hold anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_step(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= -1


def _number(trial: optuna.trial.BaseTrial | None) -> object:
    return getattr(trial, "number", "?")


# Optuna is imported where a trial is at hand, never at the top: the plugin is loaded
# into every session where it is installed, most of them with no trial to report to.
def _pruned(message: str) -> optuna.TrialPruned:
    import optuna

    return optuna.TrialPruned(message)


def _in_memory(trial: optuna.trial.BaseTrial) -> bool:
    """Whether ``trial``'s study lives in this process's memory (no I/O to report)."""
    import optuna

    return isinstance(getattr(trial, "storage", None), optuna.storages.InMemoryStorage)


def _last_step_held(trial: optuna.trial.BaseTrial | None) -> int:
    """The last step ``trial`` holds an intermediate value for in its storage (-1: none)."""
    import optuna

    if isinstance(trial, optuna.trial.Trial):
        # The storage, not the trial's cache: another process may have reported since.
        held = trial.storage.get_trial(trial._trial_id).intermediate_values
    elif isinstance(trial, optuna.trial.FrozenTrial):
        held = trial.intermediate_values
    else:
        return -1
    return max(held, default=-1)


@final
class _StepPruningHook(OptunaPruningHook):
    """An ``OptunaPruningHook`` watching a step output: it fetches it on due steps only."""

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        # Checks fall on multiples of every_n_steps, so a resumed run checks the same
        # steps; the state was kept at creation (one attribute less to look up per step).
        state = self._state
        self._due = state is not None and state.global_step + 1 >= self._next_check
        return self._args if self._due else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
        if not self._due:
            return None
        self._due = False
        session = run_context.session
        step = session.state.global_step
        n = self.every_n_steps
        self._next_check = (step // n + 1) * n
        session.skip_step_hooks(self, self._next_check)
        raw = (run_values.results or {}).get(self.monitor)
        if raw is None:
            raise MonitoredValueError(
                f"OptunaPruningHook: monitor {self.monitor!r} is not available at step {step}: "
                f"the step returned outputs {sorted(session.last_outputs)} and the state has "
                f"entries {sorted(session.state)}"
            )
        return self.report(session, step, self._scalar(raw, step), run_context)
