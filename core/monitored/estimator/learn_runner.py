"""``learn_runner.run``: ``tf.contrib.learn.learn_runner.run``, picking what a task does.

``await learn_runner.run(experiment_fn, output_dir=...)`` makes the
:class:`~monitored.Experiment` of ``experiment_fn(output_dir, hparams)``
(``experiment_fn(run_config, hparams)`` with ``run_config=``) and runs one of
its methods, the *schedule*: the one given, or TF's default for this task of
the job (``TF_CONFIG``, read by :class:`RunConfig`): ``train_and_evaluate`` in
a single process, ``train`` on a worker, ``continuous_eval`` on an evaluator.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from ..evaluation import Experiment
from ._config import RunConfig
from ._errors import EstimatorError

__all__ = ["run"]

#: The schedules an Experiment has, and TF's default schedule for each task type.
_SCHEDULES = (
    "train",
    "evaluate",
    "continuous_eval",
    "train_and_evaluate",
    "continuous_train_and_eval",
    "test",
)
_DEFAULT_FOR_TASK = {
    None: "train_and_evaluate",
    "chief": "train",
    "master": "train",
    "worker": "train",
    "evaluator": "continuous_eval",
}


async def run(
    experiment_fn: Callable[..., Experiment],
    output_dir: str | os.PathLike[str] | None = None,
    schedule: str | None = None,
    run_config: RunConfig | None = None,
    hparams: Any = None,
) -> Any:
    """Make the experiment and run ``schedule``; returns what that method returns.

    Exactly one of ``output_dir`` and ``run_config`` (TF's two forms). A task
    type with no schedule here (``ps``: there are no parameter servers) is
    refused with the reason.
    """
    if (output_dir is None) == (run_config is None):
        raise EstimatorError("learn_runner.run: give exactly one of output_dir and run_config")
    if not callable(experiment_fn):
        raise EstimatorError(f"learn_runner.run: experiment_fn {experiment_fn!r} is not callable")
    config = run_config if run_config is not None else RunConfig(model_dir=output_dir)
    first = os.fspath(output_dir) if output_dir is not None else config
    takes_hparams = "hparams" in inspect.signature(experiment_fn).parameters
    experiment = experiment_fn(first, hparams) if takes_hparams else experiment_fn(first)
    if not isinstance(experiment, Experiment):
        raise EstimatorError(
            f"learn_runner.run: experiment_fn returned {type(experiment).__name__}, not a "
            "monitored.Experiment"
        )
    if schedule is None:
        if config.task_type not in _DEFAULT_FOR_TASK:
            raise EstimatorError(
                f"learn_runner.run: task type {config.task_type!r} (TF_CONFIG) has no schedule "
                "here: there are no parameter servers (synchronous data parallelism over MPI "
                "instead, docs/scaling-out.md); give schedule= or run only workers"
            )
        schedule = _DEFAULT_FOR_TASK[config.task_type]
    if schedule not in _SCHEDULES or not callable(getattr(experiment, schedule, None)):
        available = [name for name in _SCHEDULES if callable(getattr(experiment, name, None))]
        raise EstimatorError(
            f"learn_runner.run(schedule={schedule!r}): not a schedule; the Experiment "
            f"has {available}"
        )
    return await getattr(experiment, schedule)()
