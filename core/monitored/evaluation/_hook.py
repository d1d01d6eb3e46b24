"""``EvaluationHook``: evaluate the training state every N steps, inside training.

TF1's ``InMemoryEvaluatorHook``: the evaluation runs on the training state as it
is (no checkpoint) and its results reach the training session's plugins through
:meth:`~monitored.MonitoredSession.report_evaluation` (the ``after_evaluate``
hook): early stopping, progress and summaries see them.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import AsyncIterable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, final

from .._core._cluster import LocalCluster
from .._core._markers import hookimpl
from .._core._timer import SecondOrStepTimer
from .._core._watchdog import FROM_ENV, blocked_loop_threshold
from ..metrics import Metric
from ._errors import EvaluationFailedError
from ._evaluate import (
    SESSION_ARGUMENTS,
    EvaluationResult,
    check_metrics,
    check_options,
    evaluate_once,
)

#: What a hook evaluating during training passes on to ``evaluate_once`` (it
#: gives ``input`` and ``state`` itself).
_EVALUATE_ONCE_OPTIONS: Final = frozenset(
    name
    for name, parameter in inspect.signature(evaluate_once).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("input", "state")
)

if TYPE_CHECKING:
    from .._core._run import SessionRunContext, SessionRunValues
    from .._core._session import MonitoredSession

__all__ = ["EvaluatesInTraining", "EvaluationHook", "TrainingEvaluation"]


@final
class TrainingEvaluation:
    """One evaluation inside training, as the hooks that evaluate there run it.

    What :class:`EvaluationHook` and ``train_and_evaluate``'s hook share:
    :func:`evaluate_once` on ``session.state`` with a fresh ``input_fn()``,
    summaries into ``<summary_dir>/eval`` of the training session unless
    ``kwargs`` name a ``summary_dir``, then ``after_evaluate`` on the training
    session's hooks and plugins. Each result is appended to :attr:`results`.
    """

    __slots__ = ("eval_fn", "input_fn", "kwargs", "metrics", "results")

    def __init__(
        self,
        eval_fn: Callable[..., Any],
        metrics: Mapping[str, Metric],
        input_fn: Callable[[], Iterable[Any] | AsyncIterable[Any]] | None,
        kwargs: Mapping[str, Any],
        owner: str,
    ) -> None:
        # Checked now: the first evaluation may come hours into training.
        if not callable(eval_fn):
            raise TypeError(f"{owner}: eval_fn must be a function, got {type(eval_fn).__name__}")
        check_metrics(metrics, owner)
        if input_fn is not None and not callable(input_fn):
            raise TypeError(
                f"{owner}: input_fn must be a function returning the eval input (called at "
                f"each evaluation for a fresh pass), got {type(input_fn).__name__}; write "
                "input_fn=lambda: batches"
            )
        unknown = sorted(set(kwargs) - _EVALUATE_ONCE_OPTIONS)
        if not unknown:
            try:
                check_options(**kwargs)
            except ValueError as exc:
                raise ValueError(f"{owner}: {exc}") from None
        if unknown:
            hints = [
                f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
                for name in unknown
                for close in [difflib.get_close_matches(name, _EVALUATE_ONCE_OPTIONS, n=1)]
            ]
            raise TypeError(
                f"{owner} got unknown arguments {', '.join(hints)}; it passes on to "
                f"evaluate_once: {', '.join(sorted(_EVALUATE_ONCE_OPTIONS))}"
            )
        self.eval_fn = eval_fn
        self.metrics = metrics
        self.input_fn = input_fn
        self.kwargs = kwargs
        self.results: list[EvaluationResult] = []

    async def __call__(self, session: MonitoredSession, *, defer_failure: bool = False) -> None:
        """Evaluate the training session's state now and report the result to its plugins.

        An evaluation that raises becomes :class:`EvaluationFailedError` (the
        original as its cause): training stops. It is raised here, or, with
        ``defer_failure``, handed to the session's coordinator, which stops the
        session at the next step boundary and raises it from there: the hook
        returns, so the checkpoint being written (``before_save``) or the other
        hooks' ``end`` (the final checkpoint) still run first.
        """
        step = session.state.global_step
        options = dict(self.kwargs)
        config = session.training_config
        if "summary_dir" not in options and config is not None and config.summary_dir:
            options["summary_dir"] = os.path.join(config.summary_dir, "eval")
        # What the training session knows already, its evaluation session does not
        # find out again (see SESSION_ARGUMENTS).
        given: dict[str, Any] = {}
        if _watched(session):
            given["blocked_loop_warning_secs"] = None
        if type(session.cluster) is LocalCluster:
            given["cluster"] = LocalCluster()
        token = SESSION_ARGUMENTS.set(given) if given else None
        try:
            result = await evaluate_once(
                self.eval_fn,
                self.metrics,
                input=self.input_fn() if self.input_fn is not None else None,
                state=session.state,
                **options,
            )
        except Exception as exc:
            error = EvaluationFailedError(
                f"the evaluation at training step {step} raised {type(exc).__name__}: {exc}; "
                + (
                    "training stops once the checkpoint of this step, if one is due, is written"
                    if defer_failure
                    else "training stops (checkpoints already written stay)"
                )
            )
            if not defer_failure:
                raise error from exc
            error.__cause__ = exc
            session.coord.request_stop(error)
            return
        finally:
            if token is not None:
                SESSION_ARGUMENTS.reset(token)
        self.results.append(result)
        await session.report_evaluation(result.global_step, result.metrics)


def _watched(session: MonitoredSession) -> bool:
    """Whether ``session``'s watchdog warns of a held loop as soon as an evaluation's would."""
    outer = session._blocked_loop_secs
    if outer is None:
        return False
    try:
        own = blocked_loop_threshold(FROM_ENV)
    except ValueError:
        return False  # the evaluation session says what is wrong with the variable
    return own is None or outer <= own


class EvaluatesInTraining:
    """What the hooks that evaluate inside training show of their evaluations."""

    __slots__ = ("_evaluation",)

    _evaluation: TrainingEvaluation

    @property
    def eval_fn(self) -> Callable[..., Any]:
        """The eval step."""
        return self._evaluation.eval_fn

    @property
    def results(self) -> list[EvaluationResult]:
        """Every result so far, oldest first."""
        return self._evaluation.results


@final
class EvaluationHook(EvaluatesInTraining):
    """Runs :func:`evaluate_once` on the training state every ``every_n_steps`` steps.

    ``input_fn()`` gives a fresh eval input each time; ``kwargs`` go to
    :func:`evaluate_once` (``eval_steps``, ``hooks``, ...). Each result is kept in
    :attr:`results` and reported to the training session's plugins with
    ``after_evaluate``. Summaries of the results go to ``<summary_dir>/eval`` of the
    training session (``summary_dir=`` overrides). With ``at_end`` the final state
    is evaluated too, in an ``end`` that runs before every other hook's ``end``,
    so that they (early stopping restoring the best state, the checkpoint
    plugin's final save) see its result.

    An evaluation that raises stops training: the hook raises
    :class:`EvaluationFailedError` (the original error as its cause) from
    ``after_run``, so the session closes as after any failed step (``end`` is not
    called; checkpoints already written stay). The final evaluation's failure is
    raised when the session closes, after the other hooks' ``end`` (the final
    checkpoint is written).
    """

    __slots__ = ("_every_n_secs", "_timer", "at_end")

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
        self._evaluation = TrainingEvaluation(eval_fn, metrics, input_fn, kwargs, "EvaluationHook")
        self._timer = SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_steps)
        self._every_n_secs = every_n_secs
        self.at_end = at_end

    def begin(self, session: MonitoredSession) -> None:
        if self._every_n_secs is not None and not isinstance(session.cluster, LocalCluster):
            raise ValueError(
                f"EvaluationHook(every_n_secs={self._every_n_secs}) under several processes: "
                "each process's clock would pick another step, and they must evaluate "
                "together; use every_n_steps (train_and_evaluate: min_eval_frequency=N)"
            )

    def after_run(
        self, run_context: SessionRunContext, run_values: SessionRunValues
    ) -> Coroutine[Any, Any, None] | None:
        """The evaluation when it is due (sync otherwise: a step awaits nothing then)."""
        session = run_context.session
        step = session.state.global_step
        if not self._timer.should_trigger_for_step(step):
            return None
        self._timer.update_last_triggered_step(step)
        return self._evaluation(session)

    @hookimpl(tryfirst=True)  # first: the other hooks' end (early stopping) hear the result
    async def end(self, session: MonitoredSession) -> None:
        if self.at_end and self._timer.last_triggered_step() != session.state.global_step:
            await self._evaluation(session, defer_failure=True)
