"""The examples run and do what they say."""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import pytest

import monitored

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_demo_learns_the_digits_and_ends_with_the_final_evaluation(capsys: Any) -> None:
    demo = load("demo")
    state = anyio.run(demo.train, 600, 0, None)
    accuracy = demo.accuracy(state, *demo.load_data(0)[1::2])
    assert accuracy > 0.9
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"held-out accuracy after {state.global_step} steps: {accuracy:.3f}")


def test_demo_stops_early_on_held_out_accuracy(caplog: Any) -> None:
    demo = load("demo")
    with caplog.at_level(logging.INFO):
        state = anyio.run(demo.train, 5000, 0, None)
    assert state.global_step < 5000
    assert "stop requested by EarlyStoppingHook" in caplog.text


def test_demo_resumes_bit_for_bit_from_its_checkpoint(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")  # the checkpoint plugin is needed
    demo = load("demo")
    anyio.run(demo.train, 200, 0, str(tmp_path / "resumed"))
    resumed = anyio.run(demo.train, 400, 0, str(tmp_path / "resumed"))
    straight = anyio.run(demo.train, 400, 0, str(tmp_path / "straight"))
    assert resumed.global_step == straight.global_step == 400
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)


def test_tf1_cifar10_port_learns_the_digits() -> None:
    port = load("tf1_cifar10_port")
    state = anyio.run(port.train, 1000, 0, None)
    _, x_test, _, y_test = port.load_data(0)
    assert port.evaluate(state, x_test, y_test) > 0.9  # with the averaged weights
    # The constants and the loss averages are state, but not trained or averaged.
    assert state.non_trainable == {"input/mean", "input/std", "cross_entropy/avg", "total_loss/avg"}
    assert "input/mean/avg_weights" not in state
    assert "local3/weights/avg_weights" in state


def test_tf1_cifar10_port_resumes_bit_for_bit(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")  # the checkpoint plugin is needed
    port = load("tf1_cifar10_port")
    anyio.run(port.train, 300, 0, str(tmp_path / "resumed"))
    resumed = anyio.run(port.train, 600, 0, str(tmp_path / "resumed"))
    straight = anyio.run(port.train, 600, 0, str(tmp_path / "straight"))
    assert resumed.global_step == straight.global_step == 600
    assert sorted(resumed) == sorted(straight)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
    assert resumed.non_trainable == straight.non_trainable  # declared in code, not checkpointed


def test_tf1_cifar10_port_feeding_the_rate_from_a_hook_equals_the_schedule() -> None:
    port = load("tf1_cifar10_port")
    schedule = monitored.exponential_decay(0.1, 100, 0.1, staircase=True)
    scheduled = anyio.run(lambda: port.train(150, 0, None, schedule=schedule))
    fed = anyio.run(lambda: port.train(150, 0, None, schedule=schedule, feed_learning_rate=True))
    assert port.OPTIMIZER.learning_rate == schedule(149)  # set, as a number, every step
    for name in scheduled:
        np.testing.assert_array_equal(fed[name], scheduled[name], err_msg=name)


def test_tf1_ptb_supervisor_port_resumes_bit_for_bit(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    # Issue 22's Supervisor script: an epoch loop with a learning rate assigned each
    # epoch, validation and test passes, summaries and sv.saver.save(session, ...),
    # killed (stopped) in the middle of an epoch and started again.
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")  # checkpoints and summaries
    port = load("tf1_ptb_supervisor")
    straight, straight_results = anyio.run(
        lambda: port.main(str(tmp_path / "straight"), max_max_epoch=3)
    )
    with caplog.at_level(logging.WARNING, logger="monitored"):
        stopped, _ = anyio.run(
            lambda: port.main(str(tmp_path / "resumed"), max_max_epoch=3, stop_at_step=70)
        )
        assert stopped.global_step == 70  # in the middle of the second epoch (49 steps each)
        resumed, resumed_results = anyio.run(
            lambda: port.main(str(tmp_path / "resumed"), max_max_epoch=3)
        )
    assert "has not been increased" not in caplog.text, "validation steps are not warned about"
    assert resumed.global_step == straight.global_step == 3 * 49
    assert sorted(resumed) == sorted(straight)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
    assert resumed.rng_state == straight.rng_state
    for key in ("valid/2", "valid/3", "test"):
        assert resumed_results[key] == straight_results[key], key
    assert straight_results["valid/3"] < straight_results["valid/1"] < 24  # it learns
    # sv.saver.save(session, save_path, global_step=sv.global_step): TF1's <save_path>-<step>.
    assert (tmp_path / f"resumed-{resumed.global_step}.json").exists()
    import monitored_summaries

    tags = {
        value.tag
        for path in (tmp_path / "resumed").glob("events.out.tfevents.*")
        for event in monitored_summaries.summary_iterator(path)
        for value in event.summary.value
    }
    assert {"Train/Training_Loss", "Train/Learning_Rate", "Valid/Validation_Perplexity"} <= tags


def test_horovod_digits_port_alone_learns_and_resumes_bit_for_bit(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # One process: the Horovod-style script runs unchanged (mpiexec runs are in
    # plugins/mpi/tests/test_mpi_jobs.py).
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    port = load("horovod_digits")
    straight = anyio.run(port.main, ["--steps", "120", "--checkpoint-dir", str(tmp_path / "a")])
    anyio.run(port.main, ["--steps", "60", "--checkpoint-dir", str(tmp_path / "b")])
    resumed = anyio.run(port.main, ["--steps", "120", "--checkpoint-dir", str(tmp_path / "b")])
    assert resumed.global_step == straight.global_step == 120
    assert port.digest(resumed) == port.digest(straight)
    _, x_test, _, y_test = port.load_data()
    assert port.accuracy(straight, x_test, y_test) > 0.85


def test_tf1_estimator_port_learns_and_serves_with_its_predict_function() -> None:
    port = load("tf1_estimator_port")
    state, result = anyio.run(port.train, 600, 0, None)
    assert result.global_step == state.global_step == 600
    assert result.metrics["accuracy"] > 0.93
    assert result.metrics["auc"] > 0.97
    # What replaces the SavedModel: the state (or a checkpoint) and predict().
    _, (wide, deep, labels) = port.load_data(0)
    probability = port.predict(state, wide, deep)
    assert float(((probability > 0.5) == labels).mean()) == result.metrics["accuracy"]


def test_tf1_estimator_port_resumes_bit_for_bit(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")  # the checkpoint plugin is needed
    port = load("tf1_estimator_port")
    anyio.run(port.train, 250, 0, str(tmp_path / "resumed"))
    resumed, _ = anyio.run(port.train, 520, 0, str(tmp_path / "resumed"))
    straight, _ = anyio.run(port.train, 520, 0, str(tmp_path / "straight"))
    assert resumed.global_step == straight.global_step == 520
    assert sorted(resumed) == sorted(straight)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
    kept = sorted(p.name for p in (tmp_path / "resumed").glob("model.ckpt-*.json"))
    # keep_checkpoint_max=3 of those every 100 steps from the resumed step 250, and the last.
    assert kept == ["model.ckpt-350.json", "model.ckpt-450.json", "model.ckpt-520.json"]
    # Serving from the checkpoint (docs/evaluation.md): the same predictions.
    from monitored_checkpoint import latest_checkpoint, restore

    served = monitored.TrainState()
    restore(served, latest_checkpoint(str(tmp_path / "resumed")))
    _, (wide, deep, _) = port.load_data(0)
    np.testing.assert_array_equal(
        port.predict(served, wide, deep), port.predict(straight, wide, deep)
    )


def _newest_checkpoint_step(directory: Path) -> int:
    from monitored_checkpoint import latest_checkpoint

    path = latest_checkpoint(str(directory)) if directory.is_dir() else None
    return -1 if path is None else int(path.rsplit("-", 1)[1])


def kill_at_a_random_point(
    script: str, args: list[str], directory: Path, threshold: int, log: Path, rng: random.Random
) -> int:
    """Run the example ``script`` as a process and SIGKILL it at a random point once the
    newest checkpoint of ``directory`` reaches step ``threshold`` (between saves, or in one);
    its process id."""
    with log.open("w") as child_log:
        child = subprocess.Popen(
            [sys.executable, str(EXAMPLES / script), *args],
            stdout=child_log,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
        )
        try:
            deadline = time.monotonic() + 300
            while _newest_checkpoint_step(directory) < threshold:
                assert child.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "no checkpoint: " + log.read_text()
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    assert child.returncode == -signal.SIGKILL
    return child.pid


def test_tf1_estimator_port_resumes_bit_for_bit_after_sigkill(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The script, run as a process and killed with SIGKILL at a random point, then run
    again: its TrainSpec(input_fn=...) generator goes on after the batches already
    trained on, and the run ends bit for bit equal to one never interrupted."""
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    port = load("tf1_estimator_port")
    rng = random.Random(22)
    for trial, threshold in enumerate((100, 300, 600)):
        directory = tmp_path / f"killed-{trial}"
        log_path = tmp_path / f"child-{trial}.log"
        pid = kill_at_a_random_point(
            "tf1_estimator_port.py",
            ["--max-steps", "100000000", "--model-dir", str(directory)],  # killed long before
            directory,
            threshold,
            log_path,
            rng,
        )
        last = _newest_checkpoint_step(directory) + rng.randint(1, 150)
        # The killed run's claim on its directory is taken over, saying so.
        with pytest.warns(monitored.RunTakenOverWarning, match=f"process {pid} is gone"):
            resumed, _ = anyio.run(port.train, last, 0, str(directory))
        straight, _ = anyio.run(port.train, last, 0, str(tmp_path / f"straight-{trial}"))
        assert resumed.global_step == straight.global_step == last
        for name in straight:
            np.testing.assert_array_equal(resumed[name], straight[name], err_msg=(trial, name))


def test_sweep_prunes_a_poor_trial_and_finds_the_better_one(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import optuna

    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")  # checkpoints of each trial
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress")

    sweep = load("sweep")
    study = sweep.new_study(n_startup_trials=1, n_warmup_steps=10)
    # Two good trials run at once; the poor third starts once one has finished, and the
    # median of the finished prunes it at its first evaluation after the warm-up.
    study.enqueue_trial({"learning_rate": 0.1, "hidden": 64})
    study.enqueue_trial({"learning_rate": 0.05, "hidden": 32})
    study.enqueue_trial({"learning_rate": 0.001, "hidden": 8})
    anyio.run(sweep.sweep, study, 4, 60, 20, 2, str(tmp_path))
    trials = sorted(study.trials, key=lambda t: t.number)
    states = [t.state for t in trials]
    assert len(states) == 4
    assert states[:3] == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
    ]
    assert study.best_value > 0.8
    pruned = trials[2]
    assert max(pruned.intermediate_values) < 60, "pruned before its last step"
    directory = tmp_path / study.study_name / "trial-2"
    assert (directory / "checkpoint").exists(), "the pruned trial's checkpoint"


def test_sweep_stopped_before_any_trial_completed_says_so_and_makes_its_storage_dir(
    tmp_path: Path,
) -> None:
    """SIGTERM while the first trials train: no ``best_value`` error; ``runs/`` is made."""
    import optuna

    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_DISABLE_PLUGINS"] = "progress,summaries"
    db = tmp_path / "runs" / "sweep.db"  # runs/ does not exist yet
    command = [sys.executable, str(EXAMPLES / "sweep.py"), "--storage", f"sqlite:///{db}"]
    command += ["--trials", "2", "--steps", "1000000", "--concurrency", "2"]
    command += ["--checkpoint-dir", str(tmp_path / "ckpt")]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        # Both trials train once their sessions made their directories (the study is
        # not opened here meanwhile: Optuna would create its tables beside the child).
        trials = [tmp_path / "ckpt" / "sweep" / f"trial-{n}" for n in (0, 1)]
        while time.monotonic() < deadline and child.poll() is None:
            if all(t.exists() for t in trials):
                break
            time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == 0, err
    assert "2 trials: 0 complete, 0 pruned; no trial has completed yet" in out, out + err
    assert "Record does not exist" not in err
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING] * 2
