"""``Experiment(estimator, train_input_fn, eval_input_fn, ...)``: contrib's, of an Estimator."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..evaluation import Experiment as StepExperiment
from ._errors import EstimatorError
from ._estimator import Estimator, _LossSummary
from ._spec import MetricSpec

__all__ = ["Experiment"]


class Experiment(StepExperiment):
    """``tf.contrib.learn.Experiment`` built from an :class:`Estimator` and input functions.

    The same object as :class:`monitored.Experiment` (every method: ``train``,
    ``evaluate``, ``continuous_eval``, ``train_and_evaluate``,
    ``continuous_train_and_eval``), its steps the estimator's ``model_fn`` in
    TRAIN and EVAL mode. ``eval_metrics`` are contrib's :class:`MetricSpec`;
    the model directory, the state's seed and the checkpoint and summary
    settings are the estimator's ``RunConfig``. ``eval_steps`` keeps TF's
    default of 100 batches (``None``: the whole eval input).
    """

    __slots__ = ()

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
        from ._estimator import _check_metric_specs

        specs = _check_metric_specs(eval_metrics)
        config = estimator.config
        hooks: list[object] = [*(train_monitors or ())]
        if config.save_summary_steps:
            hooks.append(_LossSummary(config.save_summary_steps))
        built = estimator._build(train_input_fn, "train")
        template = estimator._experiment(train_input_fn, built, [], train_steps=None)
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
            eval_hooks=list(eval_hooks or ()),
            is_chief=config.is_chief,
            task_id=config.task_id,
            keep_checkpoint_max=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
            **{**config.session_options(), **options},
        )
