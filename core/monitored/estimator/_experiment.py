"""``Experiment(estimator, train_input_fn, eval_input_fn, ...)``: contrib's, of an Estimator."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ..evaluation import EvaluationResult
from ..evaluation import Experiment as StepExperiment
from ._errors import EstimatorError
from ._estimator import Estimator, _check_metric_specs
from ._spec import MetricSpec, ModeKeys

__all__ = ["Experiment"]


class Experiment(StepExperiment):
    """``tf.contrib.learn.Experiment`` built from an :class:`Estimator` and input functions.

    A :class:`monitored.Experiment` (``train``, ``evaluate``, ``continuous_eval``
    and every keyword argument: ``min_eval_frequency``, ``eval_delay_secs``,
    ...) whose steps are the estimator's ``model_fn`` in TRAIN and EVAL mode,
    with contrib's return values and extra methods: ``train_and_evaluate`` and
    ``continuous_train_and_eval`` return ``(eval_result, export_results)``
    (the result as ``Estimator.evaluate``'s dict; nothing is exported, so the
    list is empty); ``continuous_train_and_eval`` trains whole rounds of
    ``train_steps_per_iteration`` steps and writes its evaluations to
    ``eval_one_pass``; ``test``, ``local_run`` and ``continuous_eval_on_train_data``
    are there. ``eval_metrics`` are contrib's :class:`MetricSpec`; the model
    directory, the state's seed and the checkpoint and summary settings are
    the estimator's ``RunConfig``. ``eval_steps`` keeps TF's default of 100
    batches (``None``: the whole eval input). Both input functions and the
    ``model_fn`` in both modes are tried on their first batch here, so a
    mistake in the evaluation shows at once, not at the first evaluation.
    """

    __slots__ = ("estimator",)

    _round_eval_name: ClassVar[str | None] = "one_pass"
    _rounds_end_at_train_steps: ClassVar[bool] = False

    def __init__(
        self,
        estimator: Estimator,
        train_input_fn: Callable[[], Any],
        eval_input_fn: Callable[[], Any],
        eval_metrics: Mapping[str, MetricSpec] | None = None,
        train_steps: int | None = None,
        eval_steps: int | None = 100,
        train_monitors: Sequence[object] | None = None,
        eval_hooks: Sequence[object] | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(estimator, Estimator):
            raise EstimatorError(
                "monitored.estimator.Experiment(estimator=...): a monitored.estimator.Estimator, "
                f"not {type(estimator).__name__} (monitored.Experiment takes step functions)"
            )
        specs = _check_metric_specs(eval_metrics)
        config = estimator.config
        hooks: list[object] = [*(train_monitors or ())]
        built = estimator._build(train_input_fn, ModeKeys.TRAIN)
        evaluated = estimator._build(eval_input_fn, ModeKeys.EVAL)
        template = estimator._experiment(train_input_fn, built, [], train_steps=None)
        self.estimator = estimator
        super().__init__(
            estimator._train_step,
            estimator._eval_step(specs),
            estimator._eval_metrics(),
            train_input_fn=train_input_fn,
            eval_input_fn=eval_input_fn,
            model_dir=estimator.model_dir,
            state=template.state,
            scaffold=template.scaffold,
            train_steps=train_steps,
            eval_steps=eval_steps,
            train_hooks=[*built.spec.training_hooks, *hooks],
            eval_hooks=[*evaluated.spec.evaluation_hooks, *(eval_hooks or ())],
            is_chief=config.is_chief,
            task_id=config.task_id,
            keep_checkpoint_max=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
            **{**config.session_options(), **options},
        )

    async def train_and_evaluate(self) -> tuple[dict[str, Any], list[Any]]:  # type: ignore[override]
        """Train, evaluating as ``min_eval_frequency`` says; ``(final result, [])``."""
        result = await super().train_and_evaluate()
        return result.as_dict(), []

    async def continuous_train_and_eval(  # type: ignore[override]
        self,
        continuous_eval_predicate_fn: Callable[[EvaluationResult | None], bool] | None = None,
    ) -> tuple[dict[str, Any] | None, list[Any]]:
        """Rounds of training and an evaluation into ``eval_one_pass``; ``(last result, [])``."""
        result = await super().continuous_train_and_eval(continuous_eval_predicate_fn)
        return (None if result is None else result.as_dict()), []

    async def local_run(self) -> tuple[dict[str, Any], list[Any]]:
        """TF's deprecated name of :meth:`train_and_evaluate`."""
        return await self.train_and_evaluate()

    async def test(self) -> dict[str, Any]:
        """Train one step and evaluate one batch into ``eval_one_pass`` (TF's smoke test)."""
        await self._train(self._stop_hooks(), steps=1)
        saved_steps = self.eval_steps
        self.eval_steps = 1
        try:
            result = await self.evaluate(delay_secs=0, name="one_pass")
        finally:
            self.eval_steps = saved_steps
        return result.as_dict()

    async def continuous_eval_on_train_data(
        self,
        delay_secs: float | None = None,
        throttle_delay_secs: float | None = None,
        continuous_eval_predicate_fn: Callable[[EvaluationResult], bool] | None = None,
    ) -> list[EvaluationResult]:
        """:meth:`continuous_eval` over the training input, into ``eval_train``."""
        eval_input_fn = self.eval_input_fn
        self.eval_input_fn = self.train_input_fn
        try:
            return await self.continuous_eval(
                delay_secs,
                throttle_delay_secs,
                continuous_eval_predicate_fn,
                name="train",
            )
        finally:
            self.eval_input_fn = eval_input_fn
