"""train_and_evaluate with TrainSpec and EvalSpec (TF Estimator's), and its evaluation hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import StandInCluster, install_cluster

import monitored
from monitored import metrics as m
from monitored._core._plugins import installed_plugin_names
from monitored.evaluation import (
    EvalSpec,
    EvaluationFailedError,
    ExperimentConfigError,
    TrainSpec,
    train_and_evaluate,
)

EVAL_DATA = [np.array([1.0, 2.0]), np.array([3.0])]


def train_step(state: monitored.TrainState, batch: Any = None) -> None:
    state["w"] = state["w"] + 1.0
    state.global_step += 1


def eval_step(state: monitored.TrainState, batch: Any, metrics: Any) -> None:
    metrics["w"].update(state["w"] * np.ones_like(batch))


def init(state: monitored.TrainState) -> None:
    state["w"] = np.zeros(1)


class Heard:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def after_evaluate(self, session: Any, step: int, metrics: Any) -> None:
        self.steps.append(step)


def _all_plugins_but(*wanted: str) -> str:
    """``MONITORED_DISABLE_PLUGINS`` turning off every installed plugin but ``wanted``."""
    return ",".join(sorted(installed_plugin_names() - set(wanted)))


@pytest.fixture
def checkpoint_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _all_plugins_but("checkpoint"))


def eval_spec(**kwargs: Any) -> EvalSpec:
    return EvalSpec(eval_step, {"w": m.Mean()}, input_fn=lambda: EVAL_DATA, **kwargs)


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_every_new_checkpoint_is_evaluated_without_a_throttle(tmp_path: Path) -> None:
    heard = Heard()
    result = await train_and_evaluate(
        TrainSpec(train_step, max_steps=6, hooks=[heard]),
        eval_spec(throttle_secs=0),
        model_dir=tmp_path,
        scaffold=monitored.Scaffold(init_fn=init),
        save_checkpoint_steps=2,
    )
    assert heard.steps == [2, 4, 6]
    assert result.global_step == 6
    assert result.metrics == {"w": 6.0}
    assert result.as_dict() == {"w": 6.0, "global_step": 6}


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_throttle_secs_skips_checkpoints_but_not_the_final_state(tmp_path: Path) -> None:
    heard = Heard()
    written: list[str | None] = []

    class Sink:
        def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
            written.append(session.training_config.summary_dir)

    await train_and_evaluate(
        TrainSpec(train_step, max_steps=6, hooks=[heard]),
        eval_spec(throttle_secs=3600, name="holdout", hooks=[Sink()]),
        model_dir=tmp_path,
        scaffold=monitored.Scaffold(init_fn=init),
        save_checkpoint_steps=2,
    )
    assert heard.steps == [2, 6]  # the first new checkpoint, then the end
    assert written == [str(tmp_path / "eval_holdout")] * 2


async def test_without_a_model_dir_the_state_in_memory_is_evaluated() -> None:
    heard = Heard()
    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    result = await train_and_evaluate(
        TrainSpec(train_step, input_fn=lambda: range(4), hooks=[heard]),
        eval_spec(steps=1),
        state=state,
        log_step_count_steps=None,
    )
    # TF's throttle_secs (600 s) between evaluations: the first step, then the end.
    assert heard.steps == [1, 4]
    assert result.steps == 1
    assert state.global_step == 4


async def test_min_eval_frequency_counts_steps_with_or_without_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heard = Heard()
    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    await train_and_evaluate(
        TrainSpec(train_step, max_steps=7, hooks=[heard]),
        eval_spec(),
        state=state,
        min_eval_frequency=3,
    )
    assert heard.steps == [1, 4, 7]
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _all_plugins_but("checkpoint"))
    heard = Heard()
    await train_and_evaluate(
        TrainSpec(train_step, max_steps=7, hooks=[heard]),
        eval_spec(throttle_secs=0),
        model_dir=tmp_path,
        scaffold=monitored.Scaffold(init_fn=init),
        save_checkpoint_steps=1,
        min_eval_frequency=3,
    )
    assert heard.steps == [1, 4, 7]


async def test_an_evaluation_that_raises_stops_training() -> None:
    def broken(state: Any, batch: Any, metrics: Any) -> None:
        raise ValueError("no such column")

    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    with pytest.raises(EvaluationFailedError, match="training step 1") as info:
        await train_and_evaluate(
            TrainSpec(train_step, max_steps=5),
            EvalSpec(broken, {"w": m.Mean()}, input_fn=lambda: EVAL_DATA),
            state=state,
        )
    assert isinstance(info.value.__cause__, ValueError)
    assert state.global_step == 1


def test_bad_specs_are_refused_naming_the_argument() -> None:
    with pytest.raises(ExperimentConfigError, match=r"TrainSpec\(max_steps=0\)"):
        TrainSpec(train_step, max_steps=0)
    with pytest.raises(ExperimentConfigError, match=r"TrainSpec\(train_fn=None\)"):
        TrainSpec(None)  # type: ignore[arg-type]
    with pytest.raises(ExperimentConfigError, match=r"EvalSpec\(steps=0\): give a positive"):
        eval_spec(steps=0)
    with pytest.raises(ExperimentConfigError, match=r"EvalSpec\(steps=-1\)"):
        eval_spec(steps=-1)
    with pytest.raises(ExperimentConfigError, match=r"EvalSpec\(throttle_secs=-1\)"):
        eval_spec(throttle_secs=-1)
    with pytest.raises(ExperimentConfigError, match=r"EvalSpec\(start_delay_secs=nan\)"):
        eval_spec(start_delay_secs=float("nan"))
    with pytest.raises(ExperimentConfigError, match=r"EvalSpec\(eval_fn=1\)"):
        EvalSpec(1, {"w": m.Mean()})  # type: ignore[arg-type]
    with pytest.raises(
        ExperimentConfigError, match=r"EvalSpec\(metrics=...\) needs at least one metric"
    ):
        EvalSpec(eval_step, {})
    with pytest.raises(
        ExperimentConfigError, match=r"EvalSpec\(metrics=...\): metrics\['acc'\] is str"
    ):
        EvalSpec(eval_step, {"acc": "Accuracy"})  # type: ignore[dict-item]


async def test_train_and_evaluate_refuses_what_is_not_a_spec() -> None:
    with pytest.raises(ExperimentConfigError, match="a TrainSpec, not dict"):
        await train_and_evaluate({}, eval_spec())  # type: ignore[arg-type]
    with pytest.raises(ExperimentConfigError, match="an EvalSpec, not TrainSpec"):
        await train_and_evaluate(TrainSpec(train_step), TrainSpec(train_step))  # type: ignore[arg-type]
    with pytest.raises(
        ExperimentConfigError, match=r"train_and_evaluate\(hooks=...\): not a train_and_evaluate"
    ):
        await train_and_evaluate(TrainSpec(train_step), eval_spec(), hooks=[])


@pytest.mark.parametrize("with_checkpoints", [False, True])
async def test_early_stopping_in_train_hooks_acts_on_the_final_evaluation(
    with_checkpoints: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monitored_early_stopping import EarlyStoppingHook

    # Two evaluations: the best (w = 1 at step 1, the first of every 5 steps; or
    # w = 2 at the checkpoint of step 2) and the final state's (w = 3 at step 3, worse).
    # Only the final one can stop, and the best state is put back in the hook's `end`.
    options: dict[str, Any] = {}
    if with_checkpoints:
        monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
        monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _all_plugins_but("checkpoint"))
        options = {"model_dir": tmp_path, "save_checkpoint_steps": 2}
    stopper = EarlyStoppingHook("w", mode="min", patience=0, every_n_steps=0, restore_best=True)
    heard = Heard()
    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    result = await train_and_evaluate(
        TrainSpec(train_step, max_steps=3, hooks=[stopper, heard]),
        EvalSpec(eval_step, {"w": m.Mean()}, input_fn=lambda: EVAL_DATA, throttle_secs=0),
        state=state,
        scaffold=monitored.Scaffold(init_fn=None),
        min_eval_frequency=5 if not with_checkpoints else 1,
        log_step_count_steps=None,
        **options,
    )
    assert heard.steps == ([2, 3] if with_checkpoints else [1, 3])
    assert result.global_step == 3
    assert stopper.stopped_step == 3
    assert state["w"][0] == heard.steps[0]  # the best state is back


@pytest.fixture
def two_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    install_cluster(monkeypatch, StandInCluster())


@pytest.mark.usefixtures("checkpoint_plugin", "two_processes")
async def test_with_several_processes_evaluations_follow_the_checkpoint_step_schedule(
    tmp_path: Path,
) -> None:
    # Only the chief writes checkpoints: every process evaluates every
    # save_checkpoint_steps global steps instead (min_eval_frequency left at None).
    heard = Heard()
    await train_and_evaluate(
        TrainSpec(train_step, max_steps=7, hooks=[heard]),
        eval_spec(throttle_secs=0),
        model_dir=tmp_path,
        scaffold=monitored.Scaffold(init_fn=init),
        save_checkpoint_steps=3,
    )
    assert heard.steps == [3, 6, 7]


@pytest.mark.usefixtures("checkpoint_plugin", "two_processes")
async def test_with_several_processes_checkpoints_by_time_need_a_step_schedule(
    tmp_path: Path,
) -> None:
    with pytest.raises(ExperimentConfigError, match="give save_checkpoint_steps=N"):
        await train_and_evaluate(
            TrainSpec(train_step, max_steps=3),
            eval_spec(throttle_secs=0),
            model_dir=tmp_path,
            scaffold=monitored.Scaffold(init_fn=init),
        )


@pytest.mark.usefixtures("two_processes")
async def test_with_several_processes_evaluations_by_seconds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"every_n_secs=600.*use every_n_steps"):
        await train_and_evaluate(
            TrainSpec(train_step, max_steps=3),
            eval_spec(throttle_secs=600),
            scaffold=monitored.Scaffold(init_fn=init),
        )
