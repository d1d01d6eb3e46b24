"""``Experiment``: TF's ``tf.contrib.learn.Experiment`` on the core session.

An experiment holds what training and evaluation need (step functions, input
functions, metrics, the model directory, the state) and runs them in TF's ways:
``train()``, ``evaluate()``, ``continuous_eval()`` (an evaluator process
following the model directory), ``train_and_evaluate()`` (evaluation
interleaved with training in one process) and ``continuous_train_and_eval()``
(alternating rounds). Every loop is a ``MonitoredTrainingSession`` or an
:func:`evaluate_once` / :func:`evaluate_repeatedly`: nothing here steps a model
by itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import math
import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final

import anyio

from .._core._basic_hooks import GlobalStepWaiterHook, StopAtStepHook
from .._core._errors import UnsupportedArgumentError
from .._core._scaffold import Scaffold
from .._core._state import TrainState
from .._core._training_session import MonitoredTrainingSession
from ..data._prefetch import FeedingPipeline, Pipeline, prefetch
from ..metrics import Metric
from ._arguments import check_count, check_seconds
from ._errors import ExperimentConfigError
from ._evaluate import (
    EvaluationResult,
    check_metrics,
    default_summary_dir,
    evaluate_once,
    evaluate_repeatedly,
)
from ._hook import EvaluationHook
from ._interleave import EvaluateNewCheckpoints

__all__ = ["Experiment"]

log = logging.getLogger("monitored")

StepFn = Callable[..., Any]
InputFn = Callable[[], Iterable[Any] | AsyncIterable[Any]]

#: ``MonitoredTrainingSession`` arguments an ``Experiment`` sets itself.
_OWN_SESSION_ARGUMENTS: Final = frozenset(
    {"state", "checkpoint_dir", "hooks", "scaffold", "is_chief"}
)
#: What ``anext`` gives at the end of the training input.
_END: Final = object()
#: ``continuous_train_and_eval`` rounds without ``train_steps`` (TF's default).
_DEFAULT_STEPS_PER_ITERATION: Final = 1000
#: The pipeline the training input goes through: ``input:train_input_fn`` in checkpoints.
TRAIN_INPUT_NAME: Final = "train_input_fn"
#: TF ``RunConfig`` fields spelled differently here: the name to use instead.
_RUN_CONFIG_SPELLINGS: Final = {
    "save_checkpoints_steps": "save_checkpoint_steps",
    "save_checkpoints_secs": "save_checkpoint_secs",
    "save_summary_steps": "save_summaries_steps",
    "save_summary_secs": "save_summaries_secs",
}
#: TF ``RunConfig`` and its fields with no meaning here: what to do instead.
_RUN_CONFIG_UNSUPPORTED: Final = {
    "config": "TF's RunConfig is not taken as an object: pass its fields as keyword "
    "arguments (model_dir=, save_checkpoint_steps=, keep_checkpoint_max=, ...; the table "
    "in docs/tf1-migration.md maps each)",
    "tf_random_seed": "seed the state (TrainState(seed=...), its state.rng is checkpointed) "
    "and your input function's own generator",
    "session_config": "there is no TF session to configure",
    "device_fn": "arrays stay where the step puts them (NumPy or CuPy)",
    "train_distribute": "several processes train through the monitored-mpi plugin, "
    "started with mpiexec (docs/scaling-out.md)",
    "eval_distribute": "several processes evaluate through the monitored-mpi plugin "
    "(docs/scaling-out.md)",
}


class Experiment:
    """Training and evaluation of one model, run the ways TF's ``Experiment`` runs them.

    TF's ``estimator`` becomes the step functions, ``state`` (a
    :class:`~monitored.TrainState`, empty by default), ``scaffold`` (its
    ``init_fn`` initializes a fresh state) and ``model_dir`` (checkpoints, with
    the ``monitored-checkpoint`` plugin; summaries with ``monitored-summaries``).
    ``train_fn(state, batch)`` is a training step for each batch of
    ``train_input_fn()`` (``train_fn(state)`` without one: a hook such as
    ``monitored.data.prefetch`` feeds it); ``eval_fn(state, batch, metrics=...)``
    updates ``eval_metrics`` for each batch of ``eval_input_fn()`` (see
    :func:`evaluate_once`). Input functions are called again for each training
    run and each evaluation.

    TF's arguments keep their meaning: ``train_steps`` (train up to this global
    step; ``None`` forever), ``eval_steps`` (``None``: until the eval input ends;
    TF's default was 100), ``train_hooks`` (``train_monitors`` too), ``eval_hooks``,
    ``eval_delay_secs`` (``evaluate`` and ``continuous_eval`` wait this long
    first), ``continuous_eval_throttle_secs`` (``continuous_eval`` evaluates a new
    checkpoint at most this often), ``min_eval_frequency`` (``train_and_evaluate``
    evaluates a new checkpoint at most every this many steps; ``0``: only after
    training; ``None``: 1), ``delay_workers_by_global_step`` and
    ``train_steps_per_iteration`` (``continuous_train_and_eval``'s round
    length; ``None``: a tenth of ``train_steps``, or 1000). ``is_chief`` and
    ``task_id`` place this process in a distributed job (worker ``task_id``
    starts later, as in TF). Other keyword arguments go to
    :func:`~monitored.MonitoredTrainingSession` (``save_checkpoint_steps=...``,
    ``disable_plugins=...``): TF's ``RunConfig``, whose ``keep_checkpoint_max``
    and ``keep_checkpoint_every_n_hours`` are arguments here too (they set the
    checkpoint plugin's ``max_to_keep`` and ``keep_checkpoint_every_n_hours``
    options). ``export_strategies`` is refused: nothing here exports models.

    The training input goes through :func:`monitored.data.prefetch` (named
    ``train_input_fn``; an input function may also return a pipeline of its
    own): its position is saved with every checkpoint, so a run resumed from
    ``model_dir`` sees exactly the batches an uninterrupted one sees, and one
    training run after another (``continuous_train_and_eval``'s rounds, a
    second ``train()``) goes on where the last one stopped.

    Bad arguments raise :class:`ExperimentConfigError` naming the argument.
    """

    __slots__ = (
        "_stopped_by_signal",
        "_train_input_position",
        "_where",
        "continuous_eval_throttle_secs",
        "delay_workers_by_global_step",
        "eval_delay_secs",
        "eval_fn",
        "eval_hooks",
        "eval_input_fn",
        "eval_metrics",
        "eval_steps",
        "is_chief",
        "min_eval_frequency",
        "model_dir",
        "scaffold",
        "session_options",
        "state",
        "task_id",
        "train_fn",
        "train_hooks",
        "train_input_fn",
        "train_steps",
        "train_steps_per_iteration",
    )

    def __init__(
        self,
        train_fn: StepFn,
        eval_fn: StepFn,
        eval_metrics: Mapping[str, Metric],
        *,
        train_input_fn: InputFn | None = None,
        eval_input_fn: InputFn | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        state: TrainState | None = None,
        scaffold: Scaffold | None = None,
        train_steps: int | None = None,
        eval_steps: int | None = None,
        train_hooks: Sequence[object] = (),
        eval_hooks: Sequence[object] = (),
        eval_delay_secs: float = 120,
        continuous_eval_throttle_secs: float = 60,
        min_eval_frequency: int | None = None,
        delay_workers_by_global_step: bool = False,
        train_steps_per_iteration: int | None = None,
        is_chief: bool = True,
        task_id: int = 0,
        train_monitors: Sequence[object] | None = None,
        export_strategies: None = None,
        keep_checkpoint_max: int | None = None,
        keep_checkpoint_every_n_hours: float | None = None,
        **session_options: Any,
    ) -> None:
        where = "Experiment"
        if export_strategies is not None:
            raise UnsupportedArgumentError(refuse_export(f"{where}(export_strategies=...)"))
        for name, fn in {"train_fn": train_fn, "eval_fn": eval_fn}.items():
            if not callable(fn):
                raise ExperimentConfigError(
                    f"{where}({name}={fn!r}): give a step function (state, batch) -> outputs"
                )
        for name, input_fn in {
            "train_input_fn": train_input_fn,
            "eval_input_fn": eval_input_fn,
        }.items():
            if input_fn is not None and not callable(input_fn):
                raise ExperimentConfigError(
                    f"{where}({name}={input_fn!r}): give a function returning a fresh "
                    "iterable of batches (it is called for each run)"
                )
        check_metrics(eval_metrics, f"{where}(eval_metrics=...)", error=ExperimentConfigError)
        check_count(where, "train_steps", train_steps)
        check_count(where, "eval_steps", eval_steps)
        check_count(where, "min_eval_frequency", min_eval_frequency, zero=True)
        check_count(where, "train_steps_per_iteration", train_steps_per_iteration)
        check_count(where, "task_id", task_id, zero=True)
        check_seconds(where, "eval_delay_secs", eval_delay_secs)
        check_seconds(where, "continuous_eval_throttle_secs", continuous_eval_throttle_secs)
        if state is not None and not isinstance(state, TrainState):
            raise ExperimentConfigError(
                f"{where}(state=...): a monitored.TrainState, not {type(state).__name__}"
            )
        check_session_options(where, session_options)
        session_options = with_checkpoint_options(
            where, session_options, keep_checkpoint_max, keep_checkpoint_every_n_hours
        )
        self.train_fn = train_fn
        self.eval_fn = eval_fn
        self.eval_metrics = eval_metrics
        self.train_input_fn = train_input_fn
        self.eval_input_fn = eval_input_fn
        self.model_dir = os.fspath(model_dir) if model_dir is not None else None
        self.state = state if state is not None else TrainState()
        self.scaffold = scaffold
        self.train_steps = train_steps
        self.eval_steps = eval_steps
        self.train_hooks: list[object] = [*train_hooks, *(train_monitors or ())]
        self.eval_hooks = list(eval_hooks)
        self.eval_delay_secs = eval_delay_secs
        self.continuous_eval_throttle_secs = continuous_eval_throttle_secs
        self.min_eval_frequency = 1 if min_eval_frequency is None else min_eval_frequency
        self.delay_workers_by_global_step = delay_workers_by_global_step
        self.train_steps_per_iteration = train_steps_per_iteration
        self.is_chief = is_chief
        self.task_id = task_id
        self.session_options = session_options
        #: How errors name what was called (``train_and_evaluate`` sets its own name).
        self._where = where
        #: Where the training input stopped at the end of the last training run.
        self._train_input_position: dict[str, Any] | None = None
        #: The signal that stopped the last training session, if one did.
        self._stopped_by_signal: str | None = None

    #: ``continuous_train_and_eval``'s evaluations: their summaries' name (``eval_<name>``),
    #: and whether a round stops at ``train_steps`` (contrib's Experiment: ``one_pass``,
    #: and whole rounds).
    _round_eval_name: ClassVar[str | None] = None
    _rounds_end_at_train_steps: ClassVar[bool] = True

    # -- the methods TF's Experiment has ---------------------------------------------------
    async def train(self, delay_secs: float | None = None) -> TrainState:
        """Train up to ``train_steps`` (or until the input ends); return the state.

        With ``delay_secs=None``, worker ``task_id`` waits ``min(60, 5 * task_id)``
        seconds first, or, with ``delay_workers_by_global_step``, until the global
        step reaches ``int(8000 * log(task_id + 1))`` (TF's schedule); the chief
        (task 0) starts at once.
        """
        hooks: list[object] = []
        if delay_secs is None:
            if self.delay_workers_by_global_step:
                hooks.append(GlobalStepWaiterHook(int(8000.0 * math.log(self.task_id + 1))))
                delay_secs = 0
            else:
                delay_secs = min(60, self.task_id * 5)
        check_seconds("Experiment.train", "delay_secs", delay_secs)
        if delay_secs > 0:
            log.info("Waiting %g s before starting training (task %d)", delay_secs, self.task_id)
            await anyio.sleep(delay_secs)
        await self._train([*hooks, *self._stop_hooks()])
        return self.state

    async def evaluate(
        self, delay_secs: float | None = None, name: str | None = None
    ) -> EvaluationResult:
        """Evaluate the newest checkpoint of ``model_dir`` once, after ``delay_secs``.

        ``delay_secs=None`` waits ``eval_delay_secs``. Without a ``model_dir`` the
        state in memory is evaluated (it must have been trained or restored). A
        ``model_dir`` without a checkpoint is a :class:`NoCheckpointError` naming it.
        Summaries go to ``<model_dir>/eval`` (``eval_<name>`` with a ``name``).
        """
        await self._delay("evaluate", delay_secs)
        options = self._eval_options(name)
        if self.model_dir is None:
            if not self.state.initialized:
                raise ExperimentConfigError(
                    "Experiment.evaluate(): no model_dir and the state in memory was never "
                    "trained or restored: give model_dir= or call train() first"
                )
            options["state"] = self.state
        else:
            options["checkpoint_dir"] = self.model_dir
        return await evaluate_once(
            self.eval_fn,
            self.eval_metrics,
            input=self.eval_input_fn() if self.eval_input_fn is not None else None,
            **options,
        )

    async def continuous_eval(
        self,
        delay_secs: float | None = None,
        throttle_delay_secs: float | None = None,
        continuous_eval_predicate_fn: Callable[[EvaluationResult], bool] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - TF1's argument: no new checkpoint for this long
        name: str | None = None,
    ) -> list[EvaluationResult]:
        """Evaluate each new checkpoint of ``model_dir`` as training writes them.

        The evaluator job of a distributed run, or a second process beside
        training: waits ``delay_secs`` (``None``: ``eval_delay_secs``), then
        follows the directory with :func:`evaluate_repeatedly`, a new checkpoint at
        most every ``throttle_delay_secs`` (``None``:
        ``continuous_eval_throttle_secs``). Ends after evaluating a checkpoint of
        step ``train_steps`` or later (training is over), when
        ``continuous_eval_predicate_fn(result)`` returns false, or after
        ``timeout`` seconds without a new checkpoint. Returns every result.
        """
        if self.model_dir is None:
            raise ExperimentConfigError(
                "Experiment.continuous_eval() follows a checkpoint directory: give model_dir="
            )
        throttle = (
            self.continuous_eval_throttle_secs
            if throttle_delay_secs is None
            else throttle_delay_secs
        )
        check_seconds("Experiment.continuous_eval", "throttle_delay_secs", throttle)
        await self._delay("continuous_eval", delay_secs)
        train_steps = self.train_steps

        def done(result: EvaluationResult) -> bool:
            if train_steps is not None and result.global_step >= train_steps:
                log.info(
                    "Evaluated step %d of %d: training is over", result.global_step, train_steps
                )
                return True
            return continuous_eval_predicate_fn is not None and not continuous_eval_predicate_fn(
                result
            )

        return await evaluate_repeatedly(
            self.model_dir,
            self.eval_fn,
            self.eval_metrics,
            input_fn=self.eval_input_fn,
            eval_interval_secs=throttle,
            timeout=timeout,
            until=done,
            **self._eval_options(name),
        )

    async def train_and_evaluate(self) -> EvaluationResult:
        """Train, evaluating after new checkpoints and once at the end; the last result.

        In one process, interleaved: a checkpoint of ``min_eval_frequency`` or
        more steps after the last evaluation is evaluated as it is written,
        before the next training step (``0``: only the final state), and the final state is
        evaluated when training ends. Without a ``model_dir`` the state in
        memory is evaluated every ``min_eval_frequency`` steps. Every result
        reaches the training session's hooks and plugins through
        ``after_evaluate``. An evaluation that raises stops training
        (:class:`EvaluationFailedError`, the original as its cause).
        """
        return await self._train_and_evaluate(min_steps=self.min_eval_frequency, min_secs=0)

    async def continuous_train_and_eval(
        self,
        continuous_eval_predicate_fn: Callable[[EvaluationResult | None], bool] | None = None,
    ) -> EvaluationResult | None:
        """Alternate rounds of ``train_steps_per_iteration`` steps and an evaluation.

        Each round is a training session (resuming from ``model_dir``) that
        evaluates its final state before it closes, so the result reaches its
        plugins. Rounds go on while ``continuous_eval_predicate_fn(last_result)``
        is true (called with ``None`` first), until a result reaches
        ``train_steps``, or until training stops by itself within a round: a
        hook or plugin requested the stop (early stopping), or the input ended.
        Returns the last result.
        """
        per_round = self.train_steps_per_iteration
        if per_round is None:
            per_round = (
                max(1, self.train_steps // 10)
                if self.train_steps is not None
                else _DEFAULT_STEPS_PER_ITERATION
            )
        result: EvaluationResult | None = None
        while continuous_eval_predicate_fn is None or continuous_eval_predicate_fn(result):
            if (
                result is not None
                and self.train_steps is not None
                and result.global_step >= self.train_steps
            ):
                break
            evaluation = self._evaluation(min_steps=0, min_secs=0, name=self._round_eval_name)
            capped = self._stop_hooks() if self._rounds_end_at_train_steps else []
            stopped = await self._train([evaluation, *capped], steps=per_round)
            if evaluation.results:
                result = evaluation.results[-1]
            if stopped:
                log.info("Training stopped within a round (step %d): done", self.state.global_step)
                break
        return result

    # -- the shared pieces --------------------------------------------------------------------
    async def _train_and_evaluate(
        self, *, min_steps: int, min_secs: float, name: str | None = None, by_steps: bool = True
    ) -> EvaluationResult:
        evaluation = self._evaluation(
            min_steps=min_steps, min_secs=min_secs, name=name, by_steps=by_steps
        )
        await self._train([evaluation, *self._stop_hooks()])
        return dataclasses.replace(
            evaluation.results[-1], stopped_by_signal=self._stopped_by_signal
        )

    def _evaluation(
        self, *, min_steps: int, min_secs: float, name: str | None, by_steps: bool = True
    ) -> EvaluateNewCheckpoints | EvaluationHook:
        """The hook that evaluates inside training: after checkpoints, or every N steps.

        Without checkpoints the state in memory is evaluated every ``min_steps``
        steps, or every ``min_secs`` seconds when ``by_steps`` is false.
        """
        options = self._eval_options(name)
        by_secs = not by_steps and min_secs > 0
        if self.model_dir is None and min_steps > 0:
            return EvaluationHook(
                self.eval_fn,
                self.eval_metrics,
                input_fn=self.eval_input_fn,
                every_n_steps=None if by_secs else min_steps,
                every_n_secs=min_secs if by_secs else None,
                at_end=True,
                **options,
            )
        return EvaluateNewCheckpoints(
            self.eval_fn,
            self.eval_metrics,
            input_fn=self.eval_input_fn,
            min_steps=min_steps,
            min_secs=min_secs,
            **options,
        )

    def _eval_options(self, name: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"eval_steps": self.eval_steps, "hooks": self.eval_hooks}
        folder = f"eval_{name}" if name else "eval"
        if self.session_options.get("summary_dir"):
            options["summary_dir"] = os.path.join(self.session_options["summary_dir"], folder)
        elif self.model_dir is not None:
            # None (summaries off, said once) for an evaluator that may only read model_dir.
            options["summary_dir"] = default_summary_dir(self.model_dir, folder)
        for key in ("disable_plugins", "plugin_options"):
            if key in self.session_options:
                options[key] = self.session_options[key]
        return options

    def _stop_hooks(self) -> list[object]:
        return [] if self.train_steps is None else [StopAtStepHook(last_step=self.train_steps)]

    async def _delay(self, method: str, delay_secs: float | None) -> None:
        delay = self.eval_delay_secs if delay_secs is None else delay_secs
        check_seconds(f"Experiment.{method}", "delay_secs", delay)
        if delay > 0:
            log.info("Waiting %g s before evaluating", delay)
            await anyio.sleep(delay)

    async def _train(self, hooks: list[object], *, steps: int | None = None) -> bool:
        """One training session over ``train_input_fn()``: the one training loop.

        The input is read through an input pipeline (:meth:`_train_input`) from
        where the last run stopped, or from the checkpoint's position.

        With ``steps``, the session closes (normally: ``end`` hooks run, a last
        checkpoint is written) once it has trained that many steps. Returns
        whether training stopped by itself before that: a stop was requested or
        the input ended.
        """
        scaffold = self.scaffold
        if self.model_dir is None and self.state.initialized:
            # Nothing to restore from: the state in memory goes on, not re-initialized.
            scaffold = Scaffold(init_fn=None, copy_from_scaffold=scaffold or Scaffold())
        pipeline = self._train_input()
        async with MonitoredTrainingSession(
            self.state,
            checkpoint_dir=self.model_dir,
            is_chief=self.is_chief,
            scaffold=scaffold,
            hooks=[*([pipeline] if pipeline is not None else []), *self.train_hooks, *hooks],
            **self.session_options,
        ) as sess:
            last = None if steps is None else self.state.global_step + steps
            batches = None if isinstance(pipeline, FeedingPipeline) else pipeline
            stopped = True
            while not sess.should_stop():
                if last is not None and self.state.global_step >= last:
                    stopped = False  # before a batch is taken: it is the next run's first
                    break
                if batches is None:
                    await sess.run(self.train_fn)
                    continue
                batch = await anext(batches, _END)
                if batch is _END:
                    break
                await sess.run(self.train_fn, batch)
        if pipeline is not None and pipeline.name == TRAIN_INPUT_NAME:
            self._train_input_position = pipeline.plugin_state()
        self._stopped_by_signal = sess.stopped_by_signal
        return stopped

    def _train_input(self) -> Pipeline | None:
        """``train_input_fn()`` as an input pipeline, at the last run's position.

        An iterable, async iterable or function of the batch index goes through
        :func:`~monitored.data.prefetch` (named ``train_input_fn``, read in
        tasks on the event loop's thread); a pipeline the input function made
        itself (worker threads, several workers) is used as it is. The position is the
        one the last training run of this Experiment ended at; restoring a
        checkpoint replaces it with the checkpoint's.
        """
        if self.train_input_fn is None:
            return None
        source = self.train_input_fn()
        if isinstance(source, Pipeline):
            return source  # the input function's own: its name, its position
        try:
            # Batches of any kind, as before (the step decides what it takes): no
            # structure check. Read on the event loop's thread, as before: an input
            # function's generator never runs beside the step (it need not be
            # thread-safe), and a batch costs microseconds, not a thread hand-off.
            pipeline = prefetch(source, name=TRAIN_INPUT_NAME, check=False, threads=False)
        except (TypeError, ValueError) as exc:
            what = "TrainSpec(input_fn=...)" if self._where != "Experiment" else "train_input_fn"
            raise ExperimentConfigError(
                f"{self._where}: {what} returned {type(source).__name__}, which cannot be "
                f"read as training input: {exc}"
            ) from exc
        if self._train_input_position is not None:
            pipeline.load_plugin_state(self._train_input_position)
        return pipeline


def refuse_export(where: str) -> str:
    """The message refusing TF's model export arguments (``export_strategies``, ``exporters``)."""
    return (
        f"{where}: nothing here exports models (there is no SavedModel); drop it. The "
        "checkpoints in model_dir (or the returned state) hold the trained arrays, and "
        "serving is a predict function of your own over them: see 'Serving a trained "
        "model' in docs/evaluation.md"
    )


def check_session_options(where: str, session_options: Mapping[str, Any]) -> None:
    """Refuse a keyword that is not a ``MonitoredTrainingSession`` argument to pass on.

    TF ``RunConfig`` fields get a message of their own: the spelling to use, or
    what takes their place here.
    """
    known = set(inspect.signature(MonitoredTrainingSession).parameters)
    for name in session_options:
        if name in _RUN_CONFIG_UNSUPPORTED:
            raise UnsupportedArgumentError(
                f"{where}({name}=...): TF's RunConfig; not needed here: "
                f"{_RUN_CONFIG_UNSUPPORTED[name]}"
            )
        if name in _RUN_CONFIG_SPELLINGS:
            raise ExperimentConfigError(
                f"{where}({name}=...): TF's RunConfig spelling; here it is "
                f"{_RUN_CONFIG_SPELLINGS[name]}=..."
            )
        if name in _OWN_SESSION_ARGUMENTS or name not in known:
            close = difflib.get_close_matches(name, sorted(known - _OWN_SESSION_ARGUMENTS), n=1)
            hint = f"; did you mean {close[0]}=...?" if close else ""
            article = "an" if where[0] in "AEIOU" else "a"
            raise ExperimentConfigError(
                f"{where}({name}=...): not {article} {where} argument nor one it passes to "
                "MonitoredTrainingSession (those it sets itself: "
                f"{', '.join(sorted(_OWN_SESSION_ARGUMENTS))}){hint}"
            )


def with_checkpoint_options(
    where: str,
    session_options: dict[str, Any],
    keep_checkpoint_max: int | None,
    keep_checkpoint_every_n_hours: float | None,
) -> dict[str, Any]:
    """``session_options`` with RunConfig's checkpoint retention as checkpoint plugin options.

    ``keep_checkpoint_max`` becomes ``plugin_options["checkpoint"]["max_to_keep"]``
    and ``keep_checkpoint_every_n_hours`` the option of that name; setting one
    both ways is refused, as two answers to one question.
    """
    check_count(where, "keep_checkpoint_max", keep_checkpoint_max, zero=True)
    if keep_checkpoint_every_n_hours is not None and (
        isinstance(keep_checkpoint_every_n_hours, bool)
        or not isinstance(keep_checkpoint_every_n_hours, int | float)
        or not keep_checkpoint_every_n_hours > 0
    ):
        raise ExperimentConfigError(
            f"{where}(keep_checkpoint_every_n_hours={keep_checkpoint_every_n_hours!r}): "
            "give a positive number of hours"
        )
    given = {
        "max_to_keep": keep_checkpoint_max,
        "keep_checkpoint_every_n_hours": keep_checkpoint_every_n_hours,
    }
    retention = {option: value for option, value in given.items() if value is not None}
    if not retention:
        return session_options
    plugin_options = session_options.get("plugin_options") or {}
    if not isinstance(plugin_options, Mapping):
        return session_options  # the session refuses it, naming what it is
    checkpoint = dict(plugin_options.get("checkpoint") or {})
    for option, value in retention.items():
        if option in checkpoint:
            argument = "keep_checkpoint_max" if option == "max_to_keep" else option
            raise ExperimentConfigError(
                f"{where}({argument}=...) and plugin_options={{'checkpoint': "
                f"{{'{option}': ...}}}} set the same option: give one"
            )
        checkpoint[option] = value
    return {**session_options, "plugin_options": {**plugin_options, "checkpoint": checkpoint}}
