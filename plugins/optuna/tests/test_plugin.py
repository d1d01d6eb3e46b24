"""The installed ``optuna`` plugin: off by default, the current trial's, and one owner."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from typing import Any

import numpy as np
import optuna
import pytest

import monitored
from monitored.testing import run_session
from monitored_optuna import OptunaConfigError, OptunaPruningHook, use_trial
from monitored_optuna._plugin import hook_of

pytestmark = pytest.mark.anyio

optuna.logging.set_verbosity(optuna.logging.WARNING)

OPTIONS = {"optuna": {"monitor": "loss", "every_n_steps": 1}}


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv(
        "MONITORED_DISABLE_PLUGINS", "progress,nan_guard,checkpoint,summaries,early_stopping"
    )


def rising_loss(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float64(state.global_step / 10)}


def new_trial() -> optuna.trial.Trial:
    return optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.45)).ask()


def reported(trial: optuna.trial.Trial) -> dict[int, float]:
    return dict(trial.storage.get_trial(trial._trial_id).intermediate_values)


async def train(
    hooks: list[object] | None = None, max_steps: int = 10, **kwargs: Any
) -> monitored.MonitoredSession:
    """A ``MonitoredTrainingSession`` of ``rising_loss`` up to ``max_steps``."""
    session = monitored.MonitoredTrainingSession(
        hooks=[*(hooks or ()), monitored.StopAtStepHook(last_step=max_steps)],
        log_step_count_steps=None,
        **kwargs,
    )
    async with session:
        while not session.should_stop():
            await session.run(rising_loss)
    return session


async def test_it_is_off_without_a_monitor() -> None:
    with use_trial(new_trial()):
        session = await train()
    assert hook_of(session) is None
    assert session.state.global_step == 10


async def test_it_is_off_without_a_trial() -> None:
    session = await train(plugin_options=OPTIONS)
    assert hook_of(session) is None
    assert session.state.global_step == 10


def loaded_line(caplog: pytest.LogCaptureFixture) -> str:
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded plugins")]
    return line


async def test_the_loaded_plugins_line_says_whether_and_what_it_reports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    await train()
    assert "off: no monitor (set the option optuna.monitor)" in loaded_line(caplog)
    caplog.clear()
    await train(plugin_options=OPTIONS)
    assert "inactive: no Optuna trial in this task" in loaded_line(caplog)
    caplog.clear()
    trial = new_trial()
    with use_trial(trial), pytest.raises(optuna.TrialPruned):
        await train(plugin_options=OPTIONS)
    assert f"reporting 'loss' to trial {trial.number})" in loaded_line(caplog)


async def test_with_a_monitor_it_reports_to_the_current_trial_and_prunes() -> None:
    trial = new_trial()
    with use_trial(trial), pytest.raises(optuna.TrialPruned, match="pruned at step 5"):
        await train(plugin_options=OPTIONS)
    assert sorted(reported(trial)) == [1, 2, 3, 4, 5]


async def test_a_plain_monitored_session_gets_no_hook_from_it() -> None:
    trial = new_trial()
    with use_trial(trial):
        result = await run_session([], rising_loss, max_steps=10, plugin_options=OPTIONS)
    assert result.state.global_step == 10
    assert reported(trial) == {}


async def test_watching_evaluations_it_adds_no_per_step_hook() -> None:
    with use_trial(new_trial()):
        session = await train(plugin_options={"optuna": {"monitor": "accuracy"}})
    hook = hook_of(session)
    assert hook is not None
    assert not hasattr(hook, "before_run")
    assert not hasattr(hook, "after_run")


async def test_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", "optuna.monitor=loss;optuna.every_n_steps=2")
    trial = new_trial()
    with use_trial(trial), pytest.raises(optuna.TrialPruned, match="pruned at step 6"):
        await train()
    assert sorted(reported(trial)) == [2, 4, 6]


async def test_a_bad_option_is_an_error_naming_the_hook() -> None:
    options = {"optuna": {"monitor": "loss", "every_n_steps": -2}}
    with use_trial(new_trial()), pytest.raises(OptunaConfigError, match="every_n_steps"):
        await train(plugin_options=options)


async def test_an_explicit_hook_takes_pruning_over_from_the_plugin(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, "monitored")
    trial, other = new_trial(), new_trial()
    hook = OptunaPruningHook(trial, "loss", every_n_steps=3)
    with use_trial(other), pytest.raises(optuna.TrialPruned, match="pruned at step 6"):
        await train([hook], plugin_options=OPTIONS)
    assert reported(trial) == {3: 0.3, 6: 0.6}
    assert reported(other) == {}, "the installed plugin stepped aside"
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert "plugin 'optuna'" in line
    assert "provides 'pruning'" in line


async def test_an_evaluation_session_does_not_load_it() -> None:
    from monitored.evaluation import evaluate_once
    from monitored.metrics import Mean

    def eval_step(state: monitored.TrainState, batch: Any, metrics: Any) -> dict[str, Any]:
        metrics["loss"].update(np.float64(1.0))
        return {"loss": np.float64(1.0)}  # what a loaded plugin would report

    trial = new_trial()
    with use_trial(trial):
        await evaluate_once(
            eval_step,
            {"loss": Mean()},
            input=[0, 1],
            state=monitored.TrainState({"w": np.zeros(1)}),
            plugin_options=OPTIONS,
        )
    assert reported(trial) == {}


def test_monitored_plugins_lists_it_with_its_capability() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "monitored", "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["optuna"]["distribution"] == "monitored-optuna"
    assert rows["optuna"]["provides"] == ["pruning"]


# A session where the plugin is installed (monitor set) but no trial is current, then
# the public names: Optuna is imported by neither, so an idle plugin costs no import.
_IDLE_SESSION = """
import sys

import anyio
import monitored
import monitored_optuna
from monitored_optuna import OptunaPruningHook, current_trial, optimize, use_trial


def step(state):
    state.global_step += 1
    return {"loss": 0.5}


async def main():
    session = monitored.MonitoredTrainingSession(
        hooks=[monitored.StopAtStepHook(last_step=3)], log_step_count_steps=None
    )
    async with session:
        while not session.should_stop():
            await session.run(step)
    assert "optuna" in [info.name for info in session.plugins]
    return session.state.global_step


print(anyio.run(main), sorted(m for m in sys.modules if m.partition(".")[0] == "optuna"))
"""


def test_neither_the_package_nor_an_idle_plugin_imports_optuna() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_DISABLE_PLUGINS"] = ",".join(
        ep.name for ep in entry_points(group="monitored") if ep.name != "optuna"
    )
    env["MONITORED_PLUGIN_OPTIONS"] = "optuna.monitor=loss;optuna.every_n_steps=1"
    done = subprocess.run(
        [sys.executable, "-c", _IDLE_SESSION],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "[]"], done.stdout + done.stderr
