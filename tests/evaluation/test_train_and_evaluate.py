"""train_and_evaluate with TrainSpec and EvalSpec (TF Estimator's), and its evaluation hook."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
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


# -- issue 22: a real Estimator script ------------------------------------------------------------
def drifting_step(state: monitored.TrainState, batch: Any) -> None:
    """A step whose result depends on which batches it saw, in which order."""
    state["w"] = state["w"] * 0.5 + batch
    state.global_step += 1


def seeded_batches() -> Iterator[np.ndarray]:
    """A generator input_fn: the same batches each time it is called (seeded)."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        yield rng.standard_normal(1)


async def _train_spec_run(model_dir: Path, max_steps: int, **options: Any) -> monitored.TrainState:
    state = monitored.TrainState()
    await train_and_evaluate(
        TrainSpec(drifting_step, input_fn=seeded_batches, max_steps=max_steps),
        eval_spec(throttle_secs=0),
        model_dir=model_dir,
        state=state,
        scaffold=monitored.Scaffold(init_fn=init),
        save_checkpoint_steps=3,
        log_step_count_steps=None,
        **options,
    )
    return state


def _kept(directory: Path) -> list[int]:
    """The steps of the checkpoints in ``directory``."""
    return sorted(int(p.name[len("model.ckpt-") : -5]) for p in directory.glob("model.ckpt-*.json"))


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_train_spec_input_fn_generator_resumes_exactly(tmp_path: Path) -> None:
    """A generator input_fn goes on after the batches the checkpoint's steps trained on,
    instead of restarting from its first batch (TF's Estimator restarted it)."""
    await _train_spec_run(tmp_path / "resumed", 7)
    saved = json.loads((tmp_path / "resumed" / "model.ckpt-7.json").read_text())
    [position] = [v for k, v in saved["plugins"].items() if k == "input:train_input_fn"]
    assert position["state"]["next"] == 7
    resumed = await _train_spec_run(tmp_path / "resumed", 15)
    straight = await _train_spec_run(tmp_path / "straight", 15)
    assert resumed.global_step == straight.global_step == 15
    np.testing.assert_array_equal(resumed["w"], straight["w"])
    # What restarting the generator at its first batch would have given: another w.
    restarted = monitored.TrainState({"w": np.zeros(1)})
    batches = list(seeded_batches())
    for batch in batches[:7] + batches[:8]:
        drifting_step(restarted, batch)
    assert restarted["w"][0] != straight["w"][0]


async def test_train_spec_input_fn_rounds_go_on_where_the_last_one_stopped() -> None:
    """Without a model_dir too, a second training run reads on (one stream per Experiment)."""
    seen: list[int] = []

    def step(state: monitored.TrainState, batch: int) -> None:
        seen.append(batch)
        state.global_step += 1

    exp = monitored.Experiment(
        step,
        eval_step,
        {"w": m.Mean()},
        train_input_fn=lambda: range(10),
        eval_input_fn=lambda: EVAL_DATA,
        scaffold=monitored.Scaffold(init_fn=init),
        train_steps_per_iteration=4,
        log_step_count_steps=None,
    )
    result = await exp.continuous_train_and_eval()
    assert seen == list(range(10))  # rounds of 4, 4, then the input ends after 2
    assert result is not None
    assert result.global_step == 10


async def test_train_spec_input_fn_may_return_its_own_pipeline() -> None:
    from monitored import data

    pipelines: list[Any] = []

    def input_fn() -> Any:
        pipelines.append(data.prefetch([np.ones(1)] * 3, name="mine"))
        return pipelines[-1]

    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    await train_and_evaluate(TrainSpec(train_step, input_fn=input_fn), eval_spec(), state=state)
    assert state.global_step == 3
    assert pipelines[0].next_index == 3


async def test_train_spec_input_fn_that_returns_no_input_is_refused() -> None:
    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    with pytest.raises(
        ExperimentConfigError,
        match=r"train_and_evaluate: TrainSpec\(input_fn=...\) returned int, which cannot be read",
    ):
        await train_and_evaluate(
            TrainSpec(train_step, input_fn=lambda: 42),  # type: ignore[arg-type,return-value]
            eval_spec(),
            state=state,
        )


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_train_and_evaluate_keep_checkpoint_max(tmp_path: Path) -> None:
    """TF's RunConfig(keep_checkpoint_max=3): the checkpoint plugin's max_to_keep option."""
    await _train_spec_run(tmp_path, 12, keep_checkpoint_max=2)
    assert _kept(tmp_path) == [9, 12]
    await _train_spec_run(
        tmp_path / "hours", 6, keep_checkpoint_max=1, keep_checkpoint_every_n_hours=1e-9
    )
    assert _kept(tmp_path / "hours") == [0, 3, 6]  # past max_to_keep, one per (tiny) period


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_train_and_evaluate_keep_checkpoint_max_through_plugin_options(
    tmp_path: Path,
) -> None:
    await _train_spec_run(tmp_path, 9, plugin_options={"checkpoint": {"max_to_keep": 1}})
    assert _kept(tmp_path) == [9]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"keep_checkpoint_max": -1},
            ExperimentConfigError,
            r"train_and_evaluate\(keep_checkpoint_max=-1\): give a non-negative int",
        ),
        (
            {"keep_checkpoint_every_n_hours": 0},
            ExperimentConfigError,
            r"train_and_evaluate\(keep_checkpoint_every_n_hours=0\): give a positive number",
        ),
        (
            {"keep_checkpoint_max": 3, "plugin_options": {"checkpoint": {"max_to_keep": 2}}},
            ExperimentConfigError,
            r"keep_checkpoint_max=...\) and plugin_options=.*set the same option: give one",
        ),
        (
            {"save_checkpoints_steps": 10},
            ExperimentConfigError,
            r"train_and_evaluate\(save_checkpoints_steps=...\): TF's RunConfig spelling; "
            r"here it is save_checkpoint_steps=",
        ),
        (
            {"save_summary_steps": 10},
            ExperimentConfigError,
            r"here it is save_summaries_steps=",
        ),
        (
            {"config": object()},
            monitored.UnsupportedArgumentError,
            r"train_and_evaluate\(config=...\): TF's RunConfig; not needed here: .* pass its "
            r"fields as keyword arguments",
        ),
        (
            {"tf_random_seed": 1},
            monitored.UnsupportedArgumentError,
            r"tf_random_seed=...\).*TrainState\(seed=...\)",
        ),
        (
            {"log_step_count_step": 10},
            ExperimentConfigError,
            r"not a train_and_evaluate argument .*did you mean log_step_count_steps=",
        ),
    ],
)
async def test_train_and_evaluate_run_config_fields_are_mapped_or_answered(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await train_and_evaluate(TrainSpec(train_step, max_steps=1), eval_spec(), **options)


def test_experiment_takes_keep_checkpoint_max_as_a_checkpoint_option() -> None:
    exp = monitored.Experiment(
        train_step,
        eval_step,
        {"w": m.Mean()},
        keep_checkpoint_max=3,
        keep_checkpoint_every_n_hours=2,
        plugin_options={"progress": {"every_n_steps": 5}},
    )
    assert exp.session_options["plugin_options"] == {
        "progress": {"every_n_steps": 5},
        "checkpoint": {"max_to_keep": 3, "keep_checkpoint_every_n_hours": 2},
    }
    with pytest.raises(monitored.UnsupportedArgumentError, match=r"Experiment\(config=...\)"):
        monitored.Experiment(train_step, eval_step, {"w": m.Mean()}, config=object())


def test_eval_spec_exporters_are_refused_like_export_strategies() -> None:
    with pytest.raises(
        monitored.UnsupportedArgumentError,
        match=r"EvalSpec\(exporters=...\): nothing here exports models \(there is no "
        r"SavedModel\); drop it.*Serving a trained model",
    ):
        EvalSpec(eval_step, {"w": m.Mean()}, exporters=["final"])  # type: ignore[arg-type]
    with pytest.raises(monitored.UnsupportedArgumentError, match="Serving a trained model"):
        monitored.Experiment(
            train_step,
            eval_step,
            {"w": m.Mean()},
            export_strategies=["x"],  # type: ignore[arg-type]
        )


async def test_eval_steps_stop_logs_the_end_of_the_evaluation_not_a_private_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = monitored.TrainState({"w": np.zeros(1)})
    state.initialized = True
    with caplog.at_level(logging.INFO, logger="monitored"):
        await train_and_evaluate(
            TrainSpec(train_step, max_steps=2), eval_spec(steps=1), state=state
        )
    assert "_StopAfterNEvals" not in caplog.text
    assert (
        "stop requested by eval_steps=1: the evaluation of 1 batch ended (this evaluation "
        "session stops, not training)" in caplog.text
    )
    assert state.global_step == 2


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_eval_spec_start_delay_secs_has_no_effect_in_one_process_and_step_0_is_not_evaluated(
    tmp_path: Path,
) -> None:
    heard = Heard()
    with anyio.fail_after(60):  # not the hour start_delay_secs asks for
        await train_and_evaluate(
            TrainSpec(train_step, max_steps=4, hooks=[heard]),
            eval_spec(throttle_secs=0, start_delay_secs=3600),
            model_dir=tmp_path,
            scaffold=monitored.Scaffold(init_fn=init),
            save_checkpoint_steps=2,
        )
    assert (tmp_path / "model.ckpt-0.json").exists()  # written when the session was created
    assert heard.steps == [2, 4]  # ... and never evaluated


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_train_spec_input_fn_function_of_the_batch_index_resumes_at_the_position(
    tmp_path: Path,
) -> None:
    """An input function returning ``load(i)`` is resumed by asking for batch i directly."""
    asked: list[int] = []

    def load(index: int) -> np.ndarray:
        if index >= 40:
            raise IndexError(index)
        asked.append(index)
        return np.random.default_rng(index).standard_normal(1)

    async def run(model_dir: Path, max_steps: int) -> monitored.TrainState:
        state = monitored.TrainState()
        await train_and_evaluate(
            TrainSpec(drifting_step, input_fn=lambda: load, max_steps=max_steps),
            eval_spec(throttle_secs=0),
            model_dir=model_dir,
            state=state,
            scaffold=monitored.Scaffold(init_fn=init),
            save_checkpoint_steps=3,
            log_step_count_steps=None,
        )
        return state

    await run(tmp_path / "resumed", 6)
    asked.clear()
    resumed = await run(tmp_path / "resumed", 11)
    assert asked[0] == 6  # batches 0-5 are not made again
    straight = await run(tmp_path / "straight", 11)
    np.testing.assert_array_equal(resumed["w"], straight["w"])
