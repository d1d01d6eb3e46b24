"""``Estimator``: TF's ``tf.estimator.Estimator`` over a ``model_fn`` written on arrays.

A run (``train``, ``evaluate``, ``predict``) goes like TF's: the estimator
first calls ``model_fn`` once on the input's first batch to *build* the model
(TF built its graph here): on a scratch state, whose entries created by
:func:`get_variable` and the optimizers become the real state's initial
values, and whose spec gives the run's hooks. Then it opens a session
(:func:`~monitored.MonitoredTrainingSession` for training, with every installed
plugin; an evaluation session otherwise) over a fresh
:class:`~monitored.TrainState` restored from ``model_dir``, and calls
``model_fn`` on each batch.
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, final

import numpy as np

from .._core._backend import is_array, to_host
from .._core._basic_hooks import StopAtStepHook
from .._core._capabilities import provider
from .._core._scaffold import Scaffold
from .._core._state import TrainState
from ..data import Pipeline
from ..evaluation import Experiment, evaluate_once
from ..evaluation._evaluate import (
    EvaluationSession,
    _filled_by_the_restore,
    _RestoreFromCheckpoint,
    default_summary_dir,
)
from ..metrics import Mean, Metric
from ._config import RunConfig
from ._errors import EstimatorError, ModelFnError
from ._spec import EstimatorSpec, MetricSpec, ModeKeys
from ._variables import using_state

__all__ = ["Estimator"]

log = logging.getLogger("monitored")

#: The arguments a ``model_fn`` may take, by name (TF's, and ``state``).
_MODEL_FN_ARGS: Final = frozenset({"features", "labels", "mode", "params", "config", "state"})
#: Metric names the estimator reports itself.
_RESERVED: Final = frozenset({"loss", "global_step"})


@final
class _FirstValues(dict[str, Any]):
    """A state's entries that also remember each one's value when it was created."""

    __slots__ = ("created",)

    def __init__(self) -> None:
        super().__init__()
        self.created: dict[str, Any] = {}

    def __setitem__(self, name: str, value: Any) -> None:
        if name not in self:
            self.created[name] = value.copy()
        super().__setitem__(name, value)


def _build_state(seed: int | None) -> tuple[TrainState, _FirstValues]:
    """The scratch state of a build call, and the record of its entries' first values."""
    state = TrainState(seed=seed)
    record = _FirstValues()
    state._arrays = record  # the state's own dict of entries, recording
    return state, record


@final
class _Built:
    """What a build call found: the spec of the first batch, and how to initialize a state."""

    __slots__ = ("entries", "non_trainable", "rng_state", "spec")

    def __init__(self, spec: EstimatorSpec, scratch: TrainState, record: _FirstValues) -> None:
        self.spec = spec
        self.entries = record.created
        self.non_trainable = frozenset(scratch.non_trainable)
        self.rng_state = scratch.rng_state

    def init_fn(self, state: TrainState) -> None:
        """Give a fresh state the entries the build call created, as they were created."""
        for name, value in self.entries.items():
            state.add(name, value.copy(), trainable=name not in self.non_trainable)
        state.rng_state = self.rng_state


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(features, labels)`` of a batch: a pair is features and labels, anything else features."""
    if isinstance(batch, tuple) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, None


class Estimator:
    """Trains, evaluates and predicts with a ``model_fn``: TF's ``tf.estimator.Estimator``.

    ``model_fn(features, labels, mode, params, config)`` (any subset of those
    names, plus ``state``: the :class:`~monitored.TrainState`) runs on one batch
    of arrays and returns an :class:`EstimatorSpec`; variables come from
    :func:`get_variable`. ``model_dir`` holds the checkpoints (the
    ``monitored-checkpoint`` plugin) and summaries; without one, a temporary
    directory is used, as in TF. ``config`` is a :class:`RunConfig`;
    ``params`` is handed to ``model_fn``; ``warm_start_from`` names a
    checkpoint (or directory) whose trainable arrays start a run that has no
    checkpoint of its own (:func:`monitored.train.warm_start`).

    An input function returns a fresh iterable of batches each time it is
    called; a batch is ``(features, labels)`` or features alone. Each run
    calls it twice: once for the first batch of the build call, once for the
    run itself, so it must give the same batches each time (seeded); it
    is read through :func:`monitored.data.prefetch` in training, whose position
    is saved in checkpoints (a resumed run reads on exactly where it stopped).
    ``train`` and ``evaluate`` are coroutines; ``predict`` is an async iterator.
    See ``docs/estimator.md``.
    """

    def __init__(
        self,
        model_fn: Callable[..., EstimatorSpec],
        model_dir: str | os.PathLike[str] | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        warm_start_from: str | os.PathLike[str] | None = None,
    ) -> None:
        if not callable(model_fn):
            raise EstimatorError(f"Estimator(model_fn={model_fn!r}): not callable")
        self._model_fn_args = _model_fn_args(model_fn)
        if params is not None and "params" not in self._model_fn_args:
            raise EstimatorError(
                "Estimator(params=...): model_fn does not take an argument named params"
            )
        if config is None:
            config = RunConfig()
        elif not isinstance(config, RunConfig):
            raise EstimatorError(
                "Estimator(config=...): a monitored.estimator.RunConfig, not "
                f"{type(config).__name__}"
            )
        given = os.fspath(model_dir) if model_dir is not None else None
        if given is not None and config.model_dir is not None and given != config.model_dir:
            raise EstimatorError(
                f"model_dir is set both in the Estimator ({given!r}) and in its RunConfig "
                f"({config.model_dir!r}), differently: give one"
            )
        directory = given or config.model_dir
        if directory is None:
            directory = tempfile.mkdtemp(prefix="monitored-estimator-")
            log.warning("Using a temporary folder as model directory: %s", directory)
        self._model_dir = directory
        self._config = (
            config.replace(model_dir=directory) if config.model_dir != directory else config
        )
        self._model_fn = model_fn
        self._params = dict(params) if params is not None else {}
        self._warm_start_from = os.fspath(warm_start_from) if warm_start_from is not None else None
        self._train_step = _named(self._run_train_step, f"model_fn {_name(model_fn)} (TRAIN)")

    # -- TF's properties ----------------------------------------------------------------
    @property
    def model_dir(self) -> str:
        """Where checkpoints and summaries go."""
        return self._model_dir

    @property
    def config(self) -> RunConfig:
        """The :class:`RunConfig`, with ``model_dir`` filled in."""
        return self._config

    @property
    def params(self) -> dict[str, Any]:
        """A copy of the ``params`` given to ``model_fn``."""
        return dict(self._params)

    @property
    def model_fn(self) -> Callable[..., EstimatorSpec]:
        """The ``model_fn``."""
        return self._model_fn

    # -- the runs -------------------------------------------------------------------------
    async def train(
        self,
        input_fn: Callable[[], Any],
        hooks: Sequence[object] | None = None,
        steps: int | None = None,
        max_steps: int | None = None,
        saving_listeners: Sequence[object] | None = None,
    ) -> Estimator:
        """Train on ``input_fn()``'s batches; returns the estimator (TF's ``train``).

        ``steps``: this many more steps; ``max_steps``: up to this global step
        (already there: nothing is done, as in TF); neither: until the input
        ends. ``hooks`` join the spec's ``training_hooks`` and the installed
        plugins; ``saving_listeners`` are hooks with an ``after_save`` method
        (the checkpoint plugin's listeners, see ``docs/checkpoint.md``).
        """
        if steps is not None and max_steps is not None:
            raise EstimatorError("Estimator.train: can not provide both steps and max_steps")
        for name, value in (("steps", steps), ("max_steps", max_steps)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise EstimatorError(f"Estimator.train: must specify {name} > 0, got {value!r}")
        if max_steps is not None:
            latest = self._latest_step()
            if latest is not None and latest >= max_steps:
                log.info(
                    "Skipping training since max_steps (%d) has already been reached (step %d)",
                    max_steps,
                    latest,
                )
                return self
        built = self._build(input_fn, ModeKeys.TRAIN)
        run_hooks: list[object] = [
            *built.spec.training_hooks,
            *(hooks or ()),
            *(saving_listeners or ()),
        ]
        if steps is not None:
            run_hooks.append(StopAtStepHook(num_steps=steps))
        experiment = self._experiment(input_fn, built, run_hooks, train_steps=max_steps)
        await experiment.train(delay_secs=0)
        return self

    async def evaluate(
        self,
        input_fn: Callable[[], Any],
        steps: int | None = None,
        hooks: Sequence[object] | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        name: str | None = None,
        metrics: Mapping[str, MetricSpec] | None = None,
    ) -> dict[str, Any]:
        """Evaluate a checkpoint on ``input_fn()``; ``{metric: value, "loss", "global_step"}``.

        The newest checkpoint of ``model_dir`` unless ``checkpoint_path`` names
        one; ``steps`` batches at most (``None``: until the input ends);
        summaries go to ``<model_dir>/eval`` (``eval_<name>``). ``loss`` is the
        mean of the batches' losses; the spec's ``eval_metric_ops`` and
        ``metrics`` (contrib's :class:`MetricSpec`) are merged over the batches.
        """
        specs = _check_metric_specs(metrics)
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0
        ):
            raise EstimatorError(f"Estimator.evaluate: must specify steps > 0, got {steps!r}")
        built = self._build(input_fn, ModeKeys.EVAL)
        folder = f"eval_{name}" if name else "eval"
        result = await evaluate_once(
            self._eval_step(specs),
            self._eval_metrics(),
            input=_batches(input_fn, "evaluate"),
            eval_steps=steps,
            hooks=[*built.spec.evaluation_hooks, *(hooks or ())],
            summary_dir=default_summary_dir(self._model_dir, folder),
            checkpoint_path=checkpoint_path,
            checkpoint_dir=self._model_dir if checkpoint_path is None else None,
        )
        return {**result.metrics, "global_step": result.global_step}

    async def predict(
        self,
        input_fn: Callable[[], Any],
        predict_keys: str | Sequence[str] | None = None,
        hooks: Sequence[object] | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        yield_single_examples: bool = True,
    ) -> AsyncIterator[Any]:
        """The predictions for ``input_fn()``'s batches, from a checkpoint (TF's ``predict``).

        One example at a time (``yield_single_examples=False``: one batch at a
        time): a dict of the chosen ``predict_keys`` when ``model_fn``'s
        predictions are a dict, else the array's row. The session runs over the
        whole input first (the hooks see every batch), then the predictions are
        yielded; ``async for p in estimator.predict(input_fn): ...``.
        """
        keys = [predict_keys] if isinstance(predict_keys, str) else predict_keys
        built = self._build(input_fn, ModeKeys.PREDICT)
        path = os.fspath(checkpoint_path) if checkpoint_path is not None else None
        if path is None:
            path = self.latest_checkpoint()
            if path is None:
                raise EstimatorError(
                    f"Estimator.predict: no checkpoint in model_dir {self._model_dir!r}; "
                    "train first"
                )
        collected: list[Any] = []

        def predict_step(state: TrainState, batch: Any) -> None:
            features, labels = split_batch(batch)
            spec = self._call(features, labels, ModeKeys.PREDICT, state)
            collected.append(_chosen(spec.predictions, keys))

        session = EvaluationSession(
            TrainState(),
            hooks=[
                _RestoreFromCheckpoint(path, doing="Predicting with"),
                *built.spec.prediction_hooks,
                *(hooks or ()),
            ],
            scaffold=Scaffold(init_fn=_filled_by_the_restore),
        )
        async with session as sess:
            for batch in _batches(input_fn, ModeKeys.PREDICT):
                if sess.should_stop():
                    break
                await sess.run(predict_step, batch)
        for predictions in collected:
            if not yield_single_examples:
                yield predictions
            elif isinstance(predictions, dict):
                for row in range(_rows(predictions)):
                    yield {key: value[row] for key, value in predictions.items()}
            else:
                for row in predictions:
                    yield row

    # -- checkpoints ---------------------------------------------------------------------
    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint of ``model_dir``, or ``None``."""
        found = provider("checkpoint", "Estimator.latest_checkpoint reads checkpoints").call(
            "latest_checkpoint", checkpoint_dir=self._model_dir
        )
        return None if found is None else str(found)

    def get_variable_names(self) -> list[str]:
        """The names of the arrays in the newest checkpoint (TF's ``get_variable_names``)."""
        return sorted(self._read_latest())

    def get_variable_value(self, name: str) -> np.ndarray[Any, Any]:
        """The array ``name`` of the newest checkpoint (TF's ``get_variable_value``)."""
        arrays = self._read_latest()
        if name not in arrays:
            raise EstimatorError(
                f"Estimator.get_variable_value({name!r}): the newest checkpoint has no such "
                f"array; it has {sorted(arrays)}"
            )
        return _host(arrays[name])

    # -- the pieces ------------------------------------------------------------------------
    def _read_latest(self) -> Mapping[str, Any]:
        path = self.latest_checkpoint()
        if path is None:
            raise EstimatorError(f"Estimator: no checkpoint in model_dir {self._model_dir!r} yet")
        found = provider("checkpoint", "Estimator reads checkpoints").call(
            "read_checkpoint", path=path
        )
        _, arrays = found
        return dict(arrays)

    def _latest_step(self) -> int | None:
        try:
            path = self.latest_checkpoint()
        except Exception:
            return None
        if path is None:
            return None
        found = provider("checkpoint", "Estimator reads checkpoints").call(
            "list_checkpoints", checkpoint_dir=self._model_dir
        )
        steps = [
            step
            for listed, step, _ in (found or ())
            if os.path.basename(listed) == os.path.basename(path)
        ]
        return steps[-1] if steps else None

    def _call(self, features: Any, labels: Any, mode: str, state: TrainState) -> EstimatorSpec:
        """``model_fn`` on one batch with ``state`` current; its spec, checked."""
        given = {
            "features": features,
            "labels": labels,
            "mode": mode,
            "params": self._params,
            "config": self._config,
            "state": state,
        }
        with using_state(state):
            spec = self._model_fn(**{name: given[name] for name in self._model_fn_args})
        if not isinstance(spec, EstimatorSpec):
            raise ModelFnError(
                f"model_fn {_name(self._model_fn)} returned {type(spec).__name__}, not an "
                "EstimatorSpec"
            )
        if spec.mode != mode:
            raise ModelFnError(
                f"model_fn {_name(self._model_fn)} was called in mode {mode!r} and returned an "
                f"EstimatorSpec of mode {spec.mode!r}"
            )
        if spec.eval_metric_ops and _RESERVED & set(spec.eval_metric_ops):
            raise ModelFnError(
                f"model_fn {_name(self._model_fn)}: eval_metric_ops may not be named "
                f"{sorted(_RESERVED & set(spec.eval_metric_ops))}: the Estimator reports those"
            )
        return spec

    def _build(self, input_fn: Callable[[], Any], mode: str) -> _Built:
        """Call ``model_fn`` on the input's first batch on a scratch state: TF's graph build."""
        batches = iter(_batches(input_fn, mode))
        try:
            first = next(batches)
        except StopIteration:
            raise EstimatorError(
                f"Estimator ({mode}): input_fn {_name(input_fn)} gave no batch"
            ) from None
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        scratch, record = _build_state(self._config.tf_random_seed)
        features, labels = split_batch(first)
        spec = self._call(features, labels, mode, scratch)
        if mode == ModeKeys.TRAIN and callable(spec.train_op):
            with using_state(scratch):  # an update given as a function runs in the build too
                spec.train_op()
        return _Built(spec, scratch, record)

    def _experiment(
        self,
        input_fn: Callable[[], Any],
        built: _Built,
        hooks: list[object],
        *,
        train_steps: int | None,
    ) -> Experiment:
        """A step-function :class:`~monitored.Experiment` running this estimator's steps."""
        warm = self._warm_start_from

        def init_fn(state: TrainState) -> None:
            built.init_fn(state)
            if warm is not None:
                from ..train import warm_start

                warm_start(state, warm)

        config = self._config
        return Experiment(
            self._train_step,
            self._eval_step(()),
            self._eval_metrics(),
            train_input_fn=input_fn,
            model_dir=self._model_dir,
            state=TrainState(seed=config.tf_random_seed),
            scaffold=Scaffold(init_fn=init_fn),
            train_steps=train_steps,
            train_hooks=hooks,
            is_chief=config.is_chief,
            keep_checkpoint_max=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
            **config.session_options(),
        )

    def _run_train_step(self, state: TrainState, batch: Any) -> dict[str, Any]:
        features, labels = split_batch(batch)
        spec = self._call(features, labels, ModeKeys.TRAIN, state)
        if callable(spec.train_op):
            with using_state(state):  # current_state() and get_variable work in it too
                spec.train_op()
        return {"loss": spec.loss}

    def _eval_metrics(self) -> dict[str, Metric]:
        # Grows as the eval step meets the spec's metrics: the evaluation reads
        # the dict's entries when it ends, and resets them when it starts.
        return {"loss": Mean(name="loss")}

    def _eval_step(
        self, specs: Iterable[tuple[str, MetricSpec]]
    ) -> Callable[[TrainState, Any, dict[str, Metric]], dict[str, Any]]:
        """The eval step: ``model_fn`` in EVAL mode; its loss and metrics go into ``metrics``."""
        metric_specs = list(specs)

        def eval_step(state: TrainState, batch: Any, metrics: dict[str, Metric]) -> dict[str, Any]:
            features, labels = split_batch(batch)
            spec = self._call(features, labels, ModeKeys.EVAL, state)
            loss: Any = metrics["loss"]
            loss.update(spec.loss)
            for name, metric in (spec.eval_metric_ops or {}).items():
                if metric is metrics.get(name):
                    raise ModelFnError(
                        f"model_fn {_name(self._model_fn)}: eval_metric_ops[{name!r}] is the "
                        "same metric object as for the last batch; return a new metric updated "
                        "with this batch only (metrics.Accuracy().updated(labels, predictions)): "
                        "the estimator adds the batches up"
                    )
                if name in metrics:
                    metrics[name].merge(metric)
                else:
                    metrics[name] = metric
            for name, metric_spec in metric_specs:
                if name not in metrics:
                    metrics[name] = metric_spec.create(name)
                metric_spec.update(name, metrics[name], features, labels, spec.predictions)
            return {"loss": spec.loss}

        return eval_step


def _model_fn_args(model_fn: Callable[..., Any]) -> tuple[str, ...]:
    """The argument names ``model_fn`` takes; TF's check for ``features`` and unknown names."""
    try:
        parameters = inspect.signature(model_fn).parameters
    except (TypeError, ValueError):
        raise EstimatorError(
            f"Estimator: cannot read model_fn {_name(model_fn)}'s arguments"
        ) from None
    names = tuple(
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"
    )
    if "features" not in names:
        raise EstimatorError(f"model_fn {_name(model_fn)} must take an argument named features")
    unknown = [name for name in names if name not in _MODEL_FN_ARGS]
    if unknown:
        raise EstimatorError(
            f"model_fn {_name(model_fn)} takes arguments the Estimator does not give: "
            f"{unknown}; it may take {sorted(_MODEL_FN_ARGS)}"
        )
    return names


def _batches(input_fn: Callable[[], Any], mode: str) -> Iterable[Any]:
    """``input_fn()``, checked to be an iterable of batches."""
    if not callable(input_fn):
        raise EstimatorError(f"Estimator ({mode}): input_fn {input_fn!r} is not callable")
    batches = input_fn()
    if (
        isinstance(batches, Pipeline)
        or not isinstance(batches, Iterable)
        or isinstance(batches, str | bytes | Mapping)
        or is_array(batches)
    ):
        raise EstimatorError(
            f"Estimator ({mode}): input_fn {_name(input_fn)} returned "
            f"{type(batches).__name__}; it must return an iterable of batches, each "
            "(features, labels) or features alone (monitored.estimator.numpy_input_fn "
            "makes one from arrays)"
        )
    return batches


def _check_metric_specs(metrics: Mapping[str, MetricSpec] | None) -> list[tuple[str, MetricSpec]]:
    if metrics is None:
        return []
    if not isinstance(metrics, Mapping):
        raise EstimatorError(
            f"metrics=: a dict of names to MetricSpec, not {type(metrics).__name__}"
        )
    for name, spec in metrics.items():
        if not isinstance(spec, MetricSpec):
            raise EstimatorError(f"metrics[{name!r}]: a MetricSpec, not {type(spec).__name__}")
        if name in _RESERVED:
            raise EstimatorError(f"metrics[{name!r}]: the Estimator reports {name!r} itself")
    return list(metrics.items())


def _chosen(predictions: Any, keys: Sequence[str] | None) -> Any:
    if not isinstance(predictions, Mapping):
        if keys is not None:
            raise EstimatorError(
                "Estimator.predict(predict_keys=...): model_fn's predictions are one array, "
                "not a dict"
            )
        return _host(predictions)
    chosen = list(predictions) if keys is None else list(keys)
    missing = [key for key in chosen if key not in predictions]
    if missing:
        raise EstimatorError(
            f"Estimator.predict: predict_keys {missing} are not among the predictions "
            f"{sorted(predictions)}"
        )
    return {key: _host(predictions[key]) for key in chosen}


def _rows(predictions: Any) -> int:
    values = list(predictions.values()) if isinstance(predictions, Mapping) else [predictions]
    counts = {int(np.shape(value)[0]) if np.ndim(value) else 1 for value in values}
    if len(counts) != 1:
        raise ModelFnError(
            f"model_fn's predictions have different numbers of rows: {sorted(counts)}; each "
            "must have one row per example"
        )
    return counts.pop()


def _host(value: Any) -> np.ndarray[Any, Any]:
    """``value`` as a NumPy array (a CuPy array copied to the host)."""
    return to_host([value])[0] if is_array(value) else np.asarray(value)


def _named(
    step: Callable[[TrainState, Any], dict[str, Any]], name: str
) -> Callable[[TrainState, Any], dict[str, Any]]:
    """``step`` under ``name``: what the session's messages call the step function
    (a stalled global step names the model_fn, not the estimator's internals)."""

    def train_step(state: TrainState, batch: Any) -> dict[str, Any]:
        return step(state, batch)

    train_step.__name__ = train_step.__qualname__ = name
    return train_step


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
