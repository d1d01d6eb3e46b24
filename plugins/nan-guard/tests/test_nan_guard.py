"""NanTensorHook: TF1's behaviour, infinities, state scans, spikes, rollback, the plugin."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import monitored
from monitored.testing import run_session
from monitored_nan_guard import (
    LossSpikeError,
    NanGuardConfigError,
    NanLossDuringTrainingError,
    NanTensorHook,
    NonFiniteLossError,
    NonFiniteStateError,
    Rollback,
    RollbackError,
)

pytestmark = pytest.mark.anyio


def loss_at(bad_step: int, bad: float = float("nan"), good: float = 1.0) -> Any:
    """A step whose loss is ``bad`` at global step ``bad_step`` and ``good`` elsewhere."""

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(bad if state.global_step == bad_step else good)}

    return step


class Ends:
    def __init__(self) -> None:
        self.ended = False

    def end(self) -> None:
        self.ended = True


async def test_nan_loss_raises_tf1s_error_and_message_and_skips_end(caplog: Any) -> None:
    ends = Ends()
    with pytest.raises(NanLossDuringTrainingError) as caught:
        await run_session([NanTensorHook("loss"), ends], loss_at(4), max_steps=10)
    assert str(caught.value) == "NaN loss during training."
    assert not ends.ended
    assert "Model diverged with loss = NaN." in caplog.text


async def test_nan_loss_without_failing_logs_and_stops_after_that_step(caplog: Any) -> None:
    ends = Ends()
    result = await run_session([NanTensorHook("loss", False), ends], loss_at(4), max_steps=10)
    assert result.state.global_step == 4
    assert ends.ended
    assert "Model diverged with loss = NaN." in caplog.text


async def test_infinite_loss_passes_by_default_as_in_tf1() -> None:
    result = await run_session([NanTensorHook("loss")], loss_at(3, float("inf")), max_steps=6)
    assert result.state.global_step == 6


async def test_fail_on_inf_treats_infinities_as_failures() -> None:
    hook = NanTensorHook("loss", fail_on_inf=True)
    with pytest.raises(NonFiniteLossError, match="step 3"):
        await run_session([hook], loss_at(3, float("-inf")), max_steps=6)


async def test_a_state_entry_can_be_watched() -> None:
    def step(state: monitored.TrainState) -> None:
        state.global_step += 1
        state["w"][...] = np.nan if state.global_step == 2 else 0.0

    state = monitored.TrainState({"w": np.zeros((), np.float32)})
    with pytest.raises(NanLossDuringTrainingError):
        await run_session([NanTensorHook("w")], step, state=state, max_steps=5)


async def test_state_scan_names_the_first_bad_array_its_count_and_the_step() -> None:
    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        if state.global_step == 5:
            state["b"][:3] = [np.inf, np.nan, -np.inf]
        return {"loss": np.float32(1.0)}

    state = monitored.TrainState(
        {"a": np.zeros(4), "n": np.zeros(2, np.int64), "b": np.zeros(10, np.float32)}
    )
    hook = NanTensorHook("loss", check_state_every_n_steps=2)
    with pytest.raises(NonFiniteStateError, match=r"'b' has 3 non-finite of 10 elements at step 6"):
        await run_session([hook], step, state=state, max_steps=20)
    assert hook.failures[0].array == "b"


async def test_spikes_above_the_running_window_fail() -> None:
    rng = np.random.default_rng(0)
    losses = [*list(1.0 + 0.01 * rng.standard_normal(40)), 5.0]

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float64(losses[state.global_step - 1])}

    hook = NanTensorHook("loss", spike_k=6, spike_window=30)
    with pytest.raises(LossSpikeError, match="step 41"):
        await run_session([hook], step, max_steps=50)


async def test_optional_loss_lets_steps_without_one_pass() -> None:
    hook = NanTensorHook(monitored.optional("loss"))
    result = await run_session([hook], max_steps=3)
    assert result.state.global_step == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_nan": "explode"}, "on_nan"),
        ({"check_state_every_n_steps": -1}, "check_state_every_n_steps"),
        ({"max_rollbacks": -2}, "max_rollbacks"),
        ({"spike_k": 0}, "spike_k"),
        ({"loss_tensor": ""}, "loss_tensor"),
    ],
)
def test_bad_arguments_name_the_hook_and_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(NanGuardConfigError, match=f"NanTensorHook: {match}"):
        NanTensorHook(**{"loss_tensor": "loss", **kwargs})


async def test_a_loss_that_is_not_a_scalar_is_an_error_naming_it() -> None:
    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.ones(3)}

    with pytest.raises(NanGuardConfigError, match=r"'loss' must be a scalar.*step 1.*\(3,\)"):
        await run_session([NanTensorHook("loss")], step, max_steps=2)


# -- rollback -----------------------------------------------------------------------------------
def poisoned_step(poison_at: set[int]) -> Any:
    """``w`` grows by 1 a step; the first time each step in ``poison_at`` runs, NaN."""

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        if state.global_step in poison_at:
            poison_at.discard(state.global_step)
            return {"loss": np.float32(np.nan)}
        return {"loss": state["w"].sum()}

    return step


async def test_rollback_restores_the_newest_older_checkpoint_and_continues(tmp_path: Any) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    seen: list[Rollback] = []
    hook = NanTensorHook("loss", on_nan="rollback", skip_extra_steps=2, on_rollback=seen.append)
    saver = CheckpointSaverHook(tmp_path, save_steps=3, asynchronous=False, handle_signals=False)
    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    result = await run_session(
        [hook, saver, monitored.StopAtStepHook(last_step=10)],
        poisoned_step({7}),
        state=state,
        max_steps=50,
    )
    assert result.state.global_step == 10
    np.testing.assert_array_equal(state["w"], [10, 10])  # w follows the global step again
    [rollback] = seen
    assert (rollback.failed_step, rollback.restored_step) == (7, 6)
    assert list(rollback.skip) == [7, 8, 9]
    assert hook.is_skipped(8)
    assert not hook.is_skipped(10)
    assert result.events["after_run"] == 11  # ten steps and the one that diverged


async def test_rollbacks_stop_at_max_rollbacks(tmp_path: Any) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    hook = NanTensorHook("loss", on_nan="rollback", max_rollbacks=1, checkpoint_dir=tmp_path)
    saver = CheckpointSaverHook(tmp_path, save_steps=2, asynchronous=False, handle_signals=False)
    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    with pytest.raises(RollbackError, match="max_rollbacks=1") as caught:
        await run_session([hook, saver], poisoned_step({5, 6}), state=state, max_steps=50)
    assert isinstance(caught.value.__cause__, NanLossDuringTrainingError)


async def test_rollback_without_an_older_checkpoint_is_an_error(tmp_path: Any) -> None:
    hook = NanTensorHook("loss", on_nan="rollback", checkpoint_dir=tmp_path)
    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    with pytest.raises(RollbackError, match="no checkpoint older than step 2"):
        await run_session([hook], poisoned_step({2}), state=state, max_steps=5)


async def test_rollback_without_any_checkpoint_directory_fails_at_start() -> None:
    with pytest.raises(NanGuardConfigError, match="needs checkpoints"):
        await run_session([NanTensorHook("loss", on_nan="rollback")], max_steps=1)


# -- the installed plugin -----------------------------------------------------------------------
@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,early_stopping,checkpoint")


@pytest.mark.usefixtures("installed")
async def test_the_installed_plugin_guards_the_loss(caplog: Any) -> None:
    caplog.set_level(logging.INFO, "monitored")
    with pytest.raises(NanLossDuringTrainingError):
        await run_session([], loss_at(3), max_steps=10)
    assert "nan_guard (monitored-nan-guard" in caplog.text


@pytest.mark.usefixtures("installed")
async def test_the_installed_plugin_ignores_steps_without_a_loss_and_takes_options() -> None:
    result = await run_session([], max_steps=3)
    assert result.state.global_step == 3
    result = await run_session(
        [], loss_at(2), max_steps=10, plugin_options={"nan_guard": {"on_nan": "stop"}}
    )
    assert result.state.global_step == 2


@pytest.mark.usefixtures("installed")
async def test_a_loss_named_in_the_options_must_be_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # A misspelled option must not silently turn the guard off.
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", "nan_guard.loss=los")
    with pytest.raises(monitored.FetchError, match="'los'.*did you mean 'loss'") as info:
        await run_session([], loss_at(5), max_steps=10)
    assert "plugin 'nan_guard'" in "\n".join(getattr(info.value, "__notes__", [str(info.value)]))


@pytest.mark.usefixtures("installed")
async def test_a_loss_named_in_the_options_is_guarded() -> None:
    def total_at(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"total": np.float32("nan" if state.global_step == 3 else 1.0)}

    with pytest.raises(NanLossDuringTrainingError):
        await run_session(
            [], total_at, max_steps=10, plugin_options={"nan_guard": {"loss": "total"}}
        )


@pytest.mark.usefixtures("installed")
async def test_the_installed_plugin_can_be_disabled() -> None:
    result = await run_session([], loss_at(2), max_steps=4, disable_plugins=["nan_guard"])
    assert result.state.global_step == 4


def test_bad_options_fail_before_training() -> None:
    with pytest.raises(NanGuardConfigError, match="on_nan"):
        NanTensorHook(monitored.optional("loss"), on_nan="explode")  # type: ignore[arg-type]


async def test_the_checkpoint_rolled_back_to_is_logged_escaped(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34 §2: the rollback's log names a checkpoint found by listing a directory
    (whose name holds control characters and a newline): escaped, on one line."""
    from _hostile import HOSTILE_NAME, assert_safe_line

    from monitored_checkpoint import CheckpointSaverHook

    directory = tmp_path / HOSTILE_NAME
    hook = NanTensorHook("loss", on_nan="rollback")
    saver = CheckpointSaverHook(directory, save_steps=3, asynchronous=False, handle_signals=False)
    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    with caplog.at_level(logging.WARNING, logger="monitored.nan_guard"):
        await run_session(
            [hook, saver, monitored.StopAtStepHook(last_step=8)],
            poisoned_step({7}),
            state=state,
            max_steps=50,
        )
    (line,) = [r.getMessage() for r in caplog.records if "rolled back to" in r.getMessage()]
    assert_safe_line(line)
