"""monitored.estimator: a model_fn on arrays trained, evaluated and predicted as TF's Estimator."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import metrics as m
from monitored._core._plugins import installed_plugin_names
from monitored.estimator import (
    Estimator,
    EstimatorError,
    EstimatorSpec,
    MetricSpec,
    ModeKeys,
    ModelFnError,
    RunConfig,
    get_variable,
    learn_runner,
    numpy_input_fn,
)

OPTIMIZER = monitored.GradientDescentOptimizer(0.5)


def _plugins_but(*wanted: str) -> str:
    return ",".join(sorted(installed_plugin_names() - set(wanted)))


@pytest.fixture(autouse=True)
def _checkpoints_and_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", _plugins_but("checkpoint", "summaries"))
    monkeypatch.delenv("TF_CONFIG", raising=False)


def _data(n: int = 256, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    x = rng.normal(0, 1, (n, 4)).astype(np.float32) + labels[:, None].astype(np.float32) * 1.5
    return {"x": x}, labels.astype(np.int64)


def logistic_model_fn(
    features: Any, labels: Any, mode: str, params: dict[str, Any]
) -> EstimatorSpec:
    """TF's custom-estimator shape: a logistic regression whose update is a function."""
    w = get_variable("w", (4,), initializer=np.zeros(4, np.float32))
    b = get_variable("b", (), initializer=0.0)
    logits = features["x"] @ w + b
    probability = 1 / (1 + np.exp(-logits))
    predictions = {"probability": probability, "class": (probability > 0.5).astype(np.int64)}
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions=predictions)
    y = labels.astype(np.float32)
    loss = np.mean(np.logaddexp(0, logits) - y * logits)
    if mode == ModeKeys.EVAL:
        return EstimatorSpec(
            mode,
            loss=loss,
            predictions=predictions,
            eval_metric_ops={"accuracy": m.Accuracy().updated(labels, predictions["class"])},
        )
    d = (probability - y) / len(y)
    state = monitored.estimator.current_state()

    def train_op() -> None:
        params["optimizer"].apply_gradients(
            state, {"w": (features["x"].T @ d).astype(np.float32), "b": np.float32(d.sum())}
        )

    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def _estimator(tmp_path: Path, **config: Any) -> Estimator:
    return Estimator(
        logistic_model_fn,
        model_dir=tmp_path / "model",
        config=RunConfig(tf_random_seed=0, save_checkpoints_steps=10, **config),
        params={"optimizer": monitored.GradientDescentOptimizer(0.5)},
    )


async def test_train_evaluate_predict(tmp_path: Path) -> None:
    x, y = _data()
    est = _estimator(tmp_path)
    train_input = numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True)
    assert await est.train(train_input, max_steps=40) is est
    assert est.get_variable_value("w").shape == (4,)
    assert "w" in est.get_variable_names()
    assert est.latest_checkpoint() is not None
    result = await est.evaluate(numpy_input_fn(x, y, batch_size=64, shuffle=False))
    assert result["global_step"] == 40
    assert set(result) == {"accuracy", "loss", "global_step"}
    w, b = est.get_variable_value("w"), est.get_variable_value("b")
    logits = x["x"] @ w + b
    expected_accuracy = np.mean((logits > 0).astype(np.int64) == y)
    assert result["accuracy"] == pytest.approx(expected_accuracy)
    assert result["accuracy"] > 0.8
    batch_losses = [
        np.mean(np.logaddexp(0, logits[i : i + 64]) - y[i : i + 64] * logits[i : i + 64])
        for i in range(0, 256, 64)
    ]
    assert result["loss"] == pytest.approx(np.mean(batch_losses), rel=1e-5)
    predictions = [p async for p in est.predict(numpy_input_fn(x, batch_size=100, shuffle=False))]
    assert len(predictions) == 256
    assert set(predictions[0]) == {"probability", "class"}
    classes = np.array([p["class"] for p in predictions])
    np.testing.assert_array_equal(classes, (logits > 0).astype(np.int64))
    only = [
        p
        async for p in est.predict(
            numpy_input_fn(x, batch_size=100, shuffle=False), predict_keys="class"
        )
    ]
    assert set(only[0]) == {"class"}


async def test_steps_continue_and_max_steps_reached_skips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x, y = _data()
    est = _estimator(tmp_path)
    train_input = numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True)
    await est.train(train_input, steps=15)
    await est.train(train_input, steps=5)
    assert (await est.evaluate(numpy_input_fn(x, y, shuffle=False)))["global_step"] == 20
    with caplog.at_level(logging.INFO, logger="monitored"):
        await est.train(train_input, max_steps=20)
    assert "Skipping training since max_steps (20)" in caplog.text
    with pytest.raises(EstimatorError, match="both steps and max_steps"):
        await est.train(train_input, steps=1, max_steps=2)
    with pytest.raises(EstimatorError, match="steps > 0"):
        await est.train(train_input, steps=0)


async def test_resume_is_exact(tmp_path: Path) -> None:
    """Two trainings of 10 + 20 steps end where one of 30 does, bit for bit."""
    x, y = _data()
    one = _estimator(tmp_path / "one")
    two = _estimator(tmp_path / "two")
    train_input = numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True)
    await one.train(train_input, max_steps=30)
    await two.train(train_input, max_steps=10)
    await two.train(train_input, max_steps=30)
    for name in ("w", "b"):
        np.testing.assert_array_equal(one.get_variable_value(name), two.get_variable_value(name))


async def test_metric_spec_and_learn_runner(tmp_path: Path) -> None:
    x, y = _data()

    def experiment_fn(output_dir: str) -> monitored.estimator.Experiment:
        est = Estimator(
            logistic_model_fn,
            model_dir=output_dir,
            config=RunConfig(tf_random_seed=0, save_checkpoints_steps=20),
            params={"optimizer": monitored.GradientDescentOptimizer(0.5)},
        )
        return monitored.estimator.Experiment(
            est,
            train_input_fn=numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True),
            eval_input_fn=numpy_input_fn(x, y, batch_size=64, shuffle=False),
            eval_metrics={"recall": MetricSpec(m.Recall, prediction_key="class")},
            train_steps=40,
            eval_steps=None,
            min_eval_frequency=20,
        )

    result, exports = await learn_runner.run(experiment_fn, output_dir=str(tmp_path / "lr"))
    assert exports == []
    assert result["global_step"] == 40
    assert set(result) == {"loss", "accuracy", "recall", "global_step"}
    est = Estimator(
        logistic_model_fn,
        model_dir=tmp_path / "lr",
        params={"optimizer": OPTIMIZER},
    )
    w, b = est.get_variable_value("w"), est.get_variable_value("b")
    predicted = (x["x"] @ w + b) > 0
    recall = np.sum(predicted & (y == 1)) / np.sum(y == 1)
    assert result["recall"] == pytest.approx(recall)
    with pytest.raises(EstimatorError, match="exactly one of output_dir and run_config"):
        await learn_runner.run(experiment_fn)
    with pytest.raises(EstimatorError, match="not a schedule"):
        await learn_runner.run(experiment_fn, output_dir=str(tmp_path / "lr"), schedule="fly")


async def test_learn_runner_refuses_a_parameter_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"task": {"type": "ps", "index": 0}}')
    with pytest.raises(EstimatorError, match="no parameter servers"):
        await learn_runner.run(
            lambda output_dir: monitored.estimator.Experiment(
                _estimator(tmp_path),
                numpy_input_fn(*_data(), shuffle=False),
                numpy_input_fn(*_data(), shuffle=False),
            ),
            output_dir=str(tmp_path),
        )


def test_model_fn_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(EstimatorError, match="argument named features"):
        Estimator(lambda x, labels: None, model_dir=tmp_path)
    with pytest.raises(EstimatorError, match=r"does not give: \['batch'\]"):
        Estimator(lambda features, batch: None, model_dir=tmp_path)
    with pytest.raises(EstimatorError, match="params"):
        Estimator(lambda features: None, model_dir=tmp_path, params={"a": 1})
    with pytest.raises(EstimatorError, match="differently"):
        Estimator(lambda features: None, model_dir=tmp_path / "a", config=RunConfig(tmp_path / "b"))


def test_spec_is_checked() -> None:
    with pytest.raises(ModelFnError, match="needs a train_op"):
        EstimatorSpec(ModeKeys.TRAIN, loss=1.0)
    with pytest.raises(ModelFnError, match="needs a loss"):
        EstimatorSpec(ModeKeys.EVAL)
    with pytest.raises(ModelFnError, match="needs predictions"):
        EstimatorSpec(ModeKeys.PREDICT)
    with pytest.raises(ModelFnError, match=r"\(value_op, update_op\)"):
        EstimatorSpec(ModeKeys.EVAL, loss=1.0, eval_metric_ops={"acc": (1, 2)})
    with pytest.raises(ModelFnError, match="SavedModel"):
        EstimatorSpec(ModeKeys.PREDICT, predictions=np.zeros(1), export_outputs={"a": 1})  # type: ignore[arg-type]
    with pytest.raises(ModelFnError, match="one of ModeKeys"):
        EstimatorSpec("training", loss=1.0, train_op=True)


async def test_a_persistent_metric_object_is_refused(tmp_path: Path) -> None:
    x, y = _data()
    await _estimator(tmp_path).train(
        numpy_input_fn(x, y, batch_size=32, shuffle=False), max_steps=5
    )
    shared = m.Accuracy()

    def model_fn(features: Any, labels: Any, mode: str) -> EstimatorSpec:
        w = get_variable("w", (4,))
        get_variable("b", ())
        shared.update(labels, (features["x"] @ w > 0).astype(np.int64))
        return EstimatorSpec(mode, loss=0.0, eval_metric_ops={"accuracy": shared})

    est = Estimator(model_fn, model_dir=tmp_path / "model")
    with pytest.raises(ModelFnError, match="same metric object"):
        await est.evaluate(numpy_input_fn(x, y, batch_size=64, shuffle=False))


async def test_wrong_input_and_spec_mode(tmp_path: Path) -> None:
    est = _estimator(tmp_path)
    with pytest.raises(EstimatorError, match="iterable of batches"):
        await est.train(lambda: 3, max_steps=1)
    with pytest.raises(EstimatorError, match="gave no batch"):
        await est.train(lambda: iter(()), max_steps=1)

    def wrong_mode(features: Any, labels: Any, mode: str) -> EstimatorSpec:
        return EstimatorSpec(ModeKeys.PREDICT, predictions=features["x"])

    x, y = _data()
    with pytest.raises(ModelFnError, match="called in mode 'train'"):
        await Estimator(wrong_mode, model_dir=tmp_path / "w").train(
            numpy_input_fn(x, y, shuffle=False), max_steps=1
        )


def test_run_config() -> None:
    config = RunConfig()
    assert config.save_checkpoints_secs == 600
    assert config.save_summary_steps == 100
    assert config.keep_checkpoint_max == 5
    assert config.replace(save_checkpoints_steps=10).save_checkpoints_secs is None
    with pytest.raises(EstimatorError, match="cannot both be set"):
        RunConfig(save_checkpoints_steps=1, save_checkpoints_secs=1)
    with pytest.raises(monitored.UnsupportedArgumentError, match="no tf.Session"):
        RunConfig(session_config=object())
    with pytest.raises(EstimatorError, match="not a RunConfig field"):
        RunConfig(save_checkpoint_steps=1)


def test_run_config_reads_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}',
    )
    config = RunConfig()
    assert (config.task_type, config.task_id, config.is_chief) == ("worker", 0, False)
    monkeypatch.setenv("TF_CONFIG", "{nope")
    with pytest.raises(EstimatorError, match="TF_CONFIG is not valid JSON"):
        RunConfig()


def test_numpy_input_fn() -> None:
    with pytest.raises(EstimatorError, match="shuffle must be given"):
        numpy_input_fn(np.zeros(3))
    with pytest.raises(EstimatorError, match="same number of rows"):
        numpy_input_fn(np.zeros(3), np.zeros(4), shuffle=False)
    batches = list(
        numpy_input_fn(
            {"a": np.arange(5)}, np.arange(5), batch_size=2, num_epochs=2, shuffle=False
        )()
    )
    assert [len(f["a"]) for f, _ in batches] == [2, 2, 1, 2, 2, 1]
    first = list(numpy_input_fn(np.arange(10), batch_size=10, shuffle=True, seed=3)())
    again = list(numpy_input_fn(np.arange(10), batch_size=10, shuffle=True, seed=3)())
    np.testing.assert_array_equal(first[0], again[0])
    assert sorted(first[0].tolist()) == list(range(10))


async def test_nothing_to_evaluate_or_predict_yet(tmp_path: Path) -> None:
    x, y = _data()
    est = _estimator(tmp_path)
    with pytest.raises(monitored.evaluation.NoCheckpointError):
        await est.evaluate(numpy_input_fn(x, y, shuffle=False))
    with pytest.raises(EstimatorError, match="no checkpoint in model_dir .*train first"):
        [p async for p in est.predict(numpy_input_fn(x, shuffle=False))]
    with pytest.raises(EstimatorError, match="no checkpoint in model_dir"):
        est.get_variable_names()


async def test_spec_hooks_join_the_run_and_warm_start(tmp_path: Path) -> None:
    """The first call's training_hooks see every step; warm_start_from fills a fresh run."""
    x, y = _data()
    seen: list[int] = []

    class Count:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append(run_context.session.state.global_step)

    counter = Count()

    def model_fn(features: Any, labels: Any, mode: str, params: dict[str, Any]) -> EstimatorSpec:
        spec = logistic_model_fn(features, labels, mode, params)
        if mode != ModeKeys.TRAIN:
            return spec
        return EstimatorSpec(mode, loss=spec.loss, train_op=spec.train_op, training_hooks=[counter])

    first = Estimator(
        model_fn,
        model_dir=tmp_path / "first",
        params={"optimizer": monitored.GradientDescentOptimizer(0.5)},
    )
    await first.train(
        numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True), max_steps=7
    )
    assert seen == [1, 2, 3, 4, 5, 6, 7]
    warm = Estimator(
        logistic_model_fn,
        model_dir=tmp_path / "warm",
        params={"optimizer": monitored.GradientDescentOptimizer(0.0)},
        warm_start_from=tmp_path / "first",
    )
    await warm.train(numpy_input_fn(x, y, batch_size=32, shuffle=False), max_steps=1)
    np.testing.assert_array_equal(warm.get_variable_value("w"), first.get_variable_value("w"))


def _experiment(tmp_path: Path, **kwargs: Any) -> monitored.estimator.Experiment:
    x, y = _data()
    return monitored.estimator.Experiment(
        _estimator(tmp_path),
        train_input_fn=numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True),
        eval_input_fn=numpy_input_fn(x, y, batch_size=64, shuffle=False),
        **kwargs,
    )


async def test_contrib_rounds_are_whole_and_evaluate_into_eval_one_pass(tmp_path: Path) -> None:
    """TF 1.x: 25 steps in rounds of 10 train 10, 20, 30 and evaluate each into eval_one_pass."""
    seen: list[int] = []

    class Evaluated:
        def end(self, session: Any) -> None:
            seen.append(session.state.global_step)

    experiment = _experiment(
        tmp_path, train_steps=25, train_steps_per_iteration=10, eval_hooks=[Evaluated()]
    )
    result, exports = await experiment.continuous_train_and_eval()
    assert exports == []
    assert result is not None
    assert result["global_step"] == 30
    assert seen == [10, 20, 30]
    assert list((tmp_path / "model" / "eval_one_pass").glob("events.out.tfevents.*"))
    assert not (tmp_path / "model" / "eval").exists()


async def test_contrib_test_local_run_and_train_data_evaluation(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path / "a", train_steps=12, min_eval_frequency=0)
    tested = await experiment.test()
    assert tested["global_step"] == 1
    result, _ = await experiment.local_run()
    assert result["global_step"] == 12
    on_train = await experiment.continuous_eval_on_train_data(
        delay_secs=0, throttle_delay_secs=0, continuous_eval_predicate_fn=lambda r: False
    )
    assert [r.global_step for r in on_train] == [12]
    assert list((tmp_path / "a" / "model" / "eval_train").glob("events.out.tfevents.*"))


def test_a_broken_eval_input_or_eval_mode_fails_when_the_experiment_is_made(tmp_path: Path) -> None:
    x, y = _data()
    with pytest.raises(EstimatorError, match="iterable of batches"):
        monitored.estimator.Experiment(
            _estimator(tmp_path), numpy_input_fn(x, y, shuffle=False), lambda: 3
        )

    def no_eval(features: Any, labels: Any, mode: str, params: dict[str, Any]) -> EstimatorSpec:
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(ModeKeys.PREDICT, predictions=features["x"])
        return logistic_model_fn(features, labels, mode, params)

    est = Estimator(no_eval, model_dir=tmp_path / "b", params={"optimizer": OPTIMIZER})
    with pytest.raises(ModelFnError, match="called in mode 'eval'"):
        monitored.estimator.Experiment(
            est, numpy_input_fn(x, y, shuffle=False), numpy_input_fn(x, y, shuffle=False)
        )
    with pytest.raises(EstimatorError, match="a monitored.estimator.Estimator"):
        monitored.estimator.Experiment(object(), list, list)  # type: ignore[arg-type]


async def test_a_train_op_function_may_call_current_state_itself(tmp_path: Path) -> None:
    """The update given as a function runs with the state current, as model_fn does."""
    x, y = _data()

    def model_fn(features: Any, labels: Any, mode: str, params: dict[str, Any]) -> EstimatorSpec:
        spec = logistic_model_fn(features, labels, mode, params)
        if mode != ModeKeys.TRAIN:
            return spec
        w = get_variable("w", (4,))
        grad = np.zeros_like(w) + 0.1

        def train_op() -> None:
            OPTIMIZER.apply_gradients(monitored.estimator.current_state(), {"w": grad})

        return EstimatorSpec(mode, loss=spec.loss, train_op=train_op)

    est = Estimator(model_fn, model_dir=tmp_path, params={"optimizer": OPTIMIZER})
    await est.train(numpy_input_fn(x, y, batch_size=32, shuffle=False), max_steps=3)
    np.testing.assert_allclose(est.get_variable_value("w"), -3 * 0.5 * 0.1)


async def test_training_writes_the_loss_and_the_step_rate_as_an_estimator_does(
    tmp_path: Path,
) -> None:
    """TensorBoard's reader finds ``loss`` every ``save_summary_steps``, once, and ``global_step/sec``.

    The loss is the train step's output, which the summaries plugin writes by the one rule
    for scalar outputs (``monitored.scalar_outputs``): at TF's steps 1, 11, 21, and the last
    (fetched one step late, written at their own step).
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = _data()
    est = _estimator(tmp_path, save_summary_steps=10, log_step_count_steps=10)
    await est.train(
        numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True), max_steps=30
    )
    accumulator = EventAccumulator(str(tmp_path / "model"), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert "loss" in tags
    assert "global_step/sec" in tags
    assert [event.step for event in accumulator.Scalars("loss")] == [1, 11, 21, 30]  # and the last


async def test_a_model_directory_named_with_control_characters_is_logged_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34 §2: training, evaluating and predicting from a model_dir whose name holds
    every control character, OSC 52 and a newline: the lines naming its checkpoints
    show them escaped, on one line. (Valid UTF-8: see the Supervisor's test.)"""
    from _hostile import HOSTILE, assert_safe_line

    x, y = _data(64)
    est = Estimator(
        logistic_model_fn,
        model_dir=tmp_path / HOSTILE.replace("\0", ""),
        config=RunConfig(tf_random_seed=0, save_checkpoints_steps=10),
        params={"optimizer": monitored.GradientDescentOptimizer(0.5)},
    )
    with caplog.at_level(logging.INFO, logger="monitored"):
        train_input = numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=False)
        await est.train(train_input, max_steps=4)
        await est.evaluate(numpy_input_fn(x, y, batch_size=64, shuffle=False))
        [p async for p in est.predict(numpy_input_fn(x, batch_size=64, shuffle=False))]
    named = [r.getMessage() for r in caplog.records if "pwned" in r.getMessage()]
    assert any(message.startswith("Predicting with") for message in named)
    assert any(message.startswith("Evaluating") for message in named)
    for message in named:
        assert_safe_line(message)


async def test_a_model_fn_that_never_increases_the_global_step_is_named_in_the_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stalled-step warning names the user's model_fn, not the estimator's internals."""
    x, y = _data()

    def frozen_model_fn(
        features: Any, labels: Any, mode: str, params: dict[str, Any]
    ) -> EstimatorSpec:
        spec = logistic_model_fn(features, labels, mode, params)
        return EstimatorSpec(mode, loss=spec.loss, train_op=lambda: None)

    est = Estimator(frozen_model_fn, model_dir=tmp_path, params={"optimizer": OPTIMIZER})
    caplog.set_level(logging.WARNING, logger="monitored")
    # One epoch of 16 batches ends the training (the global step would never reach a max).
    await est.train(numpy_input_fn(x, y, batch_size=16, shuffle=False, num_epochs=1))
    [warning] = [r.getMessage() for r in caplog.records if "not been increased" in r.getMessage()]
    assert "step function model_fn " in warning
    assert "frozen_model_fn (TRAIN)" in warning
    assert "_train_step" not in warning
