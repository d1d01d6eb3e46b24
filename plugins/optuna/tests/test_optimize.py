"""``optimize``: trials at once in one event loop, told to the study with the right state."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import monitored
from monitored_optuna import OptunaConfigError, OptunaPruningHook, current_trial, optimize

pytestmark = pytest.mark.anyio

optuna.logging.set_verbosity(optuna.logging.WARNING)


def states(study: optuna.Study) -> list[TrialState]:
    return [t.state for t in sorted(study.trials, key=lambda t: t.number)]


async def test_k_trials_run_at_once_each_with_its_own_current_trial() -> None:
    study = optuna.create_study()
    running, most = 0, 0

    async def objective(trial: optuna.trial.Trial) -> float:
        nonlocal running, most
        x = trial.suggest_float("x", -1, 1)
        running += 1
        most = max(most, running)
        for _ in range(3):
            await anyio.sleep(0.01)
            assert current_trial() is trial
        running -= 1
        return x * x

    await optimize(study, objective, n_trials=10, concurrency=4)
    assert states(study) == [TrialState.COMPLETE] * 10
    assert most == 4
    assert all(t.value == t.params["x"] ** 2 for t in study.trials)
    assert current_trial() is None


async def test_trials_pruned_by_sessions_are_told_pruned_and_the_others_complete() -> None:
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.0))

    async def objective(trial: optuna.trial.Trial) -> float:
        slope = [0.05, 0.5, 0.1, 0.4][trial.number]

        def step(state: monitored.TrainState) -> dict[str, Any]:
            state.global_step += 1
            return {"loss": np.float64(slope * state.global_step)}

        async with monitored.MonitoredSession(
            hooks=[OptunaPruningHook(None, "loss", every_n_steps=1), monitored.StopAtStepHook(8)]
        ) as session:
            while not session.should_stop():
                outputs = await session.run(step)
                await anyio.lowlevel.checkpoint()
        return float(outputs["loss"])

    await optimize(study, objective, n_trials=4, concurrency=4)
    assert states(study) == [
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.COMPLETE,
        TrialState.PRUNED,
    ]
    pruned = study.trials[1]
    assert max(pruned.intermediate_values) == 3, "pruned at the first value over 1.0"
    assert study.trials[0].value == pytest.approx(0.4)


async def test_a_caught_failure_fails_one_trial_and_the_study_goes_on(caplog: Any) -> None:
    study = optuna.create_study()

    async def objective(trial: optuna.trial.Trial) -> float:
        await anyio.sleep(0.001)
        if trial.number == 1:
            raise ValueError("bad batch")
        return 1.0

    await optimize(study, objective, n_trials=4, concurrency=2, catch=ValueError)
    assert states(study) == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]
    assert "Trial 1 failed (caught, the study goes on): ValueError('bad batch')" in caplog.text


async def test_an_uncaught_failure_fails_its_trial_cancels_the_others_and_is_raised() -> None:
    study = optuna.create_study()

    async def objective(trial: optuna.trial.Trial) -> float:
        if trial.number == 0:
            await anyio.sleep(0.01)
            raise KeyError("boom")
        await anyio.sleep(10)
        return 1.0

    with pytest.raises(KeyError, match="boom"):
        await optimize(study, objective, n_trials=10, concurrency=3)
    assert states(study) == [TrialState.FAIL] * 3, "the running trials are not left RUNNING"


async def test_a_value_that_is_not_a_number_fails_the_trial(caplog: Any) -> None:
    study = optuna.create_study()
    returned: list[Any] = [None, math.nan, "x", 2.0, [1.0, 2.0]]

    async def objective(trial: optuna.trial.Trial) -> Any:
        return returned[trial.number]

    await optimize(study, objective, n_trials=5)
    assert states(study) == [TrialState.FAIL] * 3 + [TrialState.COMPLETE, TrialState.FAIL]
    assert "Trial 0 failed: the objective returned None, not 1 finite number(s)" in caplog.text


async def test_a_multi_objective_study_gets_its_values() -> None:
    study = optuna.create_study(directions=["minimize", "maximize"])

    async def objective(trial: optuna.trial.Trial) -> tuple[float, float]:
        return 1.0, 2.0

    await optimize(study, objective, n_trials=2, concurrency=2)
    assert [t.values for t in study.trials] == [[1.0, 2.0], [1.0, 2.0]]


async def test_a_synchronous_objective_is_refused_and_its_trial_failed() -> None:
    study = optuna.create_study()
    with pytest.raises(OptunaConfigError, match="objective must be an async function"):
        await optimize(study, lambda trial: 1.0, n_trials=2)  # type: ignore[arg-type,return-value]
    assert states(study) == [TrialState.FAIL]


async def test_callbacks_see_each_told_trial() -> None:
    study = optuna.create_study()
    seen: list[tuple[int, TrialState]] = []

    async def objective(trial: optuna.trial.Trial) -> float:
        if trial.number == 1:
            raise optuna.TrialPruned()
        return 0.0

    await optimize(
        study,
        objective,
        n_trials=3,
        callbacks=[lambda s, t: seen.append((t.number, t.state))],
    )
    assert seen == [(0, TrialState.COMPLETE), (1, TrialState.PRUNED), (2, TrialState.COMPLETE)]


async def test_no_trial_starts_after_the_timeout() -> None:
    study = optuna.create_study()

    async def objective(trial: optuna.trial.Trial) -> float:
        await anyio.sleep(0.05)
        return 0.0

    await optimize(study, objective, n_trials=1000, concurrency=2, timeout=0.12)
    assert 2 <= len(study.trials) <= 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"study": "s"}, "study must be an optuna.Study"),
        ({"objective": 3}, "objective must be an async function"),
        ({"n_trials": -1}, "n_trials must be an integer >= 0"),
        ({"n_trials": True}, "n_trials must be an integer >= 0"),
        ({"concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"timeout": 0}, "timeout must be a number > 0"),
        ({"catch": [42]}, "catch must hold exception classes"),
    ],
)
async def test_bad_arguments_are_refused_before_any_trial(
    kwargs: dict[str, Any], match: str
) -> None:
    study = optuna.create_study()

    async def objective(trial: optuna.trial.Trial) -> float:
        return 0.0

    arguments: dict[str, Any] = {"study": study, "objective": objective, "n_trials": 1, **kwargs}
    with pytest.raises(OptunaConfigError, match=f"optimize: {match}"):
        await optimize(**arguments)
    assert study.trials == []


WORKER = textwrap.dedent(
    """
    import sys

    import anyio
    import optuna

    import monitored_optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


    async def objective(trial):
        x = trial.suggest_float("x", -3, 3)
        for step in range(3):
            trial.report(x * x + step, step)
            await anyio.sleep(0.01)
        trial.set_user_attr("worker", sys.argv[2])
        return x * x


    study = optuna.load_study(study_name="shared", storage=sys.argv[1])
    anyio.run(lambda: monitored_optuna.optimize(study, objective, n_trials=6, concurrency=3))
    """
)


def test_two_processes_share_one_sqlite_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="shared", storage=storage)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), storage, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    ]
    for worker in workers:
        output, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, output
    study = optuna.load_study(study_name="shared", storage=storage)
    trials = study.trials
    assert len(trials) == 12
    assert sorted(t.number for t in trials) == list(range(12))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted(t.user_attrs["worker"] for t in trials) == ["a"] * 6 + ["b"] * 6
    assert all(sorted(t.intermediate_values) == [0, 1, 2] for t in trials)
