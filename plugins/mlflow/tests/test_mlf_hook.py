"""MlflowHook and the installed plugin against a real local MLflow store, read back with MlflowClient."""

from __future__ import annotations

import contextlib
import glob
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run

import monitored
import monitored_summaries as summaries
from monitored import MonitoredSession, MonitoredTrainingSession, StopAtStepHook, TrainState
from monitored_mlflow import STEP_TAG, MlflowConfigError, MlflowHook, run_status
from monitored_summaries import summary_iterator


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    state["w"] += 1
    loss = np.float32(1.0 / state.global_step)
    return {"loss": loss, "lr": 0.1, "w": state["w"], "flag": True}


def recording_step(state: TrainState) -> dict[str, Any]:
    """``step``, recording summaries: a scalar of its own, the loss it returns, a histogram."""
    outputs = step(state)
    summaries.scalar("x", 2.0 * state.global_step)
    summaries.scalar("loss", outputs["loss"])
    summaries.histogram("h", np.arange(4.0))
    return outputs


def only_run(uri: str, experiment: str = "monitored") -> Run:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    [run] = client.search_runs([found.experiment_id])
    return run


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key)]


async def train(
    uri: str,
    last_step: int,
    *,
    checkpoint_dir: Path | None = None,
    options: dict[str, Any] | None = None,
    hooks: list[object] = (),  # type: ignore[assignment]
    fail_at: int | None = None,
    evaluate: dict[int, dict[str, float]] | None = None,
    step_fn: Callable[[TrainState], dict[str, Any]] = step,
    summary_dir: Path | None = None,
    save_summaries_steps: int = 100,
) -> MonitoredSession:
    plugin_options = {"mlflow": {"tracking_uri": uri, "log_every_n_steps": 10, **(options or {})}}
    async with MonitoredTrainingSession(
        TrainState({"w": np.zeros(2, np.float32)}),
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        save_checkpoint_steps=10 if checkpoint_dir is not None else None,
        summary_dir=None if summary_dir is None else str(summary_dir),
        save_summaries_steps=save_summaries_steps,
        log_step_count_steps=5,
        hooks=[*hooks, StopAtStepHook(last_step=last_step)],
        plugin_options=plugin_options,
        stop_grace_period_secs=60,
    ) as sess:
        while not sess.should_stop():
            await sess.run(step_fn)
            global_step = sess.state.global_step
            if fail_at is not None and global_step == fail_at:
                raise RuntimeError(f"boom at step {global_step}")
            if evaluate and global_step in evaluate:
                await sess.report_evaluation(global_step, evaluate[global_step])
    return sess


async def test_a_run_records_params_scalars_rates_evaluations_tags_and_finishes(
    tracking_uri: str,
) -> None:
    sess = await train(
        tracking_uri,
        25,
        options={"params": {"model": {"hidden": 64}}, "tags": {"team": "a"}},
        evaluate={20: {"accuracy": 0.5, "loss": 0.7}},
    )
    [hook] = [i.plugin for i in sess.plugins if isinstance(i.plugin, MlflowHook)]
    run = only_run(tracking_uri)
    assert run.info.run_id == hook.run_id
    assert run.info.status == "FINISHED"
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "loss")] == [10, 20, 25], (
        "every log_every_n_steps, and the last step"
    )
    assert history(tracking_uri, run.info.run_id, "loss")[0] == (10, pytest.approx(0.1))
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "lr")] == [10, 20, 25]
    assert "w" not in run.data.metrics, "arrays are not scalars"
    assert "flag" not in run.data.metrics, "booleans are not metrics"
    assert history(tracking_uri, run.info.run_id, "eval/accuracy") == [(20, 0.5)]
    rates = history(tracking_uri, run.info.run_id, "global_step/sec")
    assert [s for s, _ in rates] == [6, 11, 16, 21], "at the step the step counter wrote it"
    assert all(rate > 0 for _, rate in rates)
    params = run.data.params
    assert params["model.hidden"] == "64"
    assert params["plugin.mlflow.log_every_n_steps"] == "10"
    assert {key for key in params if key.startswith("plugin.")} == {
        "plugin.mlflow.tracking_uri",
        "plugin.mlflow.log_every_n_steps",
    }, "options at their defaults are not logged, nor params and tags as options"
    assert params["config.log_step_count_steps"] == "5"
    tags = run.data.tags
    assert tags["team"] == "a"
    assert tags["monitored.version"] == monitored.__version__
    assert tags["monitored.plugin.mlflow"].startswith("monitored-mlflow ")
    assert tags[STEP_TAG] == "25"
    assert len(tags["mlflow.source.git.commit"]) == 40, "this test runs in a git checkout"
    assert hook.sender is not None
    assert (hook.sender.dropped, hook.sender.ended_as) == (0, "FINISHED")


async def test_a_run_whose_session_fails_ends_failed(tracking_uri: str) -> None:
    with pytest.raises(RuntimeError, match="boom at step 12"):
        await train(tracking_uri, 100, fail_at=12)
    run = only_run(tracking_uri)
    assert run.info.status == "FAILED"
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "loss")] == [10]


async def test_an_interrupted_session_ends_killed(tracking_uri: str) -> None:
    class Interrupt:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            if run_context.session.state.global_step == 7:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await train(tracking_uri, 100, hooks=[Interrupt()])
    assert only_run(tracking_uri).info.status == "KILLED"


async def test_a_cancelled_session_ends_killed(tracking_uri: str) -> None:
    with anyio.move_on_after(3):
        await train(tracking_uri, 10**9)
    assert only_run(tracking_uri).info.status == "KILLED"


def test_run_status_maps_how_a_session_ended() -> None:
    assert run_status(None) == "FINISHED"
    assert run_status(ValueError("x")) == "FAILED"
    assert run_status(KeyboardInterrupt()) == "KILLED"
    assert run_status(SystemExit(1)) == "KILLED"
    assert run_status(BaseExceptionGroup("g", [KeyboardInterrupt()])) == "KILLED"
    assert run_status(BaseExceptionGroup("g", [KeyboardInterrupt(), ValueError()])) == "FAILED"


async def test_a_resumed_training_continues_the_same_run_without_duplicate_points(
    tracking_uri: str, tmp_path: Path
) -> None:
    # Checkpoints at 10 and 20; the run dies at 27 after logging up to 25 (its last
    # step, 27, is not logged: the session failed). The resume starts again at 20.
    with pytest.raises(RuntimeError, match="boom"):
        await train(
            tracking_uri,
            100,
            checkpoint_dir=tmp_path / "ckpt",
            fail_at=27,
            options={"log_every_n_steps": 5},
        )
    first = only_run(tracking_uri)
    assert first.info.status == "FAILED"
    sess = await train(
        tracking_uri, 40, checkpoint_dir=tmp_path / "ckpt", options={"log_every_n_steps": 5}
    )
    assert sess.restored_from is not None
    run = only_run(tracking_uri)  # still one run
    assert run.info.run_id == first.info.run_id
    assert run.info.status == "FINISHED"
    steps = [s for s, _ in history(tracking_uri, run.info.run_id, "loss")]
    assert steps == [5, 10, 15, 20, 25, 30, 35, 40], "each step once, across the resume"


async def test_checkpoints_all_are_logged_as_artifacts(tracking_uri: str, tmp_path: Path) -> None:
    await train(
        tracking_uri, 20, checkpoint_dir=tmp_path / "ckpt", options={"log_checkpoints": "all"}
    )
    run = only_run(tracking_uri)
    client = MlflowClient(tracking_uri)
    names = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    saved = {f"checkpoints/{p.name}" for p in (tmp_path / "ckpt").iterdir() if "ckpt-" in p.name}
    assert saved
    assert saved <= names
    assert not (Path.cwd() / "mlruns").exists()
    assert (tmp_path / "mlartifacts").is_dir(), "artifacts beside the SQLite database"


async def test_checkpoints_best_logs_those_of_improving_evaluations(
    tracking_uri: str, tmp_path: Path
) -> None:
    await train(
        tracking_uri,
        30,
        checkpoint_dir=tmp_path / "ckpt",
        options={"log_checkpoints": "best", "best_metric": "accuracy", "best_mode": "max"},
        evaluate={10: {"accuracy": 0.5}, 20: {"accuracy": 0.4}, 30: {"accuracy": 0.9}},
    )
    run = only_run(tracking_uri)
    client = MlflowClient(tracking_uri)
    names = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    steps = {name.split("-", 1)[1].split(".")[0] for name in names}
    assert steps == {"10", "30"}, names
    assert run.data.tags["monitored.best_checkpoint"] == "model.ckpt-30"


async def test_an_explicit_hook_logs_a_plain_session_and_its_optimizer(tracking_uri: str) -> None:
    optimizer = monitored.MomentumOptimizer(0.05, momentum=0.9)
    hook = MlflowHook(
        tracking_uri,
        experiment="plain",
        optimizer=optimizer,
        log_every_n_steps=3,
        params={"batch": 32},
    )
    async with MonitoredSession(
        TrainState({"w": np.zeros(2, np.float32)}), hooks=[hook, StopAtStepHook(last_step=7)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    run = only_run(tracking_uri, "plain")
    assert run.data.params["optimizer"] == "MomentumOptimizer"
    assert run.data.params["optimizer.momentum"] == "0.9"
    assert run.data.params["optimizer.learning_rate"] == "0.05"
    assert run.data.params["batch"] == "32"
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "loss")] == [3, 6, 7]


async def test_the_summaries_plugins_hparams_are_logged_as_params(
    tracking_uri: str, tmp_path: Path
) -> None:
    from monitored_summaries import SummarySaverHook

    summaries = SummarySaverHook(save_steps=5, output_dir=tmp_path / "logs", hparams={"lr": 0.3})
    await train(tracking_uri, 6, hooks=[summaries])
    assert only_run(tracking_uri).data.params["lr"] == "0.3"


async def test_a_worker_logs_nothing(tracking_uri: str) -> None:
    hook = MlflowHook(tracking_uri, experiment="workers")
    state = TrainState({"w": np.zeros(2, np.float32)})
    state.initialized = True  # a worker waits for the chief's state; here it is ready
    async with MonitoredTrainingSession(
        state,
        hooks=[hook, StopAtStepHook(last_step=3)],
        is_chief=False,
        plugin_options={"mlflow": {"tracking_uri": tracking_uri}},
    ) as sess:
        assert "mlflow" not in [i.name for i in sess.plugins], "chief_only: not loaded"
        while not sess.should_stop():
            await sess.run(step)
    assert hook.sender is None
    assert MlflowClient(tracking_uri).get_experiment_by_name("workers") is None


async def test_an_explicit_hook_takes_the_capability_over_from_the_plugin(
    tracking_uri: str, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, "monitored")
    mine = MlflowHook(tracking_uri, log_every_n_steps=2)
    sess = await train(tracking_uri, 4, hooks=[mine])
    hooks = [i.plugin for i in sess.plugins if isinstance(i.plugin, MlflowHook)]
    assert hooks == [mine]
    assert any(
        "plugin 'mlflow'" in r.getMessage() and "steps aside" in r.getMessage()
        for r in caplog.records
    )
    assert [s for s, _ in history(tracking_uri, only_run(tracking_uri).info.run_id, "loss")] == [
        2,
        4,
    ]


async def test_the_session_calls_the_hook_only_on_its_due_steps(tracking_uri: str) -> None:
    mine = MlflowHook(tracking_uri, log_every_n_steps=4)
    calls: list[int] = []
    after_run = mine.after_run

    def recording(run_context: Any, run_values: Any) -> None:
        calls.append(run_context.session.state.global_step)
        after_run(run_context, run_values)

    mine.after_run = recording  # type: ignore[method-assign]
    await train(tracking_uri, 10, hooks=[mine])
    assert calls == [4, 8]  # skip_step_hooks: the steps in between call nothing of it
    logged = history(tracking_uri, only_run(tracking_uri).info.run_id, "loss")
    assert [s for s, _ in logged] == [4, 8, 10]  # and the last step, from `end`


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"log_every_n_steps": 0}, "log_every_n_steps must be a positive int"),
        ({"log_checkpoints": "some"}, "log_checkpoints must be None, 'best' or 'all'"),
        ({"best_mode": "up"}, "best_mode must be 'min' or 'max'"),
        ({"retries": -1}, "retries must be an int >= 0"),
        ({"backoff_secs": float("nan")}, "backoff_secs must be a number >= 0"),
        ({"max_pending": 0}, "max_pending must be a positive int"),
        ({"start_timeout_secs": -1}, "start_timeout_secs must be a number >= 0"),
        ({"start_timeout_secs": float("nan")}, "start_timeout_secs must be a number >= 0"),
        ({"params": {"": 1}}, "params: keys must be non-empty strings"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(MlflowConfigError, match=message):
        MlflowHook("sqlite:///x.db", **kwargs)


async def test_a_bad_plugin_option_is_an_error_at_session_start(tracking_uri: str) -> None:
    with pytest.raises(MlflowConfigError, match="mlflow.log_checkpoints must be"):
        await train(tracking_uri, 2, options={"log_checkpoints": "every"})


async def test_malformed_saved_state_is_refused_naming_the_plugin(tracking_uri: str) -> None:
    hook = MlflowHook(tracking_uri)
    with pytest.raises(MlflowConfigError, match="mlflow_run: saved run_key"):
        hook.load_plugin_state(None, {"run_id": None, "run_key": 3})  # type: ignore[arg-type]
    with pytest.raises(MlflowConfigError, match="mlflow_run: saved run_id"):
        hook.load_plugin_state(None, {"run_id": 5, "run_key": "k"})  # type: ignore[arg-type]


class Sink:
    """A third-party summary sink: a plain hook implementing ``write_summaries``."""

    def __init__(self) -> None:
        self.got: list[tuple[int, str, float]] = []

    def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
        self.got.extend((step, tag, float(value)) for tag, value in summaries.items())

    def points(self, tag: str) -> list[tuple[int, float]]:
        return [(step, value) for step, name, value in self.got if name == tag]


def event_file_points(logdir: Path, tag: str) -> list[int]:
    """The steps of ``tag``'s scalar points in ``logdir``'s event files, in order."""
    return [
        event.step
        for path in sorted(glob.glob(str(logdir / "events.out.tfevents.*")))
        for event in summary_iterator(path)
        for value in event.summary.value
        if value.tag == tag and value.WhichOneof("value") == "simple_value"
    ]


async def test_scalars_a_step_records_reach_mlflow_and_every_sink_once_at_the_step_written(
    tracking_uri: str, tmp_path: Path
) -> None:
    sink = Sink()
    await train(
        tracking_uri,
        21,
        hooks=[sink],
        step_fn=recording_step,
        summary_dir=tmp_path / "logs",
        save_summaries_steps=10,
    )
    run = only_run(tracking_uri)
    written = [(1, 2.0), (11, 22.0), (21, 42.0)]  # the summaries plugin's due steps
    assert history(tracking_uri, run.info.run_id, "x") == written
    assert sink.points("x") == written
    assert event_file_points(tmp_path / "logs", "x") == [1, 11, 21], "once in TensorBoard"
    assert event_file_points(tmp_path / "logs", "loss") == [1, 11, 21]
    # loss is both recorded (1, 11, 21) and returned (every 10 steps and the last):
    # the last step, 21, has it from both and holds it once.
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "loss")] == [1, 10, 11, 20, 21]
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "lr")] == [10, 20, 21]
    assert "h" not in run.data.metrics, "histograms stay in the event file"
    assert [s for s, _ in sink.points("global_step/sec")] == [6, 11, 16, 21]


async def test_a_resumed_run_logs_what_steps_record_without_duplicate_points(
    tracking_uri: str, tmp_path: Path
) -> None:
    # Checkpoints every 10 steps, summaries at 1, 6, 11, ... The first run dies at 27
    # after sending x at 26; the resume restarts from 20 and records 21 and 26 again.
    for last_step, fail_at in ((100, 27), (40, None)):
        with pytest.raises(RuntimeError, match="boom") if fail_at else contextlib.nullcontext():
            await train(
                tracking_uri,
                last_step,
                checkpoint_dir=tmp_path / "ckpt",
                fail_at=fail_at,
                step_fn=recording_step,
                save_summaries_steps=5,
                options={"log_every_n_steps": 5},
            )
    run = only_run(tracking_uri)
    assert run.info.status == "FINISHED"
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "x")] == [
        1, 6, 11, 16, 21, 26, 31, 36,
    ]  # fmt: skip
    steps = [s for s, _ in history(tracking_uri, run.info.run_id, "loss")]
    assert steps == sorted({*range(1, 40, 5), *range(5, 41, 5)}), "each step once"


@pytest.mark.parametrize("last_step", [251, 252, 301, 1244, 1301])
async def test_the_last_step_is_logged_whatever_the_step_count(
    tracking_uri: str, tmp_path: Path, last_step: int
) -> None:
    # The new user's setting: checkpoints every 100 steps, scalars every 50.
    async with MonitoredTrainingSession(
        TrainState({"w": np.zeros(2, np.float32)}),
        checkpoint_dir=str(tmp_path / "ckpt"),
        save_checkpoint_steps=100,
        hooks=[StopAtStepHook(last_step=last_step)],
        plugin_options={"mlflow": {"tracking_uri": tracking_uri, "log_every_n_steps": 50}},
        stop_grace_period_secs=60,
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    run = only_run(tracking_uri)
    expected = [*range(50, last_step + 1, 50)]
    if last_step % 50:
        expected.append(last_step)
    assert [s for s, _ in history(tracking_uri, run.info.run_id, "loss")] == expected
    assert run.data.tags[STEP_TAG] == str(last_step)


async def test_the_run_starts_when_the_session_started_not_when_the_sender_created_it(
    tracking_uri: str,
) -> None:
    before = int(time.time() * 1000)
    async with MonitoredTrainingSession(
        TrainState({"w": np.zeros(2, np.float32)}),
        hooks=[StopAtStepHook(last_step=20)],
        plugin_options={"mlflow": {"tracking_uri": tracking_uri, "log_every_n_steps": 10}},
        stop_grace_period_secs=60,
    ) as sess:
        entered = int(time.time() * 1000)
        while not sess.should_stop():
            await sess.run(step)
            await anyio.sleep(0.05)  # a second of training
    run = only_run(tracking_uri)
    assert before <= run.info.start_time <= entered
    assert run.info.end_time - run.info.start_time >= 1000, "20 steps of 50 ms at least"


async def test_code_plugin_options_win_over_the_environments_and_only_changed_ones_are_params(
    tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "MONITORED_PLUGIN_OPTIONS",
        "mlflow.run_name=fromenv;mlflow.experiment=envexp;nan_guard.max_rollbacks=5",
    )
    await train(tracking_uri, 5, options={"run_name": "fromcode"})
    run = only_run(tracking_uri, "envexp")
    assert run.info.run_name == "fromcode", "the code's option wins"
    params = run.data.params
    assert params["plugin.mlflow.run_name"] == "fromcode"
    assert params["plugin.mlflow.experiment"] == "envexp", "the environment's, where code is silent"
    assert params["plugin.nan_guard.max_rollbacks"] == "5", "another plugin's changed option"
    assert "plugin.nan_guard.on_nan" not in params, "a default"


async def test_a_run_is_named_after_its_checkpoint_directory_by_default(
    tracking_uri: str, tmp_path: Path
) -> None:
    await train(tracking_uri, 5, checkpoint_dir=tmp_path / "runs" / "demo")
    assert only_run(tracking_uri).info.run_name == "demo"


async def test_without_a_checkpoint_directory_mlflow_names_the_run(tracking_uri: str) -> None:
    await train(tracking_uri, 5)
    assert only_run(tracking_uri).info.run_name  # MLflow's own (adjective-animal-number)


def outputs_step(state: TrainState) -> dict[str, Any]:
    """Every kind of step output: scalars of every sort, and what no sink takes."""
    state.global_step += 1
    return {
        "loss": np.float32(1.0 / state.global_step),
        "grad_norm": np.array([2.0]),
        "count": 3,
        "rate": 0.5,
        "zero_d": np.array(4.0, np.float64),
        "flag": True,
        "np_flag": np.bool_(False),
        "vector": np.arange(3.0),
        "name": "x",
    }


async def test_tensorboard_and_mlflow_get_the_same_scalar_outputs_from_one_run(
    tracking_uri: str, tmp_path: Path
) -> None:
    # One rule (monitored.scalar_outputs) for every sink: the summaries plugin's event
    # file and the MLflow run hold the same step outputs by name.
    await train(
        tracking_uri, 20, step_fn=outputs_step, summary_dir=tmp_path, save_summaries_steps=10
    )
    in_file = {
        value.tag
        for path in glob.glob(str(tmp_path / "events.out.tfevents.*"))
        for event in summary_iterator(path)
        for value in event.summary.value
    }
    run = only_run(tracking_uri)
    in_mlflow = set(run.data.metrics)
    expected = {"loss", "grad_norm", "count", "rate", "zero_d"}
    assert in_file - {"global_step/sec"} == expected
    assert in_mlflow - {"global_step/sec"} == expected
