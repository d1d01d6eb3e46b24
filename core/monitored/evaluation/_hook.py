"""``EvaluationHook``: evaluate the training state every N steps, inside training.

TF1's ``InMemoryEvaluatorHook``: the evaluation runs on the training state as it
is (no checkpoint) and its results reach the training session's plugins through
:meth:`~monitored.MonitoredSession.report_evaluation` (the ``after_evaluate``
hook): early stopping, progress and summaries see them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, final

from .._core._timer import SecondOrStepTimer
from ..metrics import Metric
from ._errors import EvaluationFailedError
from ._evaluate import EvaluationResult, evaluate_once

if TYPE_CHECKING:
    from .._core._run import SessionRunContext, SessionRunValues
    from .._core._session import MonitoredSession

__all__ = ["EvaluationHook", "evaluate_in_training"]


async def evaluate_in_training(
    session: MonitoredSession,
    eval_fn: Callable[..., Any],
    metrics: Mapping[str, Metric],
    input_fn: Callable[[], Iterable[Any] | AsyncIterable[Any]] | None,
    kwargs: Mapping[str, Any],
) -> EvaluationResult:
    """Evaluate the training session's state now and report the result to its plugins.

    What every evaluation inside training does (:class:`EvaluationHook`,
    ``train_and_evaluate``): :func:`evaluate_once` on ``session.state`` with a
    fresh input, summaries into ``<summary_dir>/eval`` of the training session
    unless ``kwargs`` name a ``summary_dir``, then ``after_evaluate`` on the
    training session's hooks and plugins. An evaluation that raises becomes
    :class:`EvaluationFailedError` (the original as its cause): training stops.
    """
    step = session.state.global_step
    options = dict(kwargs)
    config = session.training_config
    if "summary_dir" not in options and config is not None and config.summary_dir:
        options["summary_dir"] = os.path.join(config.summary_dir, "eval")
    try:
        result = await evaluate_once(
            eval_fn,
            metrics,
            input=input_fn() if input_fn is not None else None,
            state=session.state,
            **options,
        )
    except Exception as exc:
        raise EvaluationFailedError(
            f"the evaluation at training step {step} raised {type(exc).__name__}: {exc}; "
            "training stops (checkpoints already written stay)"
        ) from exc
    await session.report_evaluation(result.global_step, result.metrics)
    return result


@final
class EvaluationHook:
    """Runs :func:`evaluate_once` on the training state every ``every_n_steps`` steps.

    ``input_fn()`` gives a fresh eval input each time; ``kwargs`` go to
    :func:`evaluate_once` (``eval_steps``, ``hooks``, ...). Each result is kept in
    :attr:`results` and reported to the training session's plugins with
    ``after_evaluate``. Summaries of the results go to ``<summary_dir>/eval`` of the
    training session (``summary_dir=`` overrides). With ``at_end`` the final state is evaluated too.

    An evaluation that raises stops training: the hook raises
    :class:`EvaluationFailedError` (the original error as its cause) from
    ``after_run``, so the session closes as after any failed step (``end`` is not
    called; checkpoints already written stay).
    """

    __slots__ = ("_input_fn", "_kwargs", "_metrics", "_timer", "at_end", "eval_fn", "results")

    def __init__(
        self,
        eval_fn: Callable[..., Any],
        metrics: Mapping[str, Metric],
        *,
        input_fn: Callable[[], Iterable[Any] | AsyncIterable[Any]] | None = None,
        every_n_steps: int | None = None,
        every_n_secs: float | None = None,
        at_end: bool = False,
        **kwargs: Any,
    ) -> None:
        self.eval_fn = eval_fn
        self._metrics = metrics
        self._input_fn = input_fn
        self._timer = SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_steps)
        self._kwargs = kwargs
        self.at_end = at_end
        self.results: list[EvaluationResult] = []

    async def _evaluate(self, session: MonitoredSession) -> None:
        self.results.append(
            await evaluate_in_training(
                session, self.eval_fn, self._metrics, self._input_fn, self._kwargs
            )
        )

    async def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        session = run_context.session
        step = session.state.global_step
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            await self._evaluate(session)

    async def end(self, session: MonitoredSession) -> None:
        if self.at_end and self._timer.last_triggered_step() != session.state.global_step:
            await self._evaluate(session)
