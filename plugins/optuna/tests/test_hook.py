"""``OptunaPruningHook``: what it reports, when it prunes, how a pruned session closes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

import monitored
from monitored.testing import record_step_calls, run_session
from monitored_optuna import MonitoredValueError, OptunaConfigError, OptunaPruningHook, use_trial

pytestmark = pytest.mark.anyio

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: The loss after global step s is LOSSES[s - 1]: it rises past 0.5 at step 6.
LOSSES = [0.45, 0.4, 0.3, 0.35, 0.45, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]


def losses_step(state: monitored.TrainState) -> dict[str, Any]:
    state["w"] += 1.0
    state.global_step += 1
    return {"loss": np.float64(LOSSES[state.global_step - 1])}


def new_state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros(3)})


def new_trial(upper: float = 0.5, warmup: int = 0) -> optuna.trial.Trial:
    pruner = optuna.pruners.ThresholdPruner(upper=upper, n_warmup_steps=warmup)
    return optuna.create_study(pruner=pruner).ask()


def reported(trial: optuna.trial.Trial) -> dict[int, float]:
    return dict(trial.storage.get_trial(trial._trial_id).intermediate_values)


class Ends:
    """Records ``end`` calls and the step it saw."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def end(self, session: monitored.MonitoredSession) -> None:
        self.steps.append(session.state.global_step)


async def test_every_n_steps_reports_the_multiples_and_fetches_nothing_between() -> None:
    trial = new_trial(upper=10.0)
    hook = OptunaPruningHook(trial, "loss", every_n_steps=3)
    called_at = record_step_calls(hook)

    result = await run_session([hook], losses_step, state=new_state(), max_steps=10)
    assert result.state.global_step == 10
    assert reported(trial) == {3: 0.3, 6: 0.6, 9: 0.9}
    # The session calls the hook only for the steps making 3, 6 and 9 (skip_step_hooks).
    assert called_at == [2, 5, 8]
    assert hook.last_reported_step == 9
    assert hook.pruned_step is None


async def test_a_prune_stops_after_the_step_closes_cleanly_then_raises_trial_pruned() -> None:
    trial = new_trial()
    hook, ends = OptunaPruningHook(trial, "loss", every_n_steps=1), Ends()
    state = new_state()
    with pytest.raises(optuna.TrialPruned, match=r"Trial 0 was pruned at step 6 \(loss = 0.6\)"):
        await run_session([hook, ends], losses_step, state=state, max_steps=12)
    assert state.global_step == 6
    assert ends.steps == [6], "end ran, once, before TrialPruned"
    assert hook.pruned_step == 6
    assert sorted(reported(trial)) == [1, 2, 3, 4, 5, 6]


async def test_the_stop_is_logged_as_the_hook_s(caplog: Any) -> None:
    caplog.set_level("INFO", "monitored")
    with pytest.raises(optuna.TrialPruned):
        await run_session(
            [OptunaPruningHook(new_trial(), "loss", every_n_steps=1)],
            losses_step,
            state=new_state(),
        )
    assert "stop requested by OptunaPruningHook.report" in caplog.text
    assert "OptunaPruningHook: trial 0 pruned at step 6 (loss = 0.6)" in caplog.text


async def test_the_pruned_step_s_checkpoint_and_summaries_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,nan_guard,early_stopping,optuna")
    import monitored_summaries
    from monitored_checkpoint import latest_checkpoint
    from monitored_summaries import summary_iterator

    def recording_step(state: monitored.TrainState) -> dict[str, Any]:
        outputs = losses_step(state)
        monitored_summaries.scalar("loss", outputs["loss"])
        return outputs

    trial = new_trial()
    with pytest.raises(optuna.TrialPruned):
        async with monitored.MonitoredTrainingSession(
            new_state(),
            checkpoint_dir=str(tmp_path),
            save_checkpoint_steps=1000,
            save_summaries_steps=1,
            hooks=[OptunaPruningHook(trial, "loss", every_n_steps=1)],
        ) as session:
            while not session.should_stop():
                await session.run(recording_step)
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-6")
    read = list(summary_iterator(only_event_file(tmp_path)))
    steps = [e.step for e in read if any(v.tag == "loss" for v in e.summary.value)]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert read[-1].session_log.status == read[-1].session_log.STOP, "a normal end"


def only_event_file(directory: Path) -> str:
    [events] = list(directory.glob("events.out.tfevents.*"))
    return str(events)


async def test_a_failure_in_the_block_wins_over_the_prune() -> None:
    hook = OptunaPruningHook(new_trial(), "loss", every_n_steps=1)
    with pytest.raises(RuntimeError, match="boom"):
        async with monitored.MonitoredSession(new_state(), hooks=[hook]) as session:
            while not session.should_stop():
                await session.run(losses_step)
            raise RuntimeError("boom")
    assert hook.pruned_step == 6


async def test_evaluation_results_are_reported_at_the_step_evaluated() -> None:
    from monitored.evaluation import EvaluationHook
    from monitored.metrics import Mean

    # Evaluated after steps 1, 3, 5 (the first step, then every 2): below 0.5 at step 3.
    accuracies = [0.6, 0.7, 0.2, 0.1, 0.9, 0.95]

    def eval_step(state: monitored.TrainState, batch: Any, metrics: Any) -> None:
        metrics["accuracy"].update(np.float64(accuracies[state.global_step - 1]))

    evaluation = EvaluationHook(
        eval_step, {"accuracy": Mean()}, input_fn=lambda: [0], every_n_steps=2
    )
    trial = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.5)
    ).ask()
    hook = OptunaPruningHook(trial, "accuracy")
    state = new_state()
    with pytest.raises(optuna.TrialPruned, match="pruned at step 3"):
        await run_session([evaluation, hook], losses_step, state=state, max_steps=6)
    assert reported(trial) == {1: 0.6, 3: 0.2}
    assert state.global_step == 3


async def test_a_hook_watching_a_step_output_ignores_evaluation_results() -> None:
    trial = new_trial(upper=10.0)
    hook = OptunaPruningHook(trial, "loss", every_n_steps=4)

    class Evaluates:
        async def after_run(self, run_context: Any, run_values: Any) -> None:
            session = run_context.session
            await session.report_evaluation(session.state.global_step, {"loss": 99.0})

    await run_session([hook, Evaluates()], losses_step, state=new_state(), max_steps=4)
    assert reported(trial) == {4: 0.35}


async def test_a_monitor_missing_where_it_is_due_is_an_error_naming_it() -> None:
    hook = OptunaPruningHook(new_trial(), "acc", every_n_steps=2)
    with pytest.raises(
        MonitoredValueError, match=r"monitor 'acc' is not available at step 2.*'loss'"
    ):
        await run_session([hook], losses_step, state=new_state())
    evaluating = OptunaPruningHook(new_trial(), "acc")

    class Evaluates:
        async def after_run(self, run_context: Any, run_values: Any) -> None:
            await run_context.session.report_evaluation(1, {"loss": 0.1})

    with pytest.raises(MonitoredValueError, match=r"'acc' is not among .*\['loss'\].* step 1"):
        await run_session([evaluating, Evaluates()], losses_step, state=new_state())


async def test_a_monitor_that_is_not_a_scalar_number_is_an_error() -> None:
    def vector_step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.ones(2), "name": "x"}

    with pytest.raises(MonitoredValueError, match=r"'loss' must be a scalar.*shape \(2,\)"):
        await run_session([OptunaPruningHook(new_trial(), "loss", every_n_steps=1)], vector_step)
    with pytest.raises(MonitoredValueError, match="'name' must be a number, but at step 1 it is"):
        await run_session([OptunaPruningHook(new_trial(), "name", every_n_steps=1)], vector_step)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("not a trial", "loss"), "expected an optuna trial"),
        ((None, ""), "monitor must be a name"),
        ((None, 3), "monitor must be a name"),
        ((None, "loss", -1), "every_n_steps must be an integer >= 0"),
        ((None, "loss", True), "every_n_steps must be an integer >= 0"),
    ],
)
def test_bad_arguments_name_the_hook_and_the_argument(args: tuple[Any, ...], match: str) -> None:
    trial, monitor, *rest = args
    kwargs = {"every_n_steps": rest[0]} if rest else {}
    with pytest.raises(OptunaConfigError, match=f"OptunaPruningHook: .*{match}"):
        OptunaPruningHook(trial, monitor, **kwargs)


async def test_without_a_trial_it_does_nothing() -> None:
    hook = OptunaPruningHook(None, "loss", every_n_steps=1)
    result = await run_session([hook], losses_step, state=new_state(), max_steps=12)
    assert result.state.global_step == 12
    assert not hook.active
    assert hook.plugin_state() is None


async def test_without_a_trial_argument_it_takes_the_task_s_current_trial() -> None:
    trial = new_trial()
    hook = OptunaPruningHook(None, "loss", every_n_steps=1)
    with use_trial(trial), pytest.raises(optuna.TrialPruned):
        await run_session([hook], losses_step, state=new_state())
    assert hook.trial is trial
    assert hook.pruned_step == 6


def test_use_trial_refuses_what_is_not_a_trial() -> None:
    with (
        pytest.raises(OptunaConfigError, match="use_trial: expected an optuna trial"),
        use_trial(
            object()  # type: ignore[arg-type]
        ),
    ):
        pass


async def test_a_worker_process_reports_nothing() -> None:
    trial = new_trial()
    hook = OptunaPruningHook(trial, "loss", every_n_steps=1)
    state = new_state()
    state.initialized = True  # a worker waits for the chief's state: this one is ready
    result = await run_session([hook], losses_step, state=state, max_steps=8, is_chief=False)
    assert result.state.global_step == 8
    assert reported(trial) == {}


def saver(directory: Path, **kwargs: Any) -> Any:
    from monitored_checkpoint import CheckpointSaverHook

    return CheckpointSaverHook(
        directory, asynchronous=False, handle_signals=False, **{"save_steps": 1, **kwargs}
    )


async def test_a_resumed_trial_reports_no_step_twice(tmp_path: Path) -> None:
    # Checkpoints every 4 steps; the first run dies after step 6 (no final checkpoint, as
    # in a preemption) having reported 1..6; the resumed run starts again from step 4.
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=10.0))
    trial = study.ask()
    first = OptunaPruningHook(trial, "loss", every_n_steps=1)
    with pytest.raises(RuntimeError, match="preempted"):
        async with monitored.MonitoredSession(
            new_state(), hooks=[first, saver(tmp_path, save_steps=4)]
        ) as session:
            while session.state.global_step < 6:
                await session.run(losses_step)
            raise RuntimeError("preempted")
    assert sorted(reported(trial)) == [1, 2, 3, 4, 5, 6]
    again = optuna.trial.Trial(study, trial._trial_id)  # the trial, seen from a new process
    resumed = OptunaPruningHook(again, "loss", every_n_steps=1)
    result = await run_session(
        [resumed, saver(tmp_path, save_steps=4)], losses_step, state=new_state(), max_steps=5
    )
    # Warnings are errors here: a step reported twice would have failed the run.
    assert result.session.restored_from == str(tmp_path / "model.ckpt-4")
    assert result.state.global_step == 9
    assert sorted(reported(trial)) == list(range(1, 10))
    assert resumed.last_reported_step == 9


async def test_steps_reported_before_the_checkpoint_come_back_with_its_state(
    tmp_path: Path,
) -> None:
    # A FixedTrial holds no storage: only the checkpoint's state says what was reported.
    trial = optuna.trial.FixedTrial({})
    first = OptunaPruningHook(trial, "loss", every_n_steps=2)
    await run_session([first, saver(tmp_path)], losses_step, state=new_state(), max_steps=4)
    resumed = OptunaPruningHook(trial, "loss", every_n_steps=2)
    await run_session([resumed, saver(tmp_path)], losses_step, state=new_state(), max_steps=0)
    assert resumed.last_reported_step == 4


async def test_a_pruned_trial_resumed_stays_pruned(tmp_path: Path) -> None:
    trial = new_trial()
    with pytest.raises(optuna.TrialPruned):
        await run_session(
            [OptunaPruningHook(trial, "loss", every_n_steps=1), saver(tmp_path, save_steps=100)],
            losses_step,
            state=new_state(),
        )
    ends = Ends()
    again = OptunaPruningHook(trial, "loss", every_n_steps=1)
    with pytest.raises(optuna.TrialPruned, match="pruned at step 6 .resumed from a checkpoint"):
        await run_session(
            [again, ends, saver(tmp_path, save_steps=100)], losses_step, state=new_state()
        )
    assert ends.steps == [6], "no step ran"
    assert again.pruned_step == 6


async def test_a_malformed_saved_state_is_an_error_naming_the_hook() -> None:
    hook = OptunaPruningHook(new_trial(), "loss")
    with pytest.raises(
        MonitoredValueError, match="OptunaPruningHook: the saved state is malformed"
    ):
        hook.load_plugin_state({"last_reported_step": "3", "pruned_step": None}, 2)
    with pytest.raises(MonitoredValueError, match="malformed"):
        hook.load_plugin_state({"last_reported_step": 3, "pruned_step": True}, 2)
    steps = {"last_reported_step": 3, "pruned_step": None}
    for identity in (
        {"study": 7, "trial": 0, "params": {}},
        {"study": "s", "trial": "0", "params": {}},
        {"study": "s", "trial": 0, "params": [1]},
        {},  # a version-2 state must name its trial
    ):
        with pytest.raises(MonitoredValueError, match="'study' .a name or None., 'trial'"):
            hook.load_plugin_state({**steps, **identity}, 2)


def fixed_trial(study: optuna.Study, lr: float) -> optuna.trial.Trial:
    """A trial of ``study`` whose ``lr`` is ``lr``."""
    study.enqueue_trial({"lr": lr})
    trial = study.ask()
    assert trial.suggest_float("lr", 1e-4, 1.0, log=True) == lr
    return trial


async def test_the_state_names_its_trial_and_a_checkpoint_of_another_trial_is_refused(
    tmp_path: Path,
) -> None:
    # What rerunning a sweep into the same trial-<number> directories did: trial 0 of
    # a new study resumed the old trial 0's model under new parameters.
    old = optuna.create_study(study_name="old")
    first = fixed_trial(old, 0.1)
    await run_session(
        [OptunaPruningHook(first, "loss", every_n_steps=2), saver(tmp_path)],
        losses_step,
        state=new_state(),
        max_steps=4,
    )
    new = optuna.create_study(study_name="new")
    again = fixed_trial(new, 0.01)
    ends = Ends()
    with pytest.raises(OptunaConfigError) as refused:
        await run_session(
            [OptunaPruningHook(again, "loss", every_n_steps=2), ends, saver(tmp_path)],
            losses_step,
            state=new_state(),
        )
    message = str(refused.value)
    assert str(tmp_path / "model.ckpt-4") in message
    assert "trial 0 of study 'old' with params {'lr': 0.1}" in message
    assert "trial 0 of study 'new' with params {'lr': 0.01}" in message
    assert "runs/<study name>/trial-<number>" in message
    assert ends.steps == [], "refused before any step (and no end: it is a failure)"
    assert reported(again) == {}
    # Same study, another trial number; same trial, other params: refused too.
    for other in (fixed_trial(old, 0.1), fixed_trial(old, 0.2)):
        with pytest.raises(OptunaConfigError, match="was saved by trial 0 of study 'old'"):
            await run_session(
                [OptunaPruningHook(other, "loss", every_n_steps=2), saver(tmp_path)],
                losses_step,
                state=new_state(),
            )
    # The trial itself goes on from its checkpoint.
    resumed = OptunaPruningHook(optuna.trial.Trial(old, first._trial_id), "loss", every_n_steps=2)
    result = await run_session(
        [resumed, saver(tmp_path)], losses_step, state=new_state(), max_steps=2
    )
    assert result.state.global_step == 6
    assert sorted(reported(first)) == [2, 4, 6]


async def test_a_pruned_trial_of_another_study_is_refused_not_pruned_again(tmp_path: Path) -> None:
    old = optuna.create_study(study_name="old", pruner=optuna.pruners.ThresholdPruner(upper=0.5))
    with pytest.raises(optuna.TrialPruned):
        await run_session(
            [OptunaPruningHook(old.ask(), "loss", every_n_steps=1), saver(tmp_path)],
            losses_step,
            state=new_state(),
        )
    new = optuna.create_study(study_name="new")
    with pytest.raises(OptunaConfigError, match="saved by trial 0 of study 'old'"):
        await run_session(
            [OptunaPruningHook(new.ask(), "loss", every_n_steps=1), saver(tmp_path)],
            losses_step,
            state=new_state(),
        )
    assert [t.state for t in new.trials] == [optuna.trial.TrialState.RUNNING], "not PRUNED"


class OldHook:
    """What ``OptunaPruningHook`` saved before version 2: the steps, no trial."""

    plugin_name = "optuna_pruning"
    plugin_state_version = 1

    def plugin_state(self) -> dict[str, Any]:
        return {"last_reported_step": 2, "pruned_step": None}


async def test_a_version_1_state_is_read_and_no_identity_is_checked(tmp_path: Path) -> None:
    hook = OptunaPruningHook(new_trial(), "loss")
    hook.load_plugin_state({"last_reported_step": 4, "pruned_step": 6}, 1)
    assert (hook.last_reported_step, hook.pruned_step) == (4, 6)
    # A checkpoint of the old hook, which saved version 1 (steps only): the new one
    # goes on from it.
    await run_session([OldHook(), saver(tmp_path)], losses_step, state=new_state(), max_steps=2)
    other = new_trial()
    resumed = OptunaPruningHook(other, "loss", every_n_steps=2)
    result = await run_session(
        [resumed, saver(tmp_path)], losses_step, state=new_state(), max_steps=2
    )
    assert result.state.global_step == 4
    assert sorted(reported(other)) == [4], "step 2 was reported (the old state says so)"


def test_watching_evaluations_it_has_no_per_step_hooks() -> None:
    evaluations = OptunaPruningHook(None, "accuracy")
    outputs = OptunaPruningHook(None, "loss", every_n_steps=10)
    assert isinstance(evaluations, OptunaPruningHook)
    assert isinstance(outputs, OptunaPruningHook)
    assert not hasattr(evaluations, "before_run")
    assert not hasattr(evaluations, "after_run")
    assert callable(outputs.before_run)  # type: ignore[attr-defined]


async def test_a_trial_of_a_sqlite_study_is_reported_to_from_a_worker_thread(
    tmp_path: Path,
) -> None:
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        pruner=optuna.pruners.ThresholdPruner(upper=0.5),
    )
    trial = study.ask()
    with pytest.raises(optuna.TrialPruned, match="pruned at step 6"):
        await run_session(
            [OptunaPruningHook(trial, "loss", every_n_steps=2)], losses_step, state=new_state()
        )
    assert reported(trial) == {2: 0.4, 4: 0.35, 6: 0.6}


async def test_the_refusal_names_the_checkpoint_and_the_saved_study_escaped(
    tmp_path: Path,
) -> None:
    """Issue 34 §2: the checkpoint's path (a directory anyone may have named) and the
    study name restored from it are printed escaped, on one line."""
    from _hostile import HOSTILE, HOSTILE_NAME, assert_safe_line

    directory = tmp_path / HOSTILE_NAME
    old = optuna.create_study(study_name=HOSTILE)
    await run_session(
        [OptunaPruningHook(fixed_trial(old, 0.1), "loss", every_n_steps=2), saver(directory)],
        losses_step,
        state=new_state(),
        max_steps=2,
    )
    new = optuna.create_study(study_name="new")
    with pytest.raises(OptunaConfigError) as refused:
        await run_session(
            [OptunaPruningHook(fixed_trial(new, 0.1), "loss", every_n_steps=2), saver(directory)],
            losses_step,
            state=new_state(),
        )
    assert "model.ckpt-2 was saved by trial 0 of study 'w\\x00" in str(refused.value)
    assert_safe_line(str(refused.value))
