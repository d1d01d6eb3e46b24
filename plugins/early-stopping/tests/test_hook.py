"""EarlyStoppingHook in sessions: checks, errors, resume, restoring the best state, the plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored.testing import record_step_calls, run_session
from monitored_early_stopping import (
    EarlyStoppingConfigError,
    EarlyStoppingHook,
    EarlyStoppingStateError,
    MonitoredValueError,
    stop_if_no_decrease_hook,
)
from monitored_early_stopping._rules import KerasRule, NoImprovementRule

pytestmark = pytest.mark.anyio

LOSSES = [5.0, 4.0, 3.0, 3.5, 2.9, 3.05, 3.3, 3.1, 3.0, 3.2, 3.4, 3.6]


def losses_step(losses: list[float]) -> Any:
    """``w`` is the global step; the loss of global step s is ``losses[s - 1]``."""

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        state["w"][...] = state.global_step
        return {"loss": np.float32(losses[state.global_step - 1]), "vec": np.ones(2)}

    return step


def new_state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros((), np.float64)})


async def test_stops_after_patience_checks_without_improvement() -> None:
    hook = EarlyStoppingHook("loss", patience=2)
    result = await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)
    # best 2.9 at step 5; steps 6 and 7 do not improve: stop after step 7.
    assert result.state.global_step == 7
    assert (hook.best, hook.best_step, hook.stopped_step) == (pytest.approx(2.9), 5, 7)


async def test_every_n_steps_checks_multiples_and_fetches_nothing_between() -> None:
    hook = EarlyStoppingHook("loss", patience=1, every_n_steps=2)
    called_at = record_step_calls(hook)
    result = await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)
    # checks at 2, 4, 6, 8: 4.0, 3.5, 3.05 (each better), 3.1 (not): stop after step 8.
    assert result.state.global_step == 8
    # The session calls the hook only for the steps making 2, 4, 6, 8 (skip_step_hooks).
    assert called_at == [1, 3, 5, 7]


async def test_smoothing_watches_a_moving_average() -> None:
    hook = EarlyStoppingHook("loss", patience=0, smoothing=0.5)
    noisy = [4.0, 2.0, 2.5, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.0, 3.0, 3.0]
    result = await run_session([hook], losses_step(noisy), state=new_state(), max_steps=12)
    # EMA: 4, 3, 2.75, 2.625, 2.6125, 2.65625 (up): stop after step 6 (the raw
    # values would have stopped after step 3).
    assert result.state.global_step == 6


async def test_an_unknown_monitor_fails_at_the_first_check() -> None:
    hook = EarlyStoppingHook("val_loss", patience=2)
    with pytest.raises(MonitoredValueError, match=r"EarlyStoppingHook: monitor 'val_loss'.*step 1"):
        await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)


async def test_a_monitor_that_is_not_a_scalar_is_an_error() -> None:
    hook = EarlyStoppingHook("vec", patience=2, mode="min")
    with pytest.raises(MonitoredValueError, match=r"'vec' must be a scalar.*\(2,\)"):
        await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)


def record_requests(hook: EarlyStoppingHook) -> list[monitored.SessionRunArgs | None]:
    """What ``hook.before_run`` returns at each step (call before the session starts)."""
    before_run = hook.before_run
    asked: list[monitored.SessionRunArgs | None] = []

    def recording(run_context: monitored.SessionRunContext) -> Any:
        asked.append(before_run(run_context))
        return asked[-1]

    hook.before_run = recording  # type: ignore[method-assign]
    return asked


async def test_a_host_number_is_read_from_the_outputs_without_a_fetch() -> None:
    hook = EarlyStoppingHook("loss", patience=2)
    asked = record_requests(hook)
    result = await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)
    assert result.state.global_step == 7
    assert (hook.best, hook.best_step, hook.stopped_step) == (pytest.approx(2.9), 5, 7)
    # The first check fetches (where the value lives is not known yet); it finds a
    # NumPy scalar among the outputs, read there from then on.
    assert asked[0] is not None
    assert asked[0].fetches == {"loss": "loss"}
    assert asked[1:] == [None] * 6


@pytest.mark.parametrize(
    "as_array",
    [
        pytest.param(lambda x: np.array(x, np.float32), id="0-d array"),
        pytest.param(lambda x: np.full(1, x), id="one-element array"),
    ],
)
async def test_a_value_that_stops_being_a_host_number_is_fetched_again(as_array: Any) -> None:
    """Steps 1-3 return a NumPy scalar, the later ones an array: each is judged in its step."""

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        loss = LOSSES[state.global_step - 1]
        return {"loss": np.float32(loss) if state.global_step <= 3 else as_array(loss)}

    hook = EarlyStoppingHook("loss", patience=2)
    asked = record_requests(hook)
    result = await run_session([hook], step, state=new_state(), max_steps=12)
    assert result.state.global_step == 7
    assert (hook.best, hook.best_step, hook.stopped_step) == (pytest.approx(2.9), 5, 7)
    # Step 4's array is fetched by the hook itself (asked nothing that step); from
    # step 5 on, through the step's fetch again.
    assert [a is not None for a in asked] == [True, False, False, False, True, True, True]


async def test_a_state_entry_is_watched_through_the_fetch() -> None:
    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        state["w"][...] = LOSSES[state.global_step - 1]
        return {}

    hook = EarlyStoppingHook("w", patience=2, mode="min")
    asked = record_requests(hook)
    result = await run_session([hook], step, state=new_state(), max_steps=12)
    assert result.state.global_step == 7
    assert all(a is not None for a in asked)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"patience": -1}, "patience must be an integer >= 0"),
        ({"mode": "down"}, "mode must be"),
        ({"monitor": "grad_norm"}, "pass mode='min' or mode='max'"),
        ({"every_n_steps": -3}, "every_n_steps"),
        ({"smoothing": 1.0}, "smoothing"),
        ({"monitor": ""}, "monitor must be a name"),
    ],
)
def test_bad_arguments_name_the_hook_and_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(EarlyStoppingConfigError, match=f"EarlyStoppingHook: .*{match}"):
        EarlyStoppingHook(**{"monitor": "loss", **kwargs})


async def test_a_resumed_run_decides_as_an_uninterrupted_one(tmp_path: Path) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    def saver(directory: Path) -> CheckpointSaverHook:
        return CheckpointSaverHook(
            directory, save_steps=1, asynchronous=False, handle_signals=False
        )

    straight = EarlyStoppingHook("loss", patience=3, min_delta=0.05)
    result = await run_session(
        [straight, saver(tmp_path / "a")], losses_step(LOSSES), state=new_state(), max_steps=12
    )
    first = EarlyStoppingHook("loss", patience=3, min_delta=0.05)
    await run_session(
        [first, saver(tmp_path / "b"), monitored.StopAtStepHook(last_step=7)],
        losses_step(LOSSES),
        state=new_state(),
        max_steps=12,
    )
    resumed = EarlyStoppingHook("loss", patience=3, min_delta=0.05)
    again = await run_session(
        [resumed, saver(tmp_path / "b")], losses_step(LOSSES), state=new_state(), max_steps=12
    )
    assert again.state.global_step == result.state.global_step == 8
    assert resumed.plugin_state() == straight.plugin_state()


async def test_restore_best_puts_the_best_arrays_back_when_it_stopped() -> None:
    hook = EarlyStoppingHook("loss", patience=2, restore_best=True)
    state = new_state()
    await run_session([hook], losses_step(LOSSES), state=state, max_steps=12)
    assert state.global_step == 7
    assert state["w"] == 5.0  # the arrays of step 5, the best


async def test_restore_best_does_nothing_when_training_ended_otherwise() -> None:
    hook = EarlyStoppingHook("loss", patience=5, restore_best=True)
    state = new_state()
    await run_session(
        [hook, monitored.StopAtStepHook(last_step=7)], losses_step(LOSSES), state=state
    )
    assert state["w"] == 7.0


async def test_restore_best_from_an_exported_best_checkpoint(tmp_path: Path) -> None:
    hook = EarlyStoppingHook(
        "loss", patience=2, restore_best=True, best_checkpoint_dir=tmp_path / "best"
    )
    state = new_state()
    await run_session([hook], losses_step(LOSSES), state=state, max_steps=12)
    assert hook.best_checkpoint is not None
    assert hook.best_checkpoint.endswith("best-5")
    assert (state.global_step, float(state["w"])) == (7, 5.0)


async def test_tf1_estimator_hook_counts_steps() -> None:
    hook = stop_if_no_decrease_hook("loss", max_steps_without_decrease=3, min_steps=2)
    result = await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)
    assert result.state.global_step == 8  # best 2.9 at step 5, three steps later


async def test_metrics_reported_from_elsewhere_are_observed() -> None:
    hook = EarlyStoppingHook("val_accuracy", patience=1, every_n_steps=0)
    state = new_state()
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for accuracy in [0.5, 0.7, 0.6, 0.8, 0.9]:
            await sess.run(losses_step(LOSSES))
            await sess.run(losses_step(LOSSES))
            hook.observe(sess, state.global_step, {"val_accuracy": accuracy})
            if sess.should_stop():
                break
    assert state.global_step == 6
    assert hook.best_step == 4


async def test_evaluation_results_reported_in_the_session_are_the_checks() -> None:
    hook = EarlyStoppingHook("val_accuracy", patience=1, every_n_steps=0)
    state = new_state()
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for accuracy in [0.5, 0.7, 0.6, 0.8, 0.9]:
            await sess.run(losses_step(LOSSES))
            await sess.report_evaluation(state.global_step, {"val_accuracy": accuracy})
            if sess.should_stop():
                break
    assert (state.global_step, hook.best_step, hook.stopped_step) == (3, 2, 3)


async def test_an_evaluation_hook_in_the_session_drives_the_decision() -> None:
    from monitored.evaluation import EvaluationHook
    from monitored.metrics import Mean

    # The "accuracy" evaluated at global step s is ACCURACIES[s - 1]: best at 2, then worse.
    accuracies = [0.6, 0.9, 0.8, 0.7, 0.95, 0.99]

    def eval_step(state: monitored.TrainState, batch: Any, metrics: Any) -> None:
        metrics["accuracy"].update(np.float64(accuracies[state.global_step - 1]))

    evaluation = EvaluationHook(
        eval_step, {"accuracy": Mean()}, input_fn=lambda: [0], every_n_steps=1
    )
    stopper = EarlyStoppingHook("accuracy", patience=2, every_n_steps=0)
    result = await run_session(
        [evaluation, stopper], losses_step(LOSSES), state=new_state(), max_steps=6
    )
    assert result.state.global_step == 4
    assert (stopper.best, stopper.best_step) == (pytest.approx(0.9), 2)


async def test_a_hook_watching_a_training_output_ignores_evaluation_results() -> None:
    hook = EarlyStoppingHook("loss", patience=0, every_n_steps=100)
    state = new_state()
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        for loss in [1.0, 2.0, 3.0]:
            await sess.run(losses_step(LOSSES))
            await sess.report_evaluation(state.global_step, {"loss": loss})
        assert not sess.should_stop()
    assert hook.best is None


async def test_watching_evaluations_that_never_come_is_a_warning_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING", logger="monitored")
    hook = EarlyStoppingHook("accuracy", mode="max", every_n_steps=0)
    await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=3)
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "'accuracy' (every_n_steps=0), but no evaluation was reported" in warning
    caplog.clear()
    judged = EarlyStoppingHook("accuracy", mode="max", every_n_steps=0)
    async with monitored.MonitoredSession(new_state(), hooks=[judged]) as sess:
        await sess.run(losses_step(LOSSES))
        await sess.report_evaluation(1, {"accuracy": 0.5})
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


async def test_a_monitor_missing_from_the_first_evaluation_is_an_error_at_once() -> None:
    hook = EarlyStoppingHook("val_acuracy", mode="max", every_n_steps=0)
    with pytest.raises(MonitoredValueError, match="'val_acuracy' is not among.*step 1"):
        async with monitored.MonitoredSession(new_state(), hooks=[hook]) as sess:
            await sess.run(losses_step(LOSSES))
            await sess.report_evaluation(1, {"val_accuracy": 0.5})


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,nan_guard,checkpoint")


@pytest.mark.usefixtures("installed")
async def test_the_installed_plugin_is_off_until_a_monitor_is_set() -> None:
    result = await run_session([], losses_step(LOSSES), state=new_state(), max_steps=12)
    assert result.state.global_step == 12
    result = await run_session(
        [],
        losses_step(LOSSES),
        state=new_state(),
        max_steps=12,
        plugin_options={"early_stopping": {"monitor": "loss", "patience": 2}},
    )
    assert result.state.global_step == 7


@pytest.mark.usefixtures("installed")
async def test_the_installed_plugin_hears_evaluation_results() -> None:
    state = new_state()
    options = {"early_stopping": {"monitor": "val_loss", "every_n_steps": 0, "patience": 1}}
    async with monitored.MonitoredSession(state, plugin_options=options) as sess:
        for val_loss in [3.0, 2.0, 2.5, 2.6, 1.0]:
            await sess.run(losses_step(LOSSES))
            await sess.report_evaluation(state.global_step, {"val_loss": val_loss})
            if sess.should_stop():
                break
    assert state.global_step == 3  # 2.5 at step 3 is no improvement: patience 1 is spent


async def test_the_best_checkpoint_is_logged_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34 §2: the best checkpoint's path (also restored from a checkpoint, as the
    plugin's state) is logged escaped, on one line, whatever its directory's name holds."""
    import logging

    from _hostile import HOSTILE_NAME, assert_safe_line

    hook = EarlyStoppingHook(
        "loss", patience=2, restore_best=True, best_checkpoint_dir=tmp_path / HOSTILE_NAME
    )
    with caplog.at_level(logging.INFO, logger="monitored.early_stopping"):
        await run_session([hook], losses_step(LOSSES), state=new_state(), max_steps=12)
    named = [r.getMessage() for r in caplog.records if "best-" in r.getMessage()]
    assert any("restored the best state from" in message for message in named)
    for message in named:
        assert_safe_line(message)


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({}, r"no rule \(a mapping\), got NoneType"),
        ({"rule": []}, r"no rule \(a mapping\), got list"),
        ({"rule": {"best": 1.0}}, r"has no rule\.best_step \(an integer >= 0 or null\)"),
        (
            {"rule": {**KerasRule("min").state_dict(), "best": "0.1"}},
            r"rule\.best is '0\.1' \(str\); expected a number or null",
        ),
        (
            {"rule": {**KerasRule("min").state_dict(), "wait": None}},
            r"rule\.wait is None \(NoneType\); expected an integer >= 0",
        ),
        (
            {"rule": {**KerasRule("min").state_dict(), "index": -1}},
            r"rule\.index is -1 \(int\); expected an integer >= 0",
        ),
        (
            {"rule": {**KerasRule("min").state_dict(), "best_step": True}},
            r"rule\.best_step is True \(bool\)",
        ),
        (
            {"rule": KerasRule("min").state_dict(), "ema": [1]},
            r"state\.ema is \[1\] \(list\); expected a number or null",
        ),
        (
            {"rule": KerasRule("min").state_dict(), "best_checkpoint": 3},
            r"state\.best_checkpoint is 3 \(int\); expected a string or null",
        ),
    ],
)
def test_a_restored_state_of_the_wrong_shape_is_refused_naming_the_field(
    state: dict[str, Any], match: str
) -> None:
    """A checkpoint may come from elsewhere: refused when restored, not at a later check."""
    with pytest.raises(EarlyStoppingStateError, match=match):
        EarlyStoppingHook("loss", patience=2).load_plugin_state(state)


def test_a_restored_state_of_the_tf1_rule_is_checked_too() -> None:
    hook = EarlyStoppingHook("loss", patience=2)
    hook.rule = NoImprovementRule("min", 10)
    with pytest.raises(EarlyStoppingStateError, match=r"rule\.stopped_step is 'x'"):
        hook.load_plugin_state({"rule": {"best": 1, "best_step": 2, "stopped_step": "x"}})
    hook.load_plugin_state({"rule": {"best": 1, "best_step": 2, "stopped_step": None}})
    assert (hook.rule.best, hook.rule.best_step) == (1, 2)


def test_a_hostile_value_in_a_restored_state_is_named_escaped() -> None:
    bad = {**KerasRule("min").state_dict(), "best": "\x1b]52;c;ZWNobw==\x07\nforged"}
    with pytest.raises(EarlyStoppingStateError) as info:
        EarlyStoppingHook("loss", patience=2).load_plugin_state({"rule": bad})
    message = str(info.value)
    assert not {"\x1b", "\x07", "\n"} & set(message)


def test_a_state_saved_by_the_hook_is_restored_as_it_was() -> None:
    hook = EarlyStoppingHook("loss", patience=2)
    for step, value in enumerate([3.0, 2.0, 2.5], start=1):
        hook.rule.observe(step, value)
    again = EarlyStoppingHook("loss", patience=2)
    again.load_plugin_state(hook.plugin_state())
    assert again.plugin_state() == hook.plugin_state()


def test_a_refused_state_leaves_the_hook_as_it_was() -> None:
    hook = EarlyStoppingHook("loss", patience=2)
    hook.rule.observe(1, 3.0)
    before = hook.plugin_state()
    saved = {**KerasRule("min").state_dict(), "best": 9.0, "index": 7}
    with pytest.raises(EarlyStoppingStateError, match=r"state\.ema"):
        hook.load_plugin_state({"rule": saved, "ema": "x"})
    with pytest.raises(EarlyStoppingStateError, match=r"rule\.stopped_step"):
        hook.load_plugin_state({"rule": {**saved, "stopped_step": -2}})
    assert hook.plugin_state() == before
