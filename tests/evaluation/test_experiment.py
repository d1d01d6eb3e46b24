"""Experiment: train, evaluate, continuous_eval, train_and_evaluate, continuous_train_and_eval."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest

import monitored
from monitored import metrics as m
from monitored._core._plugins import installed_plugin_names
from monitored.evaluation import (
    EvaluationFailedError,
    Experiment,
    ExperimentConfigError,
    NoCheckpointError,
    NoMetricUpdatesError,
)

EVAL_DATA = [np.array([1.0, 2.0]), np.array([3.0])]


def train_step(state: monitored.TrainState, batch: Any = None) -> dict[str, Any]:
    state["w"] = state["w"] + 1.0
    state.global_step += 1
    return {"loss": -state["w"][0]}


def eval_step(state: monitored.TrainState, batch: Any, metrics: Any) -> None:
    metrics["w"].update(state["w"] * np.ones_like(batch))
    metrics["scaled"].update(state["w"] * batch)


def _metrics() -> dict[str, m.Metric]:
    return {"w": m.Mean(), "scaled": m.Mean()}


def init(state: monitored.TrainState) -> None:
    state["w"] = np.zeros(1)


class Heard:
    """A training hook that hears evaluation results, as the plugins do."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.metrics: list[dict[str, float]] = []

    def after_evaluate(self, session: Any, step: int, metrics: Any) -> None:
        assert session.state.global_step == step  # the state evaluated is the training state
        self.steps.append(step)
        self.metrics.append(dict(metrics))


def experiment(**kwargs: Any) -> Experiment:
    kwargs.setdefault("eval_input_fn", lambda: EVAL_DATA)
    kwargs.setdefault("scaffold", monitored.Scaffold(init_fn=init))
    kwargs.setdefault("log_step_count_steps", None)
    return Experiment(train_step, eval_step, _metrics(), **kwargs)


def _all_plugins_but(*wanted: str) -> str:
    """``MONITORED_DISABLE_PLUGINS`` turning off every installed plugin but ``wanted``."""
    return ",".join(sorted(installed_plugin_names() - set(wanted)))


@pytest.fixture
def checkpoint_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the installed checkpoint plugin (and only it) into sessions."""
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _all_plugins_but("checkpoint"))


# -- train_and_evaluate, in one process -------------------------------------------------------
async def test_without_a_model_dir_evaluates_every_n_steps_and_at_the_end() -> None:
    heard = Heard()
    exp = experiment(train_steps=5, min_eval_frequency=2, train_hooks=[heard])
    result = await exp.train_and_evaluate()
    assert heard.steps == [1, 3, 5]
    assert result.global_step == 5
    assert result.metrics == {"w": 5.0, "scaled": 5.0 * 2}
    assert heard.metrics[-1] == result.metrics


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_evaluates_new_checkpoints_at_most_every_min_eval_frequency_steps(
    tmp_path: Path,
) -> None:
    heard = Heard()
    exp = experiment(
        model_dir=tmp_path,
        train_steps=10,
        min_eval_frequency=4,
        save_checkpoint_steps=2,
        train_hooks=[heard],
    )
    result = await exp.train_and_evaluate()
    # Checkpoints at 0 (before training: not evaluated), 2, 4, ..., 10.
    assert heard.steps == [2, 6, 10]
    assert [r["w"] for r in heard.metrics] == [2.0, 6.0, 10.0]
    assert result.global_step == 10
    # What was evaluated is what the checkpoint holds.
    again = await experiment(model_dir=tmp_path).evaluate(delay_secs=0)
    assert again.metrics == result.metrics
    assert again.checkpoint_path is not None
    assert again.checkpoint_path.endswith("-10")


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_min_eval_frequency_zero_evaluates_only_after_training(tmp_path: Path) -> None:
    heard = Heard()
    exp = experiment(
        model_dir=tmp_path,
        train_steps=6,
        min_eval_frequency=0,
        save_checkpoint_steps=2,
        train_hooks=[heard],
    )
    assert (await exp.train_and_evaluate()).global_step == 6
    assert heard.steps == [6]


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_a_resumed_run_evaluates_its_new_checkpoints_only(tmp_path: Path) -> None:
    await experiment(model_dir=tmp_path, train_steps=4, save_checkpoint_steps=2).train()
    heard = Heard()
    exp = experiment(
        model_dir=tmp_path, train_steps=8, save_checkpoint_steps=2, train_hooks=[heard]
    )
    await exp.train_and_evaluate()
    assert heard.steps == [6, 8]


async def test_training_input_ends_training_and_the_final_state_is_evaluated() -> None:
    heard = Heard()
    exp = experiment(train_input_fn=lambda: [1, 2, 3], min_eval_frequency=10, train_hooks=[heard])
    result = await exp.train_and_evaluate()
    assert result.global_step == 3
    assert heard.steps == [1, 3]


async def test_async_training_input() -> None:
    async def batches() -> Any:
        for batch in range(4):
            yield batch

    result = await experiment(train_input_fn=batches, min_eval_frequency=0).train_and_evaluate()
    assert result.global_step == 4


async def test_a_plugin_stopping_on_an_evaluation_result_ends_training() -> None:
    class StopWhenGoodEnough:
        def after_evaluate(self, session: Any, step: int, metrics: Any) -> None:
            if metrics["w"] >= 3:
                session.coord.request_stop()

    exp = experiment(train_steps=100, min_eval_frequency=1, train_hooks=[StopWhenGoodEnough()])
    result = await exp.train_and_evaluate()
    assert result.global_step == 3
    assert exp.state.global_step == 3


async def test_an_evaluation_that_raises_stops_training() -> None:
    def broken(state: Any, batch: Any, metrics: Any) -> None:
        if state.global_step >= 3:
            raise RuntimeError("eval model is broken")
        metrics["w"].update(state["w"])

    exp = Experiment(
        train_step,
        broken,
        {"w": m.Mean()},
        eval_input_fn=lambda: EVAL_DATA,
        scaffold=monitored.Scaffold(init_fn=init),
        train_steps=10,
        min_eval_frequency=1,
    )
    with pytest.raises(EvaluationFailedError, match="training step 3.*training stops") as info:
        await exp.train_and_evaluate()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert exp.state.global_step == 3  # training did not go on


async def test_an_eval_step_updating_no_metric_stops_training_naming_it() -> None:
    def lazy_eval(state: Any, batch: Any, metrics: Any) -> None:
        return None

    exp = Experiment(
        train_step,
        lazy_eval,
        _metrics(),
        eval_input_fn=lambda: EVAL_DATA,
        scaffold=monitored.Scaffold(init_fn=init),
        train_steps=3,
    )
    with pytest.raises(EvaluationFailedError) as info:
        await exp.train_and_evaluate()
    assert isinstance(info.value.__cause__, NoMetricUpdatesError)
    assert "lazy_eval updated none" in str(info.value)
    assert exp.state.global_step == 1


async def test_eval_hooks_and_eval_steps_reach_the_evaluation() -> None:
    seen: list[int] = []

    class CountEvalSteps:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append(run_context.session.state.global_step)

    exp = experiment(
        train_steps=2, min_eval_frequency=0, eval_steps=1, eval_hooks=[CountEvalSteps()]
    )
    result = await exp.train_and_evaluate()
    assert result.steps == 1
    assert seen == [2]


# -- train, evaluate ----------------------------------------------------------------------------
async def test_train_then_evaluate_the_state_in_memory() -> None:
    exp = experiment(train_steps=3)
    with pytest.raises(ExperimentConfigError, match="never trained or restored"):
        await exp.evaluate(delay_secs=0)
    state = await exp.train()
    assert state.global_step == 3
    result = await exp.evaluate(delay_secs=0)
    assert result.global_step == 3
    assert result.metrics["w"] == 3.0


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_evaluate_without_a_checkpoint_names_the_directory(tmp_path: Path) -> None:
    with pytest.raises(NoCheckpointError, match=str(tmp_path)):
        await experiment(model_dir=tmp_path).evaluate(delay_secs=0)


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_named_evaluations_write_to_their_own_directory(tmp_path: Path) -> None:
    written: list[str | None] = []

    class Sink:
        def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
            written.append(session.training_config.summary_dir)

    exp = experiment(model_dir=tmp_path, train_steps=2, eval_hooks=[Sink()])
    await exp.train()
    await exp.evaluate(delay_secs=0, name="holdout")
    await exp.evaluate(delay_secs=0)
    assert written == [str(tmp_path / "eval_holdout"), str(tmp_path / "eval")]


async def test_evaluate_waits_eval_delay_secs_and_workers_start_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr("monitored.evaluation._experiment.anyio", SimpleNamespace(sleep=sleep))
    exp = experiment(train_steps=1, eval_delay_secs=7, task_id=3)
    await exp.train()
    await exp.evaluate()
    assert slept == [15, 7]  # TF: worker k waits min(60, 5 k) s; evaluation eval_delay_secs
    await experiment(train_steps=1, task_id=20).train()
    assert slept[-1] == 60


async def test_delay_workers_by_global_step_waits_for_the_chief() -> None:
    exp = experiment(train_steps=5, task_id=1, delay_workers_by_global_step=True)
    with anyio.move_on_after(1.0):
        await exp.train()  # waits for global step 5545, which no chief here will reach
    assert exp.state.global_step == 0
    chief = experiment(train_steps=5, task_id=0, delay_workers_by_global_step=True)
    assert (await chief.train()).global_step == 5


# -- continuous_train_and_eval ------------------------------------------------------------------
async def test_continuous_train_and_eval_alternates_rounds_and_evaluations() -> None:
    inits: list[int] = []

    def counting_init(state: monitored.TrainState) -> None:
        inits.append(1)
        init(state)

    heard = Heard()
    exp = experiment(
        train_steps=10,
        train_steps_per_iteration=4,
        train_hooks=[heard],
        scaffold=monitored.Scaffold(init_fn=counting_init),
    )
    result = await exp.continuous_train_and_eval()
    assert result is not None
    assert heard.steps == [4, 8, 10]
    assert result.metrics["w"] == 10.0
    assert inits == [1]  # later rounds go on from the state in memory


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_continuous_train_and_eval_resumes_each_round_and_obeys_the_predicate(
    tmp_path: Path,
) -> None:
    seen: list[int | None] = []

    def predicate(result: Any) -> bool:
        seen.append(None if result is None else result.global_step)
        return result is None or result.global_step < 6

    exp = experiment(model_dir=tmp_path, train_steps=100, train_steps_per_iteration=3)
    result = await exp.continuous_train_and_eval(predicate)
    assert result is not None
    assert result.global_step == 6
    assert seen == [None, 3, 6]
    # The default round length is a tenth of train_steps.
    heard = Heard()
    tenth = experiment(model_dir=tmp_path / "tenth", train_steps=20, train_hooks=[heard])
    await tenth.continuous_train_and_eval()
    assert heard.steps == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]


async def test_continuous_train_and_eval_ends_when_a_round_trains_nothing() -> None:
    exp = experiment(train_input_fn=list, train_steps_per_iteration=5)
    result = await exp.continuous_train_and_eval()
    assert result is not None
    assert result.global_step == 0


class StopAt:
    """Requests a stop after global step ``step`` (as early stopping would)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_context.session.state.global_step == self.step:
            run_context.request_stop()


@pytest.mark.parametrize("stop_at", [5, 8])  # within a round, and at a round's last step
async def test_continuous_train_and_eval_ends_when_a_hook_stops_training(stop_at: int) -> None:
    heard = Heard()
    exp = experiment(
        train_steps=100, train_steps_per_iteration=4, train_hooks=[heard, StopAt(stop_at)]
    )
    result = await exp.continuous_train_and_eval()
    assert result is not None
    assert result.global_step == stop_at
    assert heard.steps[-1] == stop_at
    assert exp.state.global_step == stop_at  # no further round was started


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eval_steps": 0}, r"eval_steps=0\): give a positive int"),
        ({"eval_steps": -3}, r"eval_steps=-3\)"),
        ({"train_steps": 0}, r"train_steps=0\)"),
        ({"min_eval_frequency": -1}, r"min_eval_frequency=-1\): give a non-negative"),
        ({"train_steps_per_iteration": 1.5}, r"train_steps_per_iteration=1.5\)"),
        ({"eval_delay_secs": -1}, r"eval_delay_secs=-1\): give a number of seconds"),
        ({"continuous_eval_throttle_secs": "often"}, r"continuous_eval_throttle_secs"),
        ({"task_id": -1}, r"task_id=-1\)"),
        ({"checkpoint_dir": "x"}, r"checkpoint_dir=...\): not an Experiment argument"),
        ({"save_checkpoints_steps": 3}, r"save_checkpoints_steps=...\)"),
        ({"state": {"w": 1}}, r"a monitored.TrainState, not dict"),
        ({"train_input_fn": [1, 2]}, r"train_input_fn=\[1, 2\]\): give a function"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ExperimentConfigError, match=match):
        experiment(**kwargs)


def test_bad_functions_metrics_and_tf_only_arguments_are_refused() -> None:
    with pytest.raises(ExperimentConfigError, match="eval_fn=3"):
        Experiment(train_step, 3, _metrics())  # type: ignore[arg-type]
    with pytest.raises(
        ExperimentConfigError, match=r"Experiment\(eval_metrics=...\) needs at least one metric"
    ):
        Experiment(train_step, eval_step, {})
    with pytest.raises(
        ExperimentConfigError, match=r"Experiment\(eval_metrics=...\): metrics\['acc'\] is float"
    ):
        Experiment(train_step, eval_step, {"acc": 0.5})  # type: ignore[dict-item]
    with pytest.raises(monitored.UnsupportedArgumentError, match="export_strategies"):
        Experiment(train_step, eval_step, _metrics(), export_strategies=["x"])  # type: ignore[arg-type]


async def test_bad_method_arguments_are_refused() -> None:
    exp = experiment()
    with pytest.raises(ExperimentConfigError, match="give model_dir="):
        await exp.continuous_eval()
    with pytest.raises(ExperimentConfigError, match=r"Experiment.evaluate\(delay_secs=-1\)"):
        await exp.evaluate(delay_secs=-1)
    with pytest.raises(ExperimentConfigError, match=r"Experiment.train\(delay_secs=-2\)"):
        await exp.train(delay_secs=-2)


# -- a separate evaluator process ---------------------------------------------------------------
TRAINER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import anyio, numpy as np
    import monitored
    from monitored import metrics as m

    model_dir, go = sys.argv[1], Path(sys.argv[2])

    def train_step(state):
        state["w"] = state["w"] + 1.0
        state.global_step += 1

    class WaitForTheEvaluator:
        # Training pauses at step 10 until the evaluator has evaluated a checkpoint,
        # so the evaluator is known to follow a run in progress.
        def after_run(self, run_context, run_values):
            if run_context.session.state.global_step == 10:
                deadline = time.monotonic() + 60
                while not go.exists():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the evaluator never evaluated a checkpoint")
                    time.sleep(0.05)

    def init(state):
        state["w"] = np.zeros(1)

    exp = monitored.Experiment(
        train_step, lambda state, metrics: None, {"w": m.Mean()},
        model_dir=model_dir, scaffold=monitored.Scaffold(init_fn=init), train_steps=30,
        train_hooks=[WaitForTheEvaluator()], save_checkpoint_steps=10,
        log_step_count_steps=None,
    )
    anyio.run(exp.train)
    """
)


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_continuous_eval_follows_a_training_process(tmp_path: Path) -> None:
    model_dir, go, log = tmp_path / "model", tmp_path / "go", tmp_path / "trainer.log"
    with log.open("wb") as output:
        trainer = await anyio.open_process(
            [sys.executable, "-c", TRAINER, str(model_dir), str(go)],
            env={**os.environ, "PYTHONWARNINGS": "error"},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    async with trainer:

        def evaluated(result: Any) -> bool:
            go.touch()
            return True

        evaluator = experiment(model_dir=model_dir, train_steps=30)
        try:
            results = await evaluator.continuous_eval(
                delay_secs=0,
                throttle_delay_secs=0,
                continuous_eval_predicate_fn=evaluated,
                timeout=60,
            )
            with anyio.fail_after(60):
                await trainer.wait()
        finally:
            if trainer.returncode is None:
                trainer.kill()
    assert trainer.returncode == 0, log.read_text()
    steps = [result.global_step for result in results]
    assert steps[0] <= 10, steps  # evaluated while training was paused at step 10
    assert steps[-1] == 30  # and stopped after the final checkpoint
    assert steps == sorted(set(steps))
    for result in results:
        assert result.metrics["w"] == result.global_step  # each checkpoint's own state
        assert result.checkpoint_path is not None
        assert result.checkpoint_path.endswith(f"-{result.global_step}")


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_continuous_eval_ends_on_its_predicate_or_timeout(tmp_path: Path) -> None:
    await experiment(model_dir=tmp_path, train_steps=2, save_checkpoint_steps=1).train()
    exp = experiment(model_dir=tmp_path, train_steps=10)
    results = await exp.continuous_eval(
        delay_secs=0, throttle_delay_secs=0, continuous_eval_predicate_fn=lambda r: False
    )
    assert [r.global_step for r in results] == [2]
    results = await exp.continuous_eval(delay_secs=0, throttle_delay_secs=0, timeout=0.5)
    assert [r.global_step for r in results] == [2]  # the newest, then no new one


async def test_with_the_summaries_plugin_results_are_scalars_in_the_eval_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monitored_summaries import summary_iterator

    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _all_plugins_but("checkpoint", "summaries"))
    exp = experiment(model_dir=tmp_path, train_steps=4, save_checkpoint_steps=2)
    await exp.train_and_evaluate()
    written: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((tmp_path / "eval").glob("events.out.tfevents.*")):
        for event in summary_iterator(str(path)):
            for value in event.summary.value:
                written.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert written == {"w": [(2, 2.0), (4, 4.0)], "scaled": [(2, 4.0), (4, 8.0)]}


@pytest.mark.usefixtures("checkpoint_plugin")
async def test_a_resumed_run_has_heard_the_same_evaluations_as_a_straight_one(
    tmp_path: Path,
) -> None:
    class CountEvaluations:
        """Plugin state changed by evaluations, as early stopping's is."""

        plugin_name = "count"

        def __init__(self) -> None:
            self.heard: list[int] = []

        def after_evaluate(self, session: Any, step: int, metrics: Any) -> None:
            self.heard.append(step)

        def plugin_state(self) -> dict[str, Any]:
            return {"heard": list(self.heard)}

        def load_plugin_state(self, state: dict[str, Any]) -> None:
            self.heard = list(state["heard"])

    async def run(model_dir: Path, steps: int) -> list[int]:
        counter = CountEvaluations()
        exp = experiment(
            model_dir=model_dir, train_steps=steps, save_checkpoint_steps=2, train_hooks=[counter]
        )
        await exp.train_and_evaluate()
        return counter.heard

    await run(tmp_path / "resumed", 4)
    resumed = await run(tmp_path / "resumed", 8)
    straight = await run(tmp_path / "straight", 8)
    assert resumed == straight == [2, 4, 6, 8]


# -- training-only plugins, failed evaluations and checkpoints -----------------------------------
TRAINING_ONLY = ["checkpoint", "early_stopping", "nan_guard", "progress"]


class LoadedPlugins:
    """A hook recording the installed plugins each session it runs in has loaded."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.seen.append(sorted(p.name for p in session.plugins if p.source == "entry point"))


@pytest.mark.parametrize("through", ["plugin_options", "environment"])
async def test_training_only_plugins_stay_out_of_evaluation_sessions(
    through: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _all_plugins_but(*TRAINING_ONLY))
    options = {
        "early_stopping": {"monitor": "loss", "patience": 100},
        "progress": {"mode": "plain"},
    }
    if through == "environment":
        monkeypatch.setenv(
            "MONITORED_PLUGIN_OPTIONS", "early_stopping.monitor=loss;early_stopping.patience=100"
        )
        options = {"progress": {"mode": "plain"}}

    def nan_loss_eval(state: monitored.TrainState, batch: Any, metrics: Any) -> dict[str, Any]:
        eval_step(state, batch, metrics)
        return {"loss": np.float64("nan")}  # the NaN guard would fail an eval session on it

    in_training, in_evaluation = LoadedPlugins(), LoadedPlugins()
    heard = Heard()
    exp = Experiment(
        train_step,
        nan_loss_eval,
        _metrics(),
        eval_input_fn=lambda: EVAL_DATA,
        scaffold=monitored.Scaffold(init_fn=init),
        model_dir=tmp_path,
        train_steps=4,
        save_checkpoint_steps=2,
        log_step_count_steps=None,
        train_hooks=[in_training, heard],
        eval_hooks=[in_evaluation],
        plugin_options=options,
    )
    result = await exp.train_and_evaluate()
    assert in_training.seen == [TRAINING_ONLY]
    assert in_evaluation.seen == [[], []]  # none of them in either evaluation
    assert heard.steps == [2, 4]
    assert result.steps == len(EVAL_DATA)  # nothing stopped the evaluation early
    assert result.metrics["w"] == 4.0


async def test_a_failed_evaluation_keeps_the_checkpoint_it_was_evaluating(
    tmp_path: Path, checkpoint_plugin: None
) -> None:
    import monitored_checkpoint

    def broken_at_3(state: monitored.TrainState, batch: Any, metrics: Any) -> None:
        if state.global_step == 3:
            raise RuntimeError("eval model is broken")
        eval_step(state, batch, metrics)

    exp = experiment(model_dir=tmp_path, train_steps=5, save_checkpoint_steps=3)
    exp.eval_fn = broken_at_3
    with pytest.raises(EvaluationFailedError, match="training step 3.*training stops") as info:
        await exp.train_and_evaluate()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert exp.state.global_step == 3  # training did not go on
    latest = monitored_checkpoint.latest_checkpoint(tmp_path)
    assert latest == os.path.join(tmp_path, "model.ckpt-3")
    restored = monitored.TrainState()
    monitored_checkpoint.restore(restored, latest)
    assert restored["w"][0] == 3.0


async def test_a_failed_final_evaluation_keeps_the_final_checkpoint(
    tmp_path: Path, checkpoint_plugin: None
) -> None:
    import monitored_checkpoint

    def broken_at_5(state: monitored.TrainState, batch: Any, metrics: Any) -> None:
        if state.global_step == 5:
            raise RuntimeError("eval broke at the end")
        eval_step(state, batch, metrics)

    exp = experiment(model_dir=tmp_path, train_steps=5, save_checkpoint_steps=3)
    exp.eval_fn = broken_at_5
    with pytest.raises(EvaluationFailedError, match="training step 5") as info:
        await exp.train_and_evaluate()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert monitored_checkpoint.latest_checkpoint(tmp_path) == os.path.join(
        tmp_path, "model.ckpt-5"
    )
