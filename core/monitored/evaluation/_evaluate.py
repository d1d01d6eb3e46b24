"""``evaluate_once`` and ``evaluate_repeatedly``: TF1's evaluation loops on the core session.

An evaluation is a :class:`~monitored.MonitoredSession` whose step function
updates metrics: the session restores the state from a checkpoint (through the
checkpoint plugin) or evaluates a given state, runs the eval step over the input
until it ends or for ``eval_steps`` steps, calls the eval hooks, and the results
are handed to summary sinks (``write_summaries``) for ``<model_dir>/eval``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol, final

import anyio
import anyio.lowlevel
import numpy as np

from .._core._basic_hooks import FinalOpsHook
from .._core._capabilities import Provider, provider
from .._core._cluster import LocalCluster
from .._core._config import TrainingConfig
from .._core._errors import DamagedCheckpointError, OutOfRangeError
from .._core._printable import printable
from .._core._scaffold import Scaffold
from .._core._session import MonitoredSession
from .._core._state import TrainState
from ..data import FeedingPipeline, Pipeline
from ..metrics import Mean, Metric
from ._errors import NoCheckpointError, NoMetricUpdatesError

__all__ = [
    "EvaluationResult",
    "EvaluationSession",
    "check_metrics",
    "evaluate_once",
    "evaluate_repeatedly",
]

log = logging.getLogger("monitored")

StepFn = Callable[..., Any]


@final
@dataclass(frozen=True, slots=True)
class EvaluationResult:
    """What one evaluation gives: TF1's ``Estimator.evaluate`` dictionary, and more.

    ``metrics`` maps each metric's key to its result; ``global_step`` is the step
    of the state evaluated; ``steps`` counts the eval steps run;
    ``checkpoint_path`` is the checkpoint evaluated (``None`` for a given state);
    ``final_ops_values`` what ``final_ops`` gave. The last result of
    ``train_and_evaluate`` also says whether a signal ended the training
    (``stopped_by_signal``: ``"SIGINT"``, ``"SIGTERM"`` or ``None``, as
    :attr:`MonitoredSession.stopped_by_signal <monitored.MonitoredSession.stopped_by_signal>`),
    so that a script can exit as interrupted rather than finished.
    """

    metrics: dict[str, float]
    global_step: int
    steps: int
    checkpoint_path: str | None = None
    final_ops_values: Any = field(default=None, compare=False)
    stopped_by_signal: str | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, float | int]:
        """``{**metrics, "global_step": step}``, the shape ``Estimator.evaluate`` returns."""
        return {**self.metrics, "global_step": self.global_step}


class EvaluationSession(MonitoredSession):
    """A ``MonitoredSession`` for evaluation: its global step does not move, silently.

    It leaves out the installed plugins marked ``training_only`` (early stopping,
    NaN guard, progress, checkpoint saving): configured for training, by
    ``plugin_options`` or ``MONITORED_PLUGIN_OPTIONS``, they would otherwise watch
    eval steps too, and could stop an evaluation early with partial metrics.
    Their training sessions hear the results (``after_evaluate``). It names its
    plugins at ``DEBUG`` level: training evaluates often, and the training
    session has named them already. It claims no run directory
    (``run_directories``): an evaluation reads a run and writes its results
    beside it (``<model_dir>/eval``), as evaluators always may (one writer per
    run is the training's); inside training the model directory is the training
    session's already, and a claim per evaluation cost three ``fsync``s.
    """

    _warn_stalled_global_step = False
    _plugins_log_level = logging.DEBUG
    _loads_training_only_plugins = False
    _claims_run_directories = False


#: Arguments of the sessions an evaluation makes, set by an evaluation inside
#: training (``TrainingEvaluation``) to what its training session knows already:
#: ``blocked_loop_warning_secs=None`` while the training session's watchdog
#: watches the loop (it names an eval step holding the loop as well), and
#: ``cluster=LocalCluster()`` when the training trains alone (no installed
#: plugin supplies a cluster to a process that trains alone). Each evaluation
#: then starts no watchdog thread and asks no plugin for a cluster.
SESSION_ARGUMENTS: ContextVar[Mapping[str, Any]] = ContextVar(
    "monitored_evaluation_session_arguments", default=MappingProxyType({})
)


@final
class _RestoreFromCheckpoint:
    """Restores the evaluated state from one checkpoint, through the checkpoint plugin.

    Only the chief restores (the session manager calls ``restore_state`` there)
    and the other processes receive its state. ``restored``: the chief's state
    holds the checkpoint already (:func:`_pick_together` restored it).
    """

    __slots__ = ("doing", "path", "restored")

    plugin_name = "evaluation-restore"

    def __init__(self, path: str, restored: bool = False, doing: str = "Evaluating") -> None:
        self.path = path
        self.restored = restored
        #: What the log line says is done with the checkpoint (``Estimator.predict`` predicts).
        self.doing = doing

    async def restore_state(self, session: MonitoredSession) -> str:
        if not self.restored:
            _checkpoint_module("evaluate a checkpoint").restore(session.state, self.path)
        log.info("%s %s (step %d)", self.doing, printable(self.path), session.state.global_step)
        return self.path


@final
class _PickCheckpoint:
    """The chief's pick of the checkpoint to evaluate, shared with every process.

    The chief picks when the session is created (``restore_state``, called
    there only): the newest usable checkpoint, or the next one a follower
    yields. Its choice, or that there is none and why, reaches the other
    processes with the chief's state (``plugin_state``, which the cluster
    shares), so that all evaluate the same checkpoint, or none, together:
    beside a trainer that is saving, processes that each listed the directory
    could pick different ones.
    """

    __slots__ = ("nothing", "path", "pick", "picked")

    plugin_name = "evaluation-pick"

    def __init__(self, pick: Callable[[_PickCheckpoint], Awaitable[str | None]]) -> None:
        #: Picks, on the chief, the checkpoint and restores it into the evaluation's
        #: state; ``None`` when there is none (left) to evaluate.
        self.pick = pick
        #: The checkpoint picked, or ``None``.
        self.path: str | None = None
        #: Whether the pick is known here (made on the chief, or shared by it).
        self.picked = False
        #: Why the chief picked none (the message of the error every process raises).
        self.nothing = ""

    async def restore_state(self, session: MonitoredSession) -> str | None:
        self.path = await self.pick(self)
        self.picked = True
        return self.path

    def plugin_state(self, session: MonitoredSession) -> dict[str, Any]:
        """The chief's pick, for the other processes (the cluster shares it)."""
        return {"path": self.path, "nothing": self.nothing}

    def load_plugin_state(
        self, session: MonitoredSession, state: Mapping[str, Any], version: int
    ) -> None:
        """Take the chief's pick (on the other processes of a cluster)."""
        path, nothing = state.get("path"), state.get("nothing")
        if not (path is None or isinstance(path, str)) or not isinstance(nothing, str):
            raise ValueError(f"the chief's pick of a checkpoint is malformed: {dict(state)!r}")
        self.path, self.nothing, self.picked = path, nothing, True


async def _pick_together(
    pick: Callable[[_PickCheckpoint], Awaitable[str | None]],
    *,
    disable_plugins: Iterable[str],
    plugin_options: Mapping[str, Mapping[str, Any]] | None,
    max_wait_secs: float = 7200,
) -> _PickCheckpoint:
    """Let the chief ``pick`` a checkpoint (restoring it), and tell every process which.

    A session of its own, before the evaluation's: an empty state, no summaries,
    none of the evaluation's hooks. The cluster shares the chief's pick with its
    (empty) state; alone, it is the pick. When nothing is picked, no evaluation
    session is made and nothing is written (a summary writer's ``START`` at
    step 1 would hide the earlier evaluations in TensorBoard). The other
    processes wait for the chief's pick at most ``max_wait_secs``.
    """
    chooser = _PickCheckpoint(pick)
    config = TrainingConfig(
        summary_dir=None,
        save_checkpoint_secs=None,
        save_summaries_steps=None,
        log_step_count_steps=None,
    )
    session = EvaluationSession(
        TrainState(),
        hooks=[chooser],
        disable_plugins=disable_plugins,
        plugin_options=plugin_options,
        training_config=config,
        max_wait_secs=max_wait_secs,
        **SESSION_ARGUMENTS.get(),
    )
    async with session as sess:
        if not chooser.picked:
            raise RuntimeError(
                f"the cluster {type(sess.cluster).__name__} did not share the chief's plugin "
                "states (its share_state must load them on every process with "
                "session.load_plugin_states), so this process does not know which "
                "checkpoint the chief evaluates"
            )
    return chooser


@final
class _StopAfterNEvals:
    """Requests a stop once ``eval_steps`` steps have run (TF1's ``_StopAfterNEvalsHook``)."""

    __slots__ = ("done", "eval_steps")

    plugin_name = "evaluation-steps"

    def __init__(self, eval_steps: int | None) -> None:
        self.eval_steps = eval_steps
        self.done = 0

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.done += 1
        if self.eval_steps is not None and self.done >= self.eval_steps:
            run_context.request_stop()
            # Logged as "stop requested by ...": say that an evaluation ended, not
            # training (this hook's name means nothing to a reader of the log).
            run_context.stop_requested_by = (
                f"eval_steps={self.eval_steps}: the evaluation of {self.eval_steps} "
                f"batch{'es' if self.eval_steps != 1 else ''} ended (this evaluation "
                "session stops, not training)"
            )


def _checkpoint_module(why: str) -> _Checkpoints:
    return _Checkpoints(provider("checkpoint", f"monitored.evaluation {why}s"))


class _CheckpointFollower(Protocol):
    """What a provider's ``checkpoints_iterator`` returns: new paths, and a way to hand one back."""

    def __aiter__(self) -> AsyncIterator[str]: ...

    def __anext__(self) -> Awaitable[str]: ...

    def reject(self, path: str, reason: str) -> None: ...


@final
class _Checkpoints:
    """The installed provider of ``"checkpoint"``, called through its capability hooks."""

    __slots__ = ("_provider",)

    #: What a provider raises for a checkpoint that is gone (``monitored-checkpoint``'s
    #: ``CheckpointNotFoundError`` is one).
    CheckpointNotFoundError = FileNotFoundError
    #: What it raises for one that is incomplete or damaged (its ``CorruptCheckpointError``).
    CorruptCheckpointError = DamagedCheckpointError

    def __init__(self, checkpoints: Provider) -> None:
        self._provider = checkpoints

    def restore(self, state: TrainState, path: str) -> Any:
        return self._provider.call("restore_checkpoint", state=state, path=path)

    def latest_checkpoint(self, checkpoint_dir: str | os.PathLike[str]) -> str | None:
        found = self._provider.call("latest_checkpoint", checkpoint_dir=os.fspath(checkpoint_dir))
        return None if found is None else str(found)

    def checkpoints_iterator(
        self,
        checkpoint_dir: str | os.PathLike[str],
        min_interval_secs: float = 0,
        timeout: float | None = None,
        timeout_fn: Callable[[], Any] | None = None,
        *,
        poll_secs: float | None = None,
    ) -> _CheckpointFollower:
        iterator: _CheckpointFollower = self._provider.call(
            "checkpoints_iterator",
            checkpoint_dir=os.fspath(checkpoint_dir),
            min_interval_secs=min_interval_secs,
            timeout=timeout,
            timeout_fn=timeout_fn,
            poll_secs=poll_secs,
        )
        return iterator


def _is_unusable(checkpoint: Any, error: BaseException) -> bool:
    """Whether ``error`` says that a checkpoint is not (yet) there: gone, incomplete or damaged.

    Not a checkpoint that does not fit the state, nor one of a newer format:
    those are the evaluator's configuration, and end it.
    """
    return isinstance(error, checkpoint.CheckpointNotFoundError | checkpoint.CorruptCheckpointError)


#: Summary directories found read-only and warned about, so that a loop warns once.
_READ_ONLY_SUMMARY_DIRS: set[str] = set()


def default_summary_dir(model_dir: str, name: str = "eval") -> str | None:
    """``<model_dir>/<name>``, where an evaluator's summaries go, or ``None`` if it is read-only.

    An evaluator may have read access only to the directory it follows: then
    summaries are off, with one warning (per directory and process) that says
    so and how to send them elsewhere (``summary_dir=``), rather than a failed
    evaluation. Checked on a local directory (the directory itself or its
    nearest existing parent must be writable); a URL is taken as writable.
    """
    target = os.path.join(model_dir, name)
    if "://" in model_dir or _may_create(target):
        return target
    key = os.path.abspath(target)
    if key not in _READ_ONLY_SUMMARY_DIRS:
        _READ_ONLY_SUMMARY_DIRS.add(key)
        log.warning(
            "Evaluation summaries are off: %s cannot be written (the model directory is "
            "read-only to this process); give summary_dir= to write them elsewhere",
            printable(target),
        )
    return None


def _may_create(path: str) -> bool:
    """Whether this process may create ``path`` as a directory, or write into it."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):  # the root exists: this ends
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return True  # not a directory: the summaries plugin says so, naming it
    return os.access(existing, os.W_OK | os.X_OK)


def check_options(
    *,
    eval_steps: object = None,
    checkpoint_path: object = None,
    checkpoint_dir: object = None,
    **others: object,
) -> None:
    """The checks of :func:`evaluate_once`'s options that need no session (``ValueError``)."""
    if eval_steps is not None and (
        isinstance(eval_steps, bool) or not isinstance(eval_steps, int) or eval_steps <= 0
    ):
        raise ValueError(f"eval_steps must be a positive int or None, got {eval_steps!r}")
    if checkpoint_path is not None and checkpoint_dir is not None:
        raise ValueError("give checkpoint_path or checkpoint_dir, not both")


def check_metrics(
    metrics: Mapping[str, Metric], where: str, *, error: type[Exception] | None = None
) -> None:
    """``metrics`` is a non-empty mapping of names to :class:`~monitored.metrics.Metric`.

    ``where`` names the argument in the message. Raises ``error`` when given
    (``ExperimentConfigError`` for an ``Experiment`` or ``EvalSpec``), else
    ``ValueError`` for no metrics and ``TypeError`` for a value that is not one.
    """
    if not isinstance(metrics, Mapping) or not metrics:
        raise (error or ValueError)(
            f"{where} needs at least one metric (metrics={{'name': Metric}}), got {metrics!r}"
        )
    for key, metric in metrics.items():
        if not isinstance(metric, Metric):
            raise (error or TypeError)(
                f"{where}: metrics[{key!r}] is {type(metric).__name__}; it must be a "
                "monitored.metrics Metric (Mean(), Accuracy(), AUC(), ...)"
            )


def _name(fn: object) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


async def evaluate_once(
    eval_fn: StepFn,
    metrics: Mapping[str, Metric],
    *,
    input: Iterable[Any] | AsyncIterable[Any] | None = None,
    state: TrainState | None = None,
    checkpoint_path: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    eval_steps: int | None = None,
    hooks: Sequence[object] = (),
    final_ops: Any = None,
    final_ops_feed_dict: Mapping[str, Any] | None = None,
    scaffold: Scaffold | None = None,
    summary_dir: str | os.PathLike[str] | None = None,
    disable_plugins: Iterable[str] = (),
    plugin_options: Mapping[str, Mapping[str, Any]] | None = None,
    sharded: bool = False,
) -> EvaluationResult:
    """Evaluate once: TF1's ``evaluate_once`` and ``Estimator.evaluate``.

    The eval step is called as ``eval_fn(state, batch, metrics=metrics)`` for each
    ``batch`` of ``input`` (or ``eval_fn(state, metrics=metrics)`` without an
    input) and **updates the metrics itself**, ``metrics["accuracy"].update(y, p)``;
    it may return outputs for the eval hooks, like a training step. Evaluation
    ends at the end of the input (``StopIteration`` or ``OutOfRangeError``, from
    the input or the step: a normal end), after ``eval_steps`` steps, or when a
    hook requests a stop. Metrics are reset first.

    What is evaluated: ``state`` as it is; or, with ``checkpoint_path`` (one
    checkpoint) or ``checkpoint_dir`` (its newest), a fresh state (or ``state``
    used as the template) restored by the checkpoint plugin. ``final_ops`` are
    evaluated at the end (see :class:`~monitored.FinalOpsHook`).

    Results are handed to summary sinks (the ``write_summaries`` hook) for the
    session's ``summary_dir``: ``summary_dir`` if given, else ``<model_dir>/eval``
    (the checkpoint's directory), unless this process may not write there: then
    none are written, and one warning says so.

    With ``checkpoint_dir``, the newest checkpoint that restores is evaluated:
    one deleted before it is read (a trainer rotating its checkpoints),
    incomplete or damaged is skipped with a warning naming it and why.

    With ``sharded=True`` each process of a distributed job (``mpiexec`` with
    ``monitored-mpi``) evaluates its own shard of the input and the metrics are
    merged across processes before the results are read, so every process gets
    the results over all shards (:meth:`~monitored.MonitoredSession.merge_metrics`).
    Shards may hold different numbers of batches (``monitored.data.shard`` of a
    set that does not divide evenly): before each step the processes count how
    many still have a batch (a metric merge: two small collectives), and a
    process whose shard is done takes part only in each step's stop agreement
    (no step, no hooks, not counted in ``steps``) until every shard is. An eval
    step or eval hook that calls collectives cannot take uneven shards. Alone, it
    changes nothing.

    In a distributed job the chief picks the checkpoint of ``checkpoint_dir``
    and restores it; its state and its choice reach every process, so all
    evaluate that one checkpoint (or all raise the same :class:`NoCheckpointError`).

    Raises :class:`NoMetricUpdatesError` when a step updated no metric,
    :class:`NoCheckpointError` when ``checkpoint_dir`` holds no usable checkpoint,
    :class:`~monitored.MissingPluginError` when evaluating a checkpoint without
    the checkpoint plugin, ``ValueError`` for ``eval_steps <= 0``.
    """
    check_options(
        eval_steps=eval_steps, checkpoint_path=checkpoint_path, checkpoint_dir=checkpoint_dir
    )
    check_metrics(metrics, "evaluate_once")
    if checkpoint_dir is None and checkpoint_path is None and state is None:
        raise ValueError(
            "evaluate_once needs something to evaluate: state=, checkpoint_path= or checkpoint_dir="
        )
    evaluate = functools.partial(
        _evaluate,
        eval_fn,
        metrics,
        input=input,
        state=state,
        eval_steps=eval_steps,
        hooks=hooks,
        final_ops=final_ops,
        final_ops_feed_dict=final_ops_feed_dict,
        scaffold=scaffold,
        summary_dir=summary_dir,
        disable_plugins=disable_plugins,
        plugin_options=plugin_options,
        sharded=sharded,
    )
    if checkpoint_dir is not None:
        return await _evaluate_newest(
            os.fspath(checkpoint_dir),
            state if state is not None else TrainState(),
            evaluate,
            disable_plugins=disable_plugins,
            plugin_options=plugin_options,
        )
    restorer = None
    if checkpoint_path is not None:
        _checkpoint_module("evaluate a checkpoint")
        restorer = _RestoreFromCheckpoint(os.fspath(checkpoint_path))
    return await evaluate(restorer)


async def _evaluate_newest(
    checkpoint_dir: str,
    state: TrainState,
    evaluate: Callable[..., Awaitable[EvaluationResult]],
    *,
    disable_plugins: Iterable[str],
    plugin_options: Mapping[str, Mapping[str, Any]] | None,
) -> EvaluationResult:
    """Evaluate the newest usable checkpoint of ``checkpoint_dir`` on ``state``.

    One that is deleted, incomplete or damaged when it is restored is skipped
    with a warning naming it and why, and the newest one left is evaluated:
    beside a trainer that keeps only its newest checkpoint, the one found may be
    gone before it is read. The chief picks it (:func:`_pick_together`).
    """
    checkpoint = _checkpoint_module("evaluate a checkpoint")

    async def newest(chooser: _PickCheckpoint) -> str | None:
        iterator = checkpoint.checkpoints_iterator(checkpoint_dir, timeout=0, poll_secs=0)
        skipped: list[str] = []
        async for path in iterator:  # each step polls once (timeout=0): it ends when none is left
            try:
                checkpoint.restore(state, path)
            except Exception as exc:
                if not _is_unusable(checkpoint, exc):
                    raise
                iterator.reject(path, _reason(checkpoint, exc))
                skipped.append(path)
                continue
            return path
        if not skipped and not await anyio.Path(checkpoint_dir).exists():
            chooser.nothing = f"checkpoint directory {checkpoint_dir} does not exist"
        else:
            chooser.nothing = (
                f"checkpoint directory {checkpoint_dir} holds no checkpoint to evaluate "
                + (
                    f"(skipped, unusable: {', '.join(map(printable, skipped))})"
                    if skipped
                    else "(has training written one yet?)"
                )
            )
        return None

    chooser = await _pick_together(
        newest, disable_plugins=disable_plugins, plugin_options=plugin_options
    )
    if chooser.path is None:
        # The chief's words (another process's, in a cluster), naming what it listed.
        raise NoCheckpointError(printable(chooser.nothing))
    return await evaluate(_RestoreFromCheckpoint(chooser.path, restored=True), state=state)


def _reason(checkpoint: Any, error: BaseException) -> str:
    """Why a checkpoint is skipped, for its warning."""
    if isinstance(error, checkpoint.CheckpointNotFoundError):
        return f"it was deleted before it could be read ({error})"
    return str(error)


async def _evaluate(
    eval_fn: StepFn,
    metrics: Mapping[str, Metric],
    restorer: _RestoreFromCheckpoint | None,
    *,
    input: Iterable[Any] | AsyncIterable[Any] | None,
    state: TrainState | None,
    eval_steps: int | None,
    hooks: Sequence[object],
    final_ops: Any,
    final_ops_feed_dict: Mapping[str, Any] | None,
    scaffold: Scaffold | None,
    summary_dir: str | os.PathLike[str] | None,
    disable_plugins: Iterable[str],
    plugin_options: Mapping[str, Mapping[str, Any]] | None,
    sharded: bool,
) -> EvaluationResult:
    """:func:`evaluate_once` of the checkpoint ``restorer`` restores (``None``: of ``state``).

    Summaries go to ``summary_dir``, else to ``eval`` beside the checkpoint.
    """
    if restorer is not None and summary_dir is None:
        summary_dir = default_summary_dir(os.path.dirname(restorer.path))
    eval_state = state if state is not None else TrainState()

    for metric in metrics.values():
        metric.reset()
    # A hook only where eval_steps asks for a stop: each hook a session registers
    # costs more than the steps of a small evaluation. The loop counts the steps.
    stopper = _StopAfterNEvals(eval_steps) if eval_steps is not None else None
    done = 0
    final = FinalOpsHook(final_ops, final_ops_feed_dict) if final_ops is not None else None
    session_hooks: list[object] = []
    if restorer is not None:
        session_hooks.append(restorer)
        if scaffold is None or scaffold.init_fn is None:
            # The chief's restore creates the arrays: the other processes of a
            # cluster create them from the chief's, as it does for an init_fn's.
            scaffold = Scaffold(init_fn=_filled_by_the_restore, copy_from_scaffold=scaffold)
    session_hooks += [*hooks, *([stopper] if stopper is not None else [])]
    if final is not None:
        session_hooks.append(final)
    # A summary schedule, so that a summaries plugin gives the session its writer
    # (the sink of the results); the global step never moves, so it fires once.
    config = TrainingConfig(
        summary_dir=os.fspath(summary_dir) if summary_dir is not None else None,
        save_checkpoint_secs=None,
        save_summaries_steps=1 if summary_dir is not None else None,
        log_step_count_steps=None,
        evaluation=True,
    )
    session = EvaluationSession(
        eval_state,
        hooks=session_hooks,
        scaffold=scaffold,
        disable_plugins=disable_plugins,
        plugin_options=plugin_options,
        training_config=config,
        **SESSION_ARGUMENTS.get(),
    )
    # Sharded, this loop decides where each process's input ends: an input
    # pipeline among the hooks must not stop every process at the shortest shard.
    feeding = [hook for hook in hooks if isinstance(hook, FeedingPipeline)]
    if sharded:
        counted = [input] if isinstance(input, Pipeline) else []
        session._inputs_counted_by_loop = (*counted, *feeding)
    values: dict[str, float] = {}
    async with session as sess:
        iterator = _batches(input)
        # Sharded over several processes, shards may differ in length: before each
        # step the processes count who still has a batch; one whose shard is done
        # only votes in the step's stop agreement (no step, no hooks) until every
        # shard is done, so the processes keep agreeing together and no batch is
        # left out. The input is `input`, else the pipelines feeding the eval step.
        together = (
            sharded
            and (iterator is not None or bool(feeding))
            and not isinstance(sess.cluster, LocalCluster)
        )
        exhausted = False
        while not sess.should_stop():
            before = sum(metric.updates for metric in metrics.values())
            try:
                batch: Any = None
                if iterator is not None:
                    batch = _END if exhausted else await iterator.next()
                    exhausted = batch is _END
                elif together and not exhausted:
                    exhausted = not all([await pipeline._has_next() for pipeline in feeding])
                if together:
                    if not _any_process_has_input(sess, not exhausted):
                        break
                    if exhausted:
                        sess._sit_out_step()  # no step, no hooks: only the agreement
                        await anyio.lowlevel.checkpoint()  # the loop's other tasks run
                        continue
                if iterator is None:
                    await sess.run(eval_fn, metrics=metrics)
                elif exhausted:
                    break
                else:
                    await sess.run(eval_fn, batch, metrics=metrics)
            except (StopIteration, StopAsyncIteration, OutOfRangeError):
                break
            done += 1
            if sum(metric.updates for metric in metrics.values()) == before:
                raise NoMetricUpdatesError(
                    f"eval step {_name(eval_fn)} updated none of the metrics "
                    f"{sorted(metrics)} in eval step {done} (global step "
                    f"{sess.state.global_step}); call metrics[name].update(...) in it"
                )
        if sharded:
            sess.merge_metrics(metrics.values())
        values = {key: metric.result() for key, metric in metrics.items()}
        step = sess.state.global_step
        if sess.has_summary_sinks:
            await sess.write_summaries(step, values)
    log.info(
        "Evaluation of step %d (%d eval step%s): %s",
        step,
        done,
        "" if done == 1 else "s",
        ", ".join(f"{k} = {v:.6g}" for k, v in values.items()),
    )
    return EvaluationResult(
        metrics=values,
        global_step=step,
        steps=done,
        checkpoint_path=restorer.path if restorer is not None else None,
        final_ops_values=final.final_ops_values if final is not None else None,
    )


def _filled_by_the_restore(state: TrainState) -> None:
    """The ``init_fn`` of an evaluation of a checkpoint: the chief's restore fills the state."""


def _any_process_has_input(session: MonitoredSession, has_input: bool) -> bool:
    """Whether any process of the session's cluster still has a batch to evaluate.

    Counted exactly through the cluster's metric merge (one count per process).
    """
    count = Mean(name="processes with input")
    if has_input:
        count.update(np.ones(1))
    session.merge_metrics([count])
    return count.updates > 0


#: What :meth:`_Batches.next` returns at the end of the input.
_END: Any = object()


class _Batches:
    """Next item of a sync or async iterable, awaited either way."""

    __slots__ = ("_async", "_iterator")

    def __init__(self, source: Iterable[Any] | AsyncIterable[Any]) -> None:
        self._async = hasattr(source, "__aiter__")
        self._iterator: Any = (
            source.__aiter__() if isinstance(source, AsyncIterable) else iter(source)
        )

    async def next(self) -> Any:
        """The next batch, or :data:`_END` at the end of the input."""
        if self._async:
            try:
                return await self._iterator.__anext__()
            except StopAsyncIteration:
                return _END
        return next(self._iterator, _END)


def _batches(source: Iterable[Any] | AsyncIterable[Any] | None) -> _Batches | None:
    return None if source is None else _Batches(source)


#: The options of :func:`evaluate_once` that :func:`evaluate_repeatedly` passes on, with
#: their defaults (it gives the input, the state and the checkpoint itself).
_EVALUATE_DEFAULTS: Final = {
    name: parameter.default
    for name, parameter in inspect.signature(evaluate_once).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    and name not in ("input", "state", "checkpoint_path", "checkpoint_dir")
}


async def evaluate_repeatedly(
    checkpoint_dir: str | os.PathLike[str],
    eval_fn: StepFn,
    metrics: Mapping[str, Metric],
    *,
    input_fn: Callable[[], Iterable[Any] | AsyncIterable[Any]] | None = None,
    state_fn: Callable[[], TrainState] | None = None,
    eval_interval_secs: float = 60,
    timeout: float | None = None,  # noqa: ASYNC109 - TF1's argument: no new checkpoint for this long
    timeout_fn: Callable[[], bool] | None = None,
    max_number_of_evaluations: int | None = None,
    poll_secs: float = 1.0,
    on_result: Callable[[EvaluationResult], Any] | None = None,
    until: Callable[[EvaluationResult], bool] | None = None,
    **kwargs: Any,
) -> list[EvaluationResult]:
    """Evaluate each new checkpoint of ``checkpoint_dir`` once, as training writes them.

    TF1's ``evaluate_repeatedly``: follows the directory with the checkpoint
    plugin's ``checkpoints_iterator`` (a new checkpoint at most every
    ``eval_interval_secs``; ends after ``timeout`` seconds without one unless
    ``timeout_fn()`` says to go on) and stops after ``max_number_of_evaluations``.
    Each evaluation is :func:`evaluate_once` on a fresh state (``state_fn()``, or
    an empty one filled from the checkpoint) and a fresh input (``input_fn()``);
    ``kwargs`` go to it. ``on_result(result)`` (sync or async) sees each result
    as it comes; all are returned. ``until(result)`` returning true ends the loop
    after that result (an evaluator stops once it has seen the final step).

    Beside a live trainer (or a copier), a checkpoint that cannot be restored
    is "not (yet) there": one deleted before it could be read (training keeps
    only its newest few) is skipped; one incomplete or damaged is tried once
    more ``poll_secs`` later (a copy may still be arriving), then skipped. Each
    is named once in a warning with the reason, and the loop goes on with the
    next checkpoint; a skipped one is tried again only if its files change.
    Only complete checkpoints, their sizes and checksums verified, are
    evaluated. In a distributed job (``mpiexec`` with ``monitored-mpi``) the
    chief follows the directory and the other processes evaluate each
    checkpoint it picks, with it, waiting for the next one as long as it does.
    Summaries go to ``<checkpoint_dir>/eval`` unless ``summary_dir=`` says
    otherwise; an evaluator that may only read ``checkpoint_dir`` writes none,
    and says so once.
    """
    if max_number_of_evaluations is not None and max_number_of_evaluations <= 0:
        raise ValueError(
            f"max_number_of_evaluations must be positive or None, got {max_number_of_evaluations}"
        )
    unknown = sorted(set(kwargs) - set(_EVALUATE_DEFAULTS))
    if unknown:
        raise TypeError(
            f"evaluate_repeatedly got unknown arguments {unknown}; it passes on to "
            f"evaluate_once: {', '.join(sorted(_EVALUATE_DEFAULTS))}"
        )
    check_options(**kwargs)
    checkpoint = _checkpoint_module("follow a checkpoint directory")
    results: list[EvaluationResult] = []
    iterator = checkpoint.checkpoints_iterator(
        checkpoint_dir, eval_interval_secs, timeout, timeout_fn, poll_secs=poll_secs
    )
    if "summary_dir" not in kwargs:
        kwargs["summary_dir"] = default_summary_dir(os.fspath(checkpoint_dir))

    async def next_checkpoint(state: TrainState) -> str | None:
        """The next new checkpoint that restores into ``state`` (the chief's pick)."""
        while True:
            try:
                path = await iterator.__anext__()
            except StopAsyncIteration:
                return None
            error = await _restore_arriving(checkpoint, state, path, poll_secs)
            if error is None:
                return path
            iterator.reject(path, _reason(checkpoint, error))

    options = {**_EVALUATE_DEFAULTS, **kwargs}
    while True:
        state = state_fn() if state_fn is not None else TrainState()
        chooser = await _pick_together(
            functools.partial(_next_checkpoint, next_checkpoint, state),
            disable_plugins=options["disable_plugins"],
            plugin_options=options["plugin_options"],
            # The other processes wait for the chief's next checkpoint, as long as it does.
            max_wait_secs=math.inf,
        )
        if chooser.path is None:
            break
        result = await _evaluate(
            eval_fn,
            metrics,
            _RestoreFromCheckpoint(chooser.path, restored=True),
            **{
                **options,
                "input": input_fn() if input_fn is not None else None,
                "state": state,
            },
        )
        results.append(result)
        if on_result is not None:
            done = on_result(result)
            if inspect.isawaitable(done):
                await done
        if max_number_of_evaluations is not None and len(results) >= max_number_of_evaluations:
            log.info("Evaluated %d checkpoints: done", len(results))
            break
        if until is not None and until(result):
            break
    return results


async def _next_checkpoint(
    follow: Callable[[TrainState], Awaitable[str | None]],
    state: TrainState,
    chooser: _PickCheckpoint,
) -> str | None:
    """``follow(state)``: the follower's next checkpoint, restored into ``state``."""
    return await follow(state)


async def _restore_arriving(
    checkpoint: _Checkpoints, state: TrainState, path: str, wait: float
) -> BaseException | None:
    """Restore ``path`` into ``state``; if incomplete or damaged, once more ``wait`` s later.

    A checkpoint still arriving (copied file by file) may be complete by then;
    one deleted is not tried again. Returns the error of the last try when it
    is unusable (gone, incomplete or damaged); any other error is raised.
    """
    try:
        checkpoint.restore(state, path)
        return None
    except Exception as exc:
        if not _is_unusable(checkpoint, exc):
            raise
        if isinstance(exc, checkpoint.CheckpointNotFoundError):
            return exc
        log.info(
            "Checkpoint %s is not readable (%s); trying it again in %g s",
            printable(path),
            printable(exc),
            wait,
        )
    await anyio.sleep(wait)
    try:
        checkpoint.restore(state, path)
    except Exception as exc:
        if not _is_unusable(checkpoint, exc):
            raise
        return exc
    return None
