"""``optimize``: trials at once in one event loop, told to the study with the right state."""

from __future__ import annotations

import functools
import math
import os
import signal
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
import monitored_optuna
from monitored_optuna import (
    OptunaConfigError,
    OptunaPruningHook,
    current_trial,
    optimize,
    resume_trial,
)

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


async def test_a_synchronous_function_is_refused_before_any_trial() -> None:
    study = optuna.create_study()
    ran = []

    def objective(trial: optuna.trial.Trial) -> float:
        ran.append(trial)
        return 1.0

    for given in (objective, functools.partial(objective)):
        with pytest.raises(TypeError, match="objective is a synchronous function") as refused:
            await optimize(study, given, n_trials=2, concurrency=2)  # type: ignore[arg-type]
        assert "async def objective(trial): return await train(trial)" in str(refused.value)
    assert ran == []
    assert study.trials == []


async def test_a_callable_returning_no_awaitable_is_refused_at_its_first_trial_only() -> None:
    # A lambda cannot be async: what it returns is checked at its first call.
    study = optuna.create_study()
    calls = []

    def value(trial: optuna.trial.Trial) -> float:
        calls.append(trial.number)
        return 1.0

    with pytest.raises(TypeError, match="returned float for trial 0; use Optuna's study.optimize"):
        await optimize(study, lambda trial: value(trial), n_trials=8, concurrency=4)  # type: ignore[arg-type,return-value]
    assert calls == [0], "no other trial called it"
    assert all(state == TrialState.FAIL for state in states(study))


async def test_an_async_objective_whose_value_is_a_coroutine_forgot_an_await() -> None:
    study = optuna.create_study()

    async def train(trial: optuna.trial.Trial) -> float:
        return 1.0

    async def objective(trial: optuna.trial.Trial) -> Any:
        return train(trial)  # the await forgotten

    # Warnings are errors here: the coroutine is closed, not left "never awaited".
    with pytest.raises(TypeError, match="did you forget `await` in the objective"):
        await optimize(study, objective, n_trials=4, concurrency=2)
    assert all(state == TrialState.FAIL for state in states(study))
    # A lambda over an async function is fine.
    await optimize(study, lambda trial: train(trial), n_trials=2)
    assert states(study)[-2:] == [TrialState.COMPLETE] * 2


async def test_several_trials_failing_at_once_raise_the_first_with_the_others_in_notes() -> None:
    study = optuna.create_study()
    ready = anyio.Event()

    async def objective(trial: optuna.trial.Trial) -> float:
        if trial.number == 2:
            ready.set()
        await ready.wait()
        # All three fail in the same pass of the event loop, before any is cancelled.
        raise ValueError(f"trial {trial.number} broke")

    with pytest.raises(ValueError, match="trial 0 broke") as raised:
        await optimize(study, objective, n_trials=6, concurrency=3)
    assert not isinstance(raised.value, BaseExceptionGroup)
    assert raised.value.__notes__ == [
        "optimize: 2 other trial(s) failed at the same time: "
        "ValueError: trial 1 broke; ValueError: trial 2 broke"
    ]
    assert states(study) == [TrialState.FAIL] * 3


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


SWEEP = textwrap.dedent(
    """
    import os, sys

    import anyio
    import numpy as np
    import optuna

    import monitored
    from monitored_optuna import OptunaPruningHook, optimize, original_trial_number, resume_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, root, mode = sys.argv[1:4]
    if os.environ.get("SWEEP_HEARTBEAT"):
        # Optuna's retry of dead trials: a heartbeat every second, dead after 2 s without.
        storage = optuna.storages.RDBStorage(
            storage,
            heartbeat_interval=1,
            grace_period=2,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(),
        )
    n_trials = int(os.environ.get("SWEEP_TRIALS", "6"))
    study = optuna.load_study(study_name="sweep", storage=storage)
    reached = set()


    async def objective(trial):
        lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)

        def step(state):
            state["w"] -= lr
            state.global_step += 1
            return {"loss": np.float32(1.0 / state.global_step)}

        hooks = [OptunaPruningHook(trial, "loss", every_n_steps=5)] if mode == "hook" else []
        state = monitored.TrainState({"w": np.zeros(4, np.float32)})
        async with monitored.MonitoredTrainingSession(
            state,
            checkpoint_dir=os.path.join(root, f"trial-{original_trial_number(trial)}"),
            save_checkpoint_steps=int(os.environ.get("SWEEP_SAVE_STEPS", 10**6)),
            log_step_count_steps=None,
            hooks=[*hooks, monitored.StopAtStepHook(last_step=int(sys.argv[4]))],
        ) as session:
            while not session.should_stop():
                await session.run(step)
                await anyio.sleep(0.002)
                if state.global_step == 20:
                    reached.add(trial.number)
                    if len(reached) == 2:
                        print("ready", flush=True)
        print("trial", trial.number, "stopped at", state.global_step, session.restored_from,
              "retries", original_trial_number(trial), flush=True)
        return float(state.global_step)


    async def resume():
        for number in map(int, sys.argv[5:]):
            trial = resume_trial(study, number)
            study.tell(trial, await objective(trial))


    try:
        if sys.argv[5:]:
            anyio.run(resume)
        else:
            anyio.run(lambda: optimize(study, objective, n_trials=n_trials, concurrency=2))
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        raise
    print("optimize returned", flush=True)
    """
)


def run_sweep(tmp_path: Path, mode: str, *args: str, **settings: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MONITORED_", "SWEEP_"))}
    env["MONITORED_DISABLE_PLUGINS"] = "progress,summaries"
    env.update({f"SWEEP_{key.upper()}": value for key, value in settings.items()})
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    return subprocess.Popen(
        [sys.executable, str(script), storage, str(tmp_path / "runs"), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def interrupt(tmp_path: Path, mode: str, signum: int, **settings: str) -> tuple[int, str, str]:
    """Run the sweep in a process, send ``signum`` once two trials trained 20 steps."""
    optuna.create_study(study_name="sweep", storage=f"sqlite:///{tmp_path / 'study.db'}")
    child = run_sweep(tmp_path, mode, "100000", **settings)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        pytest.fail(f"the sweep did not start: {child.communicate()}")
    child.send_signal(signum)
    try:
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()  # a sweep that went on after the signal must not outlive the test
        child.wait()
    return child.returncode, out, err


def saved_steps(directory: Path) -> list[int]:
    return sorted(int(p.name[len("model.ckpt-") : -len(".json")]) for p in directory.glob("*.json"))


@pytest.mark.parametrize("mode", ["hook", "plugin"])
def test_ctrl_c_fails_the_running_trials_starts_no_other_and_raises(
    tmp_path: Path, mode: str
) -> None:
    # "plugin": no pruning hook in the session; the installed plugin tells optimize.
    returncode, out, err = interrupt(tmp_path, mode, signal.SIGINT)
    assert returncode == -signal.SIGINT, err
    assert out.splitlines()[-1] == "KeyboardInterrupt", out + err
    assert "optimize returned" not in out
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.load_study(study_name="sweep", storage=storage)
    # No COMPLETE, no trial started after; each interrupted trial queued again.
    assert states(study) == [TrialState.FAIL] * 2 + [TrialState.WAITING] * 2
    stopped = {int(line.split()[1]): int(line.split()[4]) for line in out.splitlines()[:-1]}
    assert sorted(stopped) == [0, 1]
    for number, step in stopped.items():
        assert 20 <= step < 100000
        assert saved_steps(tmp_path / "runs" / f"trial-{number}")[-1] == step, "each saved"
    assert "trial(s) [0, 1] told FAIL with their checkpoints saved, and queued again" in err
    params = {t.number: t.params for t in study.trials if t.number < 2}
    # The log is true: the next optimize on the study takes the two trials up again,
    # with their parameters, from their checkpoints (not from step 0).
    again = run_sweep(tmp_path, mode, "200", trials="2")
    try:
        out, err = again.communicate(timeout=120)
    finally:
        again.kill()
        again.wait()
    assert again.returncode == 0, err
    assert "already reported" not in err
    for number in (0, 1):
        directory = tmp_path / "runs" / f"trial-{number}"
        resumed = f"stopped at 200 {directory / f'model.ckpt-{stopped[number]}'} retries {number}"
        assert resumed in out, out + err
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert states(study) == [TrialState.FAIL] * 2 + [TrialState.COMPLETE] * 2
    retried = {t.system_attrs["failed_trial"]: t for t in study.trials if t.number >= 2}
    assert {n: t.params for n, t in retried.items()} == params
    assert all(t.value == 200.0 for t in retried.values())


def test_a_sigkilled_trial_is_retried_by_the_next_optimize_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """Heartbeats (Optuna's RDBStorage): a dead process's trials are noticed and retried."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="sweep", storage=storage)
    child = run_sweep(tmp_path, "hook", "100000", heartbeat="1", save_steps="10")
    assert child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            pytest.fail(f"the sweep did not start: {child.communicate()}")
        # Both trials have a checkpoint (each 10 steps) before the kill.
        directories = [tmp_path / "runs" / f"trial-{n}" for n in (0, 1)]
        for _ in range(1200):
            if all(saved_steps(d) for d in directories):
                break
            anyio.run(anyio.sleep, 0.05)
        child.kill()  # SIGKILL: nothing runs after it, no trial is told anything
    finally:
        child.kill()
        child.communicate()
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert states(study) == [TrialState.RUNNING] * 2, "dead, but nothing says so yet"
    params = {t.number: t.params for t in study.trials}
    newest = {n: saved_steps(tmp_path / "runs" / f"trial-{n}")[-1] for n in (0, 1)}
    assert all(step >= 10 for step in newest.values())
    # Past the grace period (2 s) without a heartbeat, the next optimize fails both and
    # retries them, each from its newest checkpoint with its parameters.
    anyio.run(anyio.sleep, 3.5)
    again = run_sweep(tmp_path, "hook", "200", heartbeat="1", save_steps="10", trials="2")
    try:
        out, err = again.communicate(timeout=120)
    finally:
        again.kill()
        again.wait()
    assert again.returncode == 0, err
    assert "already reported" not in err
    resumed = {}
    for line in out.splitlines():  # trial N stopped at 200 PATH retries M
        words = line.split()
        if words[0] != "trial":  # "ready", "optimize returned"
            continue
        assert words[4] == "200", out + err
        resumed[int(words[7])] = words[5]
    assert sorted(resumed) == [0, 1], out + err
    for number, path in resumed.items():
        # From a checkpoint of its own directory: the newest (or, when the kill came
        # in the middle of a save, the one before it), never from step 0.
        directory = tmp_path / "runs" / f"trial-{number}"
        assert path.startswith(f"{directory / 'model.ckpt-'}"), out
        step = int(path.rpartition("-")[2])
        assert 10 <= step <= newest[number], (step, newest, out)
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert states(study) == [TrialState.FAIL] * 2 + [TrialState.COMPLETE] * 2
    retried = {t.system_attrs["failed_trial"]: t for t in study.trials if t.number >= 2}
    assert {n: t.params for n, t in retried.items()} == params
    assert all(t.value == 200.0 for t in retried.values())
    assert not (tmp_path / "runs" / "trial-2").exists(), "no retry trains from step 0"


def test_a_study_on_a_read_only_database_fails_with_the_databases_reason(
    tmp_path: Path,
) -> None:
    path = tmp_path / "study.db"
    optuna.create_study(study_name="ro", storage=f"sqlite:///{path}")
    study = optuna.load_study(study_name="ro", storage=f"sqlite:///file:{path}?mode=ro&uri=true")

    async def objective(trial: optuna.trial.Trial) -> float:
        return 1.0

    with pytest.raises(optuna.exceptions.StorageInternalError) as raised:
        anyio.run(lambda: optimize(study, objective, n_trials=1))
    assert "readonly database" in str(raised.value.__cause__)


def test_sigterm_leaves_the_trials_running_and_they_resume_from_their_checkpoints(
    tmp_path: Path,
) -> None:
    returncode, out, err = interrupt(tmp_path, "hook", signal.SIGTERM)
    assert returncode == 0, err
    assert out.splitlines()[-1] == "optimize returned"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert states(study) == [TrialState.RUNNING] * 2, "no value of a model half trained"
    assert [t.user_attrs for t in study.trials] == [{"preempted_by": "SIGTERM"}] * 2
    stopped = {int(line.split()[1]): int(line.split()[4]) for line in out.splitlines()[:-1]}
    reported = {t.number: sorted(t.intermediate_values) for t in study.trials}
    for number, step in stopped.items():
        assert saved_steps(tmp_path / "runs" / f"trial-{number}")[-1] == step
        assert reported[number] == list(range(5, step + 1, 5))
    # The job comes back: each trial goes on from its checkpoint with its params, under
    # the same number, reporting no step twice (warnings are errors in the child too).
    params = [t.params for t in study.trials]
    again = run_sweep(tmp_path, "hook", "200", "0", "1")
    try:
        out, err = again.communicate(timeout=60)
    finally:
        again.kill()
        again.wait()
    assert again.returncode == 0, err
    assert "already reported" not in err
    for number in (0, 1):
        directory = tmp_path / "runs" / f"trial-{number}"
        assert f"stopped at 200 {directory / f'model.ckpt-{stopped[number]}'}" in out
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert states(study) == [TrialState.COMPLETE] * 2
    assert [t.params for t in study.trials] == params
    assert [t.value for t in study.trials] == [200.0, 200.0]
    assert all(sorted(t.intermediate_values) == list(range(5, 201, 5)) for t in study.trials)


def test_resume_trial_gives_back_a_running_trial_and_refuses_the_others() -> None:
    study = optuna.create_study(study_name="s")
    running = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    done = study.ask()
    study.tell(done, 1.0)
    again = resume_trial(study, running.number)
    assert again.number == running.number
    assert again.params == running.params
    assert again.suggest_float("x", 0, 1) == running.params["x"], "the params it had"
    with pytest.raises(OptunaConfigError, match="trial 1 of study 's' is COMPLETE, not RUNNING"):
        resume_trial(study, done.number)
    with pytest.raises(OptunaConfigError, match="study 's' has no trial 7 .it holds 2 trial"):
        resume_trial(study, 7)
    with pytest.raises(OptunaConfigError, match="resume_trial: study must be an optuna.Study"):
        resume_trial("s", 0)  # type: ignore[arg-type]


def counting(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float64(state.global_step)}


class SignalStop:
    """Stops its session at ``step`` as a signal handler does, and names the signal."""

    def __init__(self, name: str, step: int) -> None:
        self.name, self.step = name, step
        self.preempted_by: str | None = None

    def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> None:
        if run_context.session.state.global_step == self.step:
            self.preempted_by = self.name
            run_context.request_stop()


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
async def test_a_signal_stop_followed_by_a_caught_failure_still_ends_the_search(
    signal_name: str,
) -> None:
    study = optuna.create_study()

    async def objective(trial: optuna.trial.Trial) -> float:
        hooks = [OptunaPruningHook(trial, "loss", every_n_steps=1), monitored.StopAtStepHook(50)]
        if trial.number == 1:
            hooks.append(SignalStop(signal_name, 5))
        async with monitored.MonitoredSession(
            monitored.TrainState({"w": np.zeros(2)}), hooks=hooks
        ) as session:
            while not session.should_stop():
                await session.run(counting)
                await anyio.sleep(0.001)
        if trial.number == 1:
            raise ValueError("the evaluation after the stop failed")
        return 1.0

    if signal_name == "SIGINT":
        with pytest.raises(KeyboardInterrupt):
            await optimize(study, objective, n_trials=8, concurrency=2, catch=ValueError)
        # The interrupted trial is queued again, for the next optimize to resume.
        assert states(study) == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    else:
        await optimize(study, objective, n_trials=8, concurrency=2, catch=ValueError)
        assert states(study) == [TrialState.COMPLETE, TrialState.RUNNING]
        assert study.trials[1].user_attrs == {"preempted_by": "SIGTERM"}


async def test_a_live_trial_longer_than_the_grace_period_keeps_its_heartbeat(
    tmp_path: Path,
) -> None:
    """optimize records heartbeats (Optuna does so only in its own optimize): a trial
    running for twice the grace period is not taken for dead by the asks beside it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace_period=4
        )
    study = optuna.create_study(storage=storage)

    async def objective(trial: optuna.trial.Trial) -> float:
        # Trial 0 runs 9 s; trial 2 is asked (stale trials failed first) at about 5 s.
        await anyio.sleep(9 if trial.number == 0 else 5)
        return float(trial.number)

    await optimize(study, objective, n_trials=3, concurrency=2)
    assert states(study) == [TrialState.COMPLETE] * 3
    assert [t.value for t in sorted(study.trials, key=lambda t: t.number)] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("max_retry", [None, 0])
async def test_an_interrupted_trial_goes_through_the_storages_retry_callback(
    tmp_path: Path, max_retry: int | None
) -> None:
    """Ctrl-C: the storage's own retry policy (Optuna's callback, its max_retry) decides."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            f"sqlite:///{tmp_path / 'study.db'}",
            heartbeat_interval=60,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=max_retry
            ),
        )
    study = optuna.create_study(storage=storage)

    async def objective(trial: optuna.trial.Trial) -> float:
        trial.suggest_float("x", 0, 1)
        hooks = [OptunaPruningHook(trial, "loss", every_n_steps=1), SignalStop("SIGINT", 5)]
        async with monitored.MonitoredSession(
            monitored.TrainState({"w": np.zeros(2)}), hooks=hooks
        ) as session:
            while not session.should_stop():
                await session.run(counting)
        return 1.0

    with pytest.raises(KeyboardInterrupt):
        await optimize(study, objective, n_trials=3)
    if max_retry == 0:
        assert states(study) == [TrialState.FAIL], "no retry: the callback's max_retry"
        return
    assert states(study) == [TrialState.FAIL, TrialState.WAITING]
    first, retry = sorted(study.trials, key=lambda t: t.number)
    assert retry.params == first.params
    assert retry.system_attrs["failed_trial"] == 0
    assert monitored_optuna.original_trial_number(retry) == 0
