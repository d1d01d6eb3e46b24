"""The Estimator ports in examples/ learn, and resume bit for bit after a SIGKILL."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from test_examples import _newest_checkpoint_step as _newest_step
from test_examples import kill_at_a_random_point as _kill_at_a_random_point
from test_examples import load

import monitored
from monitored._core._plugins import installed_plugin_names


@pytest.fixture(autouse=True)
def _checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    keep = {"checkpoint", "summaries"}
    monkeypatch.setenv(
        "MONITORED_DISABLE_PLUGINS", ",".join(sorted(installed_plugin_names() - keep))
    )


def test_custom_estimator_learns_and_predicts_the_three_flowers(tmp_path: Path) -> None:
    port = load("tf1_custom_estimator")
    _, eval_result, predictions = anyio.run(port.main_async, 1000, 100, str(tmp_path))
    assert eval_result["global_step"] == 1000
    assert eval_result["accuracy"] >= 0.9
    species = [port.SPECIES[int(p["class_ids"][0])] for p in predictions]
    assert species == port.EXPECTED


def test_custom_estimator_resumes_bit_for_bit_after_sigkill(tmp_path: Path) -> None:
    port = load("tf1_custom_estimator")
    rng = random.Random(36)
    for trial, threshold in enumerate((100, 300)):
        directory = tmp_path / f"killed-{trial}"
        _kill_at_a_random_point(
            "tf1_custom_estimator.py",
            ["--train-steps", "100000000", "--model-dir", str(directory)],
            directory,
            threshold,
            tmp_path / f"child-{trial}.log",
            rng,
        )
        last = _newest_step(directory) + rng.randint(1, 150)
        with pytest.warns(monitored.RunTakenOverWarning, match="is gone"):  # the killed owner
            resumed, _, _ = anyio.run(port.main_async, last, 100, str(directory))
        straight, _, _ = anyio.run(port.main_async, last, 100, str(tmp_path / f"straight-{trial}"))
        names = straight.get_variable_names()
        assert resumed.get_variable_names() == names
        assert any(name.endswith("kernel") for name in names)
        for name in names:
            np.testing.assert_array_equal(
                resumed.get_variable_value(name), straight.get_variable_value(name), err_msg=name
            )
        assert _newest_step(directory) == last


def _arrays(port: Any, directory: Path) -> dict[str, np.ndarray]:
    estimator = port.build_estimator(str(directory), 0)
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_learn_runner_port_learns_with_its_metric_spec(tmp_path: Path) -> None:
    port = load("tf1_learn_runner")
    result = anyio.run(port.run, str(tmp_path), 600)
    assert result["global_step"] == 600
    assert result["accuracy"] > 0.9
    (_, _), (x_eval, y_eval) = port.load_data(0)
    arrays = _arrays(port, tmp_path)
    hidden = np.maximum(x_eval @ arrays["dense/kernel"] + arrays["dense/bias"], 0)
    classes = (hidden @ arrays["logits/kernel"] + arrays["logits/bias"]).argmax(axis=1)
    assert result["accuracy"] == pytest.approx(float(np.mean(classes == y_eval)))


def test_learn_runner_port_resumes_bit_for_bit_after_sigkill(tmp_path: Path) -> None:
    """Dropout draws from the state's generator: a resumed run drops the same units."""
    port = load("tf1_learn_runner")
    rng = random.Random(37)
    directory = tmp_path / "killed"
    _kill_at_a_random_point(
        "tf1_learn_runner.py",
        ["--train-steps", "100000000", "--output-path", str(directory)],
        directory,
        150,
        tmp_path / "child.log",
        rng,
    )
    last = _newest_step(directory) + rng.randint(1, 120)
    with pytest.warns(monitored.RunTakenOverWarning, match="is gone"):  # the killed owner
        anyio.run(port.run, str(directory), last)
    anyio.run(port.run, str(tmp_path / "straight"), last)
    resumed, straight = _arrays(port, directory), _arrays(port, tmp_path / "straight")
    assert sorted(resumed) == sorted(straight)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
