"""Evaluation interleaved with training: at new checkpoints, and once at the end.

TF Experiment's ``_EvalAndExportListener`` and Estimator's
``_NewCheckpointListenerForEvaluate``: a hook in the training session that
evaluates when the checkpoint plugin is about to write a checkpoint
(``before_save``), at most every ``min_steps`` global steps and ``min_secs``
seconds, and once more when training ends if the final state was not evaluated.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, final

from .._core._cluster import LocalCluster
from .._core._markers import hookimpl
from ..metrics import Metric
from ._errors import ExperimentConfigError
from ._hook import EvaluatesInTraining, TrainingEvaluation

if TYPE_CHECKING:
    from .._core._coordinator import Coordinator
    from .._core._run import SessionRunContext, SessionRunValues
    from .._core._session import MonitoredSession

__all__ = ["EvaluateNewCheckpoints"]


@final
class EvaluateNewCheckpoints(EvaluatesInTraining):
    """Evaluates the training state at each new checkpoint, and at the end.

    A checkpoint is evaluated when it is of a step trained in this session,
    ``min_steps`` or more steps after the last evaluation (``0``: only at the
    end), and ``min_secs`` or more seconds after it started. The evaluation runs
    in ``before_save``, on the state in memory, which is what the checkpoint
    will hold: no re-read, and plugin states the evaluation changes (early
    stopping's best value) are saved in that same checkpoint, so a resumed run
    has seen every evaluation a straight run has. The write itself stays
    asynchronous. With ``at_end``, the final state is evaluated at ``end``
    unless its step already was (a session without checkpoints evaluates only
    then); that ``end`` runs before every other hook's, so early stopping hears
    the final result before its own ``end`` and the checkpoint plugin's final
    save holds what it changed. Each result is kept in :attr:`results` and
    reaches the training session's plugins through ``after_evaluate``.

    An evaluation that raises does not keep its checkpoint from being written:
    the failure (:class:`EvaluationFailedError`) goes to the session's
    coordinator, the checkpoint plugin goes on with the write (or, at ``end``,
    with its final save), and the session stops after this step and raises it.

    In a job of several processes only the chief writes checkpoints, and every
    process must evaluate together, at the same global step: there it evaluates
    every ``max(min_steps, save_checkpoint_steps)`` steps (the checkpoints'
    step schedule; ``min_steps`` alone when they are saved by time, where
    ``min_steps`` must then be more than 1), at the end of the step, before a
    checkpoint of that step is written. ``min_secs`` does not apply: the
    processes' clocks differ.
    """

    __slots__ = (
        "_distributed",
        "_every",
        "_last_step",
        "_last_time",
        "_start_step",
        "at_end",
        "min_secs",
        "min_steps",
    )

    plugin_name = "evaluate-new-checkpoints"

    def __init__(
        self,
        eval_fn: Callable[..., Any],
        metrics: Mapping[str, Metric],
        *,
        input_fn: Callable[[], Iterable[Any] | AsyncIterable[Any]] | None = None,
        min_steps: int = 1,
        min_secs: float = 0.0,
        at_end: bool = True,
        **kwargs: Any,
    ) -> None:
        self._evaluation = TrainingEvaluation(
            eval_fn, metrics, input_fn, kwargs, "train_and_evaluate's evaluation"
        )
        self.min_steps = min_steps
        self.min_secs = min_secs
        self.at_end = at_end
        self._start_step = 0
        self._last_step: int | None = None
        self._last_time: float | None = None
        self._distributed = False
        self._every = 0

    def begin(self, session: MonitoredSession) -> None:
        self._distributed = not isinstance(session.cluster, LocalCluster)
        self._every = 0
        if not self._distributed or self.min_steps == 0:
            return
        config = session.training_config
        save_steps = config.save_checkpoint_steps if config is not None else None
        if save_steps:
            self._every = max(self.min_steps, save_steps)
        elif self.min_steps > 1:
            self._every = self.min_steps
        else:
            raise ExperimentConfigError(
                "train_and_evaluate under several processes evaluates at global steps "
                "every process knows, and checkpoints here are saved by time (only the "
                "chief knows when): give save_checkpoint_steps=N (evaluations follow "
                "them) or min_eval_frequency=N > 1"
            )

    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        self._start_step = session.state.global_step

    async def before_save(self, session: MonitoredSession, step: int) -> None:
        if not self._distributed and self._due(step):
            await self._evaluate(session)

    def after_run(
        self, run_context: SessionRunContext, run_values: SessionRunValues
    ) -> Coroutine[Any, Any, None] | None:
        """With several processes: evaluate every ``_every`` steps, on all of them."""
        if not self._every:
            return None
        step = run_context.session.state.global_step
        since = self._start_step if self._last_step is None else self._last_step
        if step - since < self._every:
            return None
        return self._evaluate(run_context.session)

    @hookimpl(tryfirst=True)  # first: the other hooks' end (early stopping) hear the result
    async def end(self, session: MonitoredSession) -> None:
        step = session.state.global_step
        if self.at_end and step != self._last_step:
            await self._evaluate(session)

    def _due(self, step: int) -> bool:
        if self.min_steps == 0 or step <= self._start_step:
            return False
        if self._last_step is not None and step - self._last_step < self.min_steps:
            return False
        return self._last_time is None or time.monotonic() - self._last_time >= self.min_secs

    async def _evaluate(self, session: MonitoredSession) -> None:
        self._last_step = session.state.global_step
        self._last_time = time.monotonic()
        await self._evaluation(session, defer_failure=True)
