"""``EarlyStoppingHook``: stop training when a watched value stops improving.

The value comes from a training output (or state entry) fetched every
``every_n_steps`` steps, optionally smoothed; or, with ``every_n_steps=0``, from
evaluation results as they are reported (the ``after_evaluate`` hook, or
:meth:`EarlyStoppingHook.observe` called by hand). The stop goes through ``request_stop``, the
session's one stop decision. On steps where no check is due the hook fetches
nothing and creates no coroutine. A value that the step returns as a host number
(a Python or NumPy scalar, the common loss) is read from the step's outputs, with
no fetch: a fetch would hand over the same immutable value; anything else (an
array, a device value, a state entry) goes through the step's batched fetch.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, final

import anyio.to_thread
import numpy as np

import monitored
from monitored import PluginError, Provider, SessionRunArgs, is_device_array, optional, to_host

from ._errors import EarlyStoppingConfigError, EarlyStoppingStateError, MonitoredValueError
from ._rules import KerasRule, NoImprovementRule, Rule, infer_mode, saved_field

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = ["EarlyStoppingHook", "stop_if_no_decrease_hook", "stop_if_no_increase_hook"]

log = logging.getLogger("monitored.early_stopping")

_BEST_BASENAME: Final = "best"
#: Types of step outputs read as they are, without a fetch: host numbers, immutable,
#: which the session's fetch would hand over unchanged (or as a 0-d copy).
_HOST_SCALARS: Final = frozenset(
    {float, int, np.float16, np.float32, np.float64, np.int32, np.int64}
)
#: What ``best_checkpoint_dir`` needs of the provider of "checkpoint" (``monitored.hookspecs``).
_BEST_HOOKS: Final = ("save_checkpoint", "restore_checkpoint")
_BEST_NEEDS: Final = "EarlyStoppingHook: best_checkpoint_dir saves and restores checkpoints"


@final
class EarlyStoppingHook:
    """Stops training when ``monitor`` has not improved for ``patience`` checks.

    The decisions are Keras's ``EarlyStopping`` for the same sequence of values
    (a check is Keras's epoch); see :class:`~monitored_early_stopping.KerasRule`.

    Args:
        monitor: the step output or state entry to watch (or, with
            ``every_n_steps=0``, the metric name handed to :meth:`observe`).
        min_delta: an improvement smaller than this does not count.
        patience: checks without improvement before stopping.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (from the name: losses and
            errors go down, accuracies and scores up).
        baseline: ``wait`` is reset only by values that also beat it.
        restore_best: when it stopped training, put back the state's arrays of
            the best check at ``end``. Kept on the host, or with
            ``best_checkpoint_dir`` written there as a checkpoint ``best-<step>``
            (out of any saver's ``max_to_keep`` rotation) and restored from it.
        start_from: checks ignored at first (Keras's ``start_from_epoch``).
        every_n_steps: check every this many global steps. 0 watches evaluation
            results instead: each ``after_evaluate`` (an ``EvaluationHook`` or
            ``train_and_evaluate`` in the same session) is one check, and so is
            each call of :meth:`observe`.
        smoothing: an exponential moving average of the fetched values is
            watched instead, ``ema = smoothing * ema + (1 - smoothing) * value``.
        best_checkpoint_dir: see ``restore_best``; needs a provider of
            ``"checkpoint"`` (``monitored-checkpoint``, or another one).
        rule: another decision rule (``stop_if_no_decrease_hook`` passes TF1's).
    """

    plugin_state_version = 1
    #: Passed in ``hooks=[...]``, it owns early stopping: the installed
    #: ``early_stopping`` plugin (and its options) steps aside.
    provides: ClassVar[frozenset[str]] = frozenset({"early_stopping"})

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 0,
        mode: Literal["auto", "min", "max"] = "auto",
        baseline: float | None = None,
        restore_best: bool = False,
        start_from: int = 0,
        *,
        every_n_steps: int = 1,
        smoothing: float = 0.0,
        best_checkpoint_dir: str | os.PathLike[str] | None = None,
        rule: Rule | None = None,
    ) -> None:
        where = "EarlyStoppingHook"
        if not isinstance(monitor, str) or not monitor:
            raise EarlyStoppingConfigError(f"{where}: monitor must be a name, got {monitor!r}")
        for name, value in (
            ("patience", patience),
            ("start_from", start_from),
            ("every_n_steps", every_n_steps),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EarlyStoppingConfigError(
                    f"{where}: {name} must be an integer >= 0, got {value!r}"
                )
        if not isinstance(min_delta, int | float) or not math.isfinite(min_delta):
            raise EarlyStoppingConfigError(
                f"{where}: min_delta must be a number, got {min_delta!r}"
            )
        if not (isinstance(smoothing, int | float) and 0 <= smoothing < 1):
            raise EarlyStoppingConfigError(
                f"{where}: smoothing must be in [0, 1), got {smoothing!r}"
            )
        self.monitor = monitor
        #: Keys this hook's state in checkpoints: one per watched name.
        self.plugin_name = f"early_stopping:{monitor}"
        self.mode = infer_mode(monitor, mode, where) if rule is None else rule_mode(rule)
        self.rule: Rule = (
            rule
            if rule is not None
            else KerasRule(self.mode, min_delta, patience, baseline, start_from)
        )
        self.restore_best = restore_best
        self.every_n_steps = every_n_steps
        self.smoothing = float(smoothing)
        self.best_checkpoint_dir = (
            os.fspath(best_checkpoint_dir) if best_checkpoint_dir is not None else None
        )
        self._args = SessionRunArgs({monitor: optional(monitor)})
        self._next_check = 0
        self._due = False
        #: Whether the last check found the value as a host number among the step's
        #: outputs: the next check then reads it there instead of fetching it.
        self._direct = False
        self._ema: float | None = None
        #: Values judged by this hook object (an evaluation watcher that judged none warns).
        self._judged = 0
        self._best_arrays: dict[str, np.ndarray[Any, Any]] | None = None
        #: Path of the exported best checkpoint (with ``best_checkpoint_dir``).
        self.best_checkpoint: str | None = None

    # -- what the rule decided ----------------------------------------------------------------
    @property
    def best(self) -> float | None:
        """The best value seen so far."""
        return self.rule.best

    @property
    def best_step(self) -> int | None:
        """The global step of the best value (of the first check, before any value)."""
        return self.rule.best_step

    @property
    def stopped_step(self) -> int | None:
        """The global step at which this hook stopped training, if it did."""
        return getattr(self.rule, "stopped_step", None)

    # -- hooks --------------------------------------------------------------------------------
    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        n = self.every_n_steps
        step = session.state.global_step
        self._next_check = (step // n + 1) * n if n else -1
        # Nothing to do on the steps in between: the session does not call this hook
        # (checked every step, there are none: skipping costs the session a reschedule).
        if not n or self._next_check > step + 1:
            session.skip_step_hooks(self, self._next_check if n else None)
        if self.best_checkpoint_dir is not None:
            _checkpoint_provider(session)  # a missing provider fails now, not at the best step

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        # Checks fall on multiples of every_n_steps, so a resumed run checks the same steps.
        next_check = self._next_check
        step = run_context.session.state.global_step
        due = self._due = next_check >= 0 and step + 1 >= next_check
        return self._args if due and not self._direct else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
        if not self._due:
            return None
        self._due = False
        session = run_context.session
        step = session.state.global_step
        n = self.every_n_steps
        self._next_check = (step // n + 1) * n
        if n > 1:
            session.skip_step_hooks(self, self._next_check)
        current = session.last_outputs.get(self.monitor)
        direct = type(current) in _HOST_SCALARS
        if self._direct:
            raw = current
            if not direct:
                # No longer a host number: fetched now, this once (the same value the
                # step's fetch would have brought), and with the step's fetch from now on.
                raw = session.fetch(self._args.fetches).get(self.monitor)
        else:
            raw = (run_values.results or {}).get(self.monitor)
        self._direct = direct
        if raw is None:
            raise MonitoredValueError(
                f"EarlyStoppingHook: monitor {self.monitor!r} is not available at step {step}: "
                f"the step returned outputs {sorted(session.last_outputs)} and the state has "
                f"entries {sorted(session.state)}"
            )
        value = float(raw) if direct else self._scalar(raw, step)
        if self.smoothing:
            ema = self._ema
            value = value if ema is None else self.smoothing * ema + (1 - self.smoothing) * value
            self._ema = value
        return self._decide(session, step, value, run_context)

    async def end(self, session: MonitoredSession) -> None:
        if not self.every_n_steps and not self._judged:
            log.warning(
                "EarlyStoppingHook: watched the evaluation metric %r (every_n_steps=0), but "
                "no evaluation was reported to this session: nothing was judged. Evaluations "
                "come from train_and_evaluate or an EvaluationHook; to watch a step output, "
                "set every_n_steps",
                self.monitor,
            )
        if not self.restore_best or self.stopped_step is None:
            return  # Keras puts the best weights back only when it stopped training
        if self.best_checkpoint is not None:
            checkpoints = _checkpoint_provider(session)
            step, rng = session.state.global_step, session.state.rng_state
            await _run(
                lambda: checkpoints.call(
                    "restore_checkpoint", state=session.state, path=self.best_checkpoint
                )
            )
            session.state.global_step = step  # the arrays go back, not the step count or RNG
            session.state.rng_state = rng
            log.info("EarlyStoppingHook: restored the best state from %s", self.best_checkpoint)
        elif self._best_arrays is not None:
            for name, host in self._best_arrays.items():
                target = session.state[name]
                target[...] = _to_module_of(target, host)
            log.info(
                "EarlyStoppingHook: restored the state of step %s (best %s = %s)",
                self.best_step,
                self.monitor,
                self.best,
            )

    def plugin_state(self) -> dict[str, Any]:
        return {
            "rule": self.rule.state_dict(),
            "ema": self._ema,
            "best_checkpoint": self.best_checkpoint,
        }

    def load_plugin_state(self, state: dict[str, Any]) -> None:
        rule = state.get("rule")
        if not isinstance(rule, Mapping):
            raise EarlyStoppingStateError(
                "early stopping: the restored state has no rule (a mapping), got "
                f"{type(rule).__name__}"
            )
        # Every field is checked before any is stored: a refused state leaves the
        # hook as it was.
        ema = saved_field(state, "ema", "number", "state", optional=True)
        best_checkpoint = saved_field(state, "best_checkpoint", "text", "state", optional=True)
        self.rule.load_state_dict(rule)
        self._ema, self.best_checkpoint = ema, best_checkpoint

    # -- values from elsewhere ----------------------------------------------------------------
    def after_evaluate(
        self, session: MonitoredSession, step: int, metrics: Mapping[str, Any]
    ) -> Any:
        """One check per evaluation when watching evaluation results (``every_n_steps=0``).

        A hook that watches a training output ignores evaluation results, so a
        name that is both an output and a metric is never counted twice.
        """
        if self.every_n_steps:
            return None
        return self.observe(session, step, metrics)

    def observe(self, session: MonitoredSession, step: int, metrics: Mapping[str, Any]) -> Any:
        """Judge ``metrics[monitor]`` reported for ``step`` (evaluation results).

        Returns ``None``, or an awaitable when there is work to await (a best
        checkpoint to export). A stop is requested through the session's
        coordinator, so it takes effect after the current step.
        """
        if self.monitor not in metrics:
            raise MonitoredValueError(
                f"EarlyStoppingHook: monitor {self.monitor!r} is not among the reported "
                f"metrics {sorted(metrics)} at step {step}"
            )
        return self._decide(session, step, self._scalar(metrics[self.monitor], step), None)

    # -- internals --------------------------------------------------------------------------------
    def _scalar(self, value: Any, step: int) -> float:
        return monitored.to_scalar(
            value, f"EarlyStoppingHook: monitor {self.monitor!r}", step, MonitoredValueError
        )

    def _decide(
        self,
        session: MonitoredSession,
        step: int,
        value: float,
        run_context: SessionRunContext | None,
    ) -> Any:
        self._judged += 1
        decision = self.rule.observe(step, value)
        if decision.stop:
            log.info(
                "EarlyStoppingHook: %s = %g at step %d; best %g at step %s: stopping",
                self.monitor,
                value,
                step,
                self.best if self.best is not None else math.nan,
                self.best_step,
            )
            if run_context is not None:
                run_context.request_stop()
            else:
                session.coord.request_stop()
        if decision.snapshot and self.restore_best:
            if self.best_checkpoint_dir is not None and run_context is None:
                return self._export_best(session, step)
            if self.best_checkpoint_dir is not None:
                # After every hook's after_run: the checkpoint holds this step's plugin states.
                session.call_after_hooks(lambda: self._export_best(session, step))
            else:
                names = list(session.state)
                hosts = to_host([session.state[name] for name in names])
                self._best_arrays = {
                    name: np.array(host, copy=True) for name, host in zip(names, hosts, strict=True)
                }
        return None

    async def _export_best(self, session: MonitoredSession, step: int) -> None:
        checkpoints = _checkpoint_provider(session)
        directory = self.best_checkpoint_dir
        assert directory is not None
        states = await session.plugin_states()
        saved = await _run(
            lambda: checkpoints.call(
                "save_checkpoint",
                state=session.state,
                checkpoint_dir=directory,
                basename=_BEST_BASENAME,
                step=step,
                plugin_states=states,
                max_to_keep=1,
            )
        )
        if not isinstance(saved, str):
            raise PluginError(
                f"hook 'save_checkpoint' of {checkpoints.info.describe()} returned {saved!r}; "
                "the path of the checkpoint it wrote was expected",
                plugin=checkpoints.info.name,
                distribution=checkpoints.info.distribution,
                hook="save_checkpoint",
            )
        self.best_checkpoint = saved
        log.info(
            "EarlyStoppingHook: best %s so far; exported %s", self.monitor, self.best_checkpoint
        )


def rule_mode(rule: Rule) -> Literal["min", "max"]:
    mode = getattr(rule, "mode", "min")
    return "max" if mode == "max" else "min"


def stop_if_no_decrease_hook(
    metric_name: str,
    max_steps_without_decrease: int,
    min_steps: int = 0,
    *,
    every_n_steps: int = 1,
    restore_best: bool = False,
) -> EarlyStoppingHook:
    """TF1 Estimator's ``stop_if_no_decrease_hook``, counted in global steps.

    Stops once the lowest ``metric_name`` seen is ``max_steps_without_decrease``
    global steps old; values before ``min_steps`` are ignored.
    """
    return _estimator_hook(
        "min",
        metric_name,
        max_steps_without_decrease,
        min_steps,
        every_n_steps,
        restore_best,
        "stop_if_no_decrease_hook",
    )


def stop_if_no_increase_hook(
    metric_name: str,
    max_steps_without_increase: int,
    min_steps: int = 0,
    *,
    every_n_steps: int = 1,
    restore_best: bool = False,
) -> EarlyStoppingHook:
    """TF1 Estimator's ``stop_if_no_increase_hook``: the same, for a value that should rise."""
    return _estimator_hook(
        "max",
        metric_name,
        max_steps_without_increase,
        min_steps,
        every_n_steps,
        restore_best,
        "stop_if_no_increase_hook",
    )


def _estimator_hook(
    mode: Literal["min", "max"],
    metric_name: str,
    max_steps: int,
    min_steps: int,
    every_n_steps: int,
    restore_best: bool,
    where: str,
) -> EarlyStoppingHook:
    for name, value in (("max_steps_without_improvement", max_steps), ("min_steps", min_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise EarlyStoppingConfigError(
                f"{where}: {name} must be an integer >= 0, got {value!r}"
            )
    return EarlyStoppingHook(
        metric_name,
        restore_best=restore_best,
        every_n_steps=every_n_steps,
        rule=NoImprovementRule(mode, max_steps, min_steps),
    )


async def _run(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a worker thread, or here when CuPy is in use (its stream is per thread)."""
    if "cupy" in sys.modules:
        return fn(*args)
    return await anyio.to_thread.run_sync(fn, *args)


def _to_module_of(target: Any, host: np.ndarray[Any, Any]) -> Any:
    if is_device_array(target):
        import cupy

        return cupy.asarray(host)
    return host


def _checkpoint_provider(session: MonitoredSession) -> Provider:
    """The session's owner of ``"checkpoint"``, else the installed provider, checked."""
    checkpoints = monitored.provider("checkpoint", _BEST_NEEDS, session=session)
    checkpoints.require(*_BEST_HOOKS)
    return checkpoints
