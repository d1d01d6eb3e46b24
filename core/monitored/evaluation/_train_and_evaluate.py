"""``train_and_evaluate`` with ``TrainSpec`` and ``EvalSpec``: TF Estimator's, on an Experiment.

TF's ``tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)`` in
its local mode: train, evaluating each new checkpoint at most every
``throttle_secs``, and evaluate the final state. The specs carry step
functions and input functions instead of an Estimator's ``model_fn``; the
model directory, state and scaffold (the Estimator's own) are arguments. It
runs :meth:`Experiment.train_and_evaluate`'s loop; an evaluator in another
process is :meth:`Experiment.continuous_eval`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

from .._core._errors import UnsupportedArgumentError
from .._core._scaffold import Scaffold
from .._core._state import TrainState
from ..metrics import Metric
from ._arguments import check_count, check_seconds
from ._errors import ExperimentConfigError
from ._evaluate import EvaluationResult, check_metrics
from ._experiment import Experiment, check_session_options, refuse_export, with_checkpoint_options

__all__ = ["EvalSpec", "TrainSpec", "train_and_evaluate"]

StepFn = Callable[..., Any]
InputFn = Callable[[], Iterable[Any] | AsyncIterable[Any]]


@final
@dataclass(frozen=True, slots=True)
class TrainSpec:
    """What to train: TF's ``TrainSpec(input_fn, max_steps, hooks)``.

    ``train_fn(state, batch)`` runs for each batch of ``input_fn()``
    (``train_fn(state)`` without an input: a hook feeds it); training stops at
    global step ``max_steps`` (``None``: when the input ends or a hook stops it).
    ``input_fn()`` returns an iterable, an async iterable, a function of the
    batch index or a :mod:`monitored.data` pipeline; it is read through
    :func:`monitored.data.prefetch`, whose position is saved with every
    checkpoint: a run resumed from ``model_dir`` trains on exactly the batches
    an uninterrupted run would have, provided ``input_fn()`` yields the same
    batches each time it is called (seeded).
    """

    train_fn: StepFn
    input_fn: InputFn | None = None
    max_steps: int | None = None
    hooks: Sequence[object] = ()

    def __post_init__(self) -> None:
        if not callable(self.train_fn):
            raise ExperimentConfigError(f"TrainSpec(train_fn={self.train_fn!r}): not callable")
        check_count("TrainSpec", "max_steps", self.max_steps)


@final
@dataclass(frozen=True, slots=True)
class EvalSpec:
    """How to evaluate: TF's ``EvalSpec`` (input, steps, name, hooks, delays).

    ``eval_fn(state, batch, metrics=metrics)`` updates ``metrics`` for each batch
    of ``input_fn()`` (see :func:`evaluate_once`), for ``steps`` steps or until
    the input ends (``None``, the default here; TF's was 100). A new checkpoint
    is evaluated at most every ``throttle_secs`` seconds (TF's 600); summaries go
    to ``<model_dir>/eval`` (``eval_<name>``). ``start_delay_secs`` is the wait
    of an evaluator in another process (:meth:`Experiment.continuous_eval`): in
    one process it has no effect (TF ignored it locally too). Each evaluation
    calls ``input_fn()`` afresh and reads it from its first batch. TF's
    ``exporters`` are refused: nothing here exports a SavedModel.
    """

    eval_fn: StepFn
    metrics: Mapping[str, Metric]
    input_fn: InputFn | None = None
    steps: int | None = None
    name: str | None = None
    hooks: Sequence[object] = ()
    start_delay_secs: float = 120
    throttle_secs: float = 600
    exporters: None = None

    def __post_init__(self) -> None:
        if self.exporters is not None:
            raise UnsupportedArgumentError(refuse_export("EvalSpec(exporters=...)"))
        if not callable(self.eval_fn):
            raise ExperimentConfigError(f"EvalSpec(eval_fn={self.eval_fn!r}): not callable")
        check_metrics(self.metrics, "EvalSpec(metrics=...)", error=ExperimentConfigError)
        check_count("EvalSpec", "steps", self.steps)
        check_seconds("EvalSpec", "start_delay_secs", self.start_delay_secs)
        check_seconds("EvalSpec", "throttle_secs", self.throttle_secs)


async def train_and_evaluate(
    train_spec: TrainSpec,
    eval_spec: EvalSpec,
    *,
    model_dir: str | os.PathLike[str] | None = None,
    state: TrainState | None = None,
    scaffold: Scaffold | None = None,
    min_eval_frequency: int | None = None,
    keep_checkpoint_max: int | None = None,
    keep_checkpoint_every_n_hours: float | None = None,
    **session_options: Any,
) -> EvaluationResult:
    """Train as ``train_spec`` says, evaluating as ``eval_spec`` says; the final result.

    TF's local ``train_and_evaluate``: training checkpoints into ``model_dir``
    (with the ``monitored-checkpoint`` plugin; ``save_checkpoint_steps=`` or
    ``save_checkpoint_secs=`` among ``session_options`` set how often, TF's
    default being every 600 s); at a new checkpoint, if the last evaluation
    started ``eval_spec.throttle_secs`` or more ago, the state saved is
    evaluated before the next step; the final state is evaluated when training
    ends. ``min_eval_frequency`` (``Experiment``'s) also asks for this many
    global steps between evaluations (``None``: any new checkpoint; ``0``: only
    the final state). Without a ``model_dir`` the state in memory is evaluated
    every ``min_eval_frequency`` steps, or every ``throttle_secs`` seconds if it
    is ``None``, and at the end. Every result reaches the training
    session's hooks and plugins (``after_evaluate``): early stopping can watch a
    held-out metric. An evaluation that raises stops training
    (:class:`EvaluationFailedError`). ``session_options`` go to
    :func:`~monitored.MonitoredTrainingSession`.

    TF's ``RunConfig`` fields are keyword arguments: ``model_dir``,
    ``save_checkpoint_steps``/``save_checkpoint_secs`` (TF's
    ``save_checkpoints_*``), ``keep_checkpoint_max`` and
    ``keep_checkpoint_every_n_hours`` (the checkpoint plugin's ``max_to_keep``
    and ``keep_checkpoint_every_n_hours`` options), ``save_summaries_steps``
    (TF's ``save_summary_steps``) and ``log_step_count_steps``. A ``RunConfig``
    spelling gets a message naming the argument to use.
    """
    if not isinstance(train_spec, TrainSpec):
        raise ExperimentConfigError(
            f"train_and_evaluate(train_spec=...): a TrainSpec, not {type(train_spec).__name__}"
        )
    if not isinstance(eval_spec, EvalSpec):
        raise ExperimentConfigError(
            f"train_and_evaluate(eval_spec=...): an EvalSpec, not {type(eval_spec).__name__}"
        )
    where = "train_and_evaluate"
    check_count(where, "min_eval_frequency", min_eval_frequency, zero=True)
    check_session_options(where, session_options)
    session_options = with_checkpoint_options(
        where, session_options, keep_checkpoint_max, keep_checkpoint_every_n_hours
    )
    experiment = Experiment(
        train_spec.train_fn,
        eval_spec.eval_fn,
        eval_spec.metrics,
        train_input_fn=train_spec.input_fn,
        eval_input_fn=eval_spec.input_fn,
        model_dir=model_dir,
        state=state,
        scaffold=scaffold,
        train_steps=train_spec.max_steps,
        eval_steps=eval_spec.steps,
        train_hooks=train_spec.hooks,
        eval_hooks=eval_spec.hooks,
        eval_delay_secs=eval_spec.start_delay_secs,
        continuous_eval_throttle_secs=eval_spec.throttle_secs,
        min_eval_frequency=min_eval_frequency,
        **session_options,
    )
    experiment._where = where
    return await experiment._train_and_evaluate(
        min_steps=experiment.min_eval_frequency,
        min_secs=eval_spec.throttle_secs,
        name=eval_spec.name,
        by_steps=min_eval_frequency is not None,
    )
