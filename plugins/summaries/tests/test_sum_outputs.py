"""The step's scalar outputs (``step_outputs=True``): fetched one step late, written at their step.

A due step asks for its scalar outputs with ``SCALAR_OUTPUTS`` and ``lag=1``: on a
device their copy is started in the step and collected at the next one (or when
the session stops), so the hook never makes the step it runs wait for the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy, standin_cupy

import monitored_summaries as summaries_module
from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_summaries import SummarySaverHook

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture

pytestmark = pytest.mark.anyio


class Copies:
    """Blocking and started device-to-host copies, by the step (``run`` call) they are in."""

    def __init__(self) -> None:
        self.step = 0
        self.blocking: list[int] = []
        self.started: list[int] = []


@pytest.fixture
def copies(standin_cupy: StandinCupy, monkeypatch: pytest.MonkeyPatch) -> Copies:
    # The installed NaN guard fetches the loss each step (one step late): left out here.
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "nan_guard")
    cupy = standin_cupy.module
    seen = Copies()
    get = cupy.ndarray._get

    def recording_get(
        self: Any, kind: str, stream: Any, order: str, out: Any, blocking: bool
    ) -> Any:
        (seen.blocking if blocking else seen.started).append(seen.step)
        return get(self, kind, stream, order, out, blocking)

    monkeypatch.setattr(cupy.ndarray, "_get", recording_get)
    return seen


def device_step(cupy: Any) -> Any:
    def run(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {
            "loss": cupy.asarray(np.float32(1.0 / state.global_step)),
            "acc": cupy.asarray(np.array([state.global_step], dtype=np.float64)),
            "lr": 0.5,
            "w": cupy.arange(3.0),  # three elements: no scalar
        }

    return run


async def _train(hook: SummarySaverHook, step_fn: Any, last_step: int, copies: Copies) -> None:
    async with MonitoredSession(
        TrainState(), hooks=[StopAtStepHook(last_step=last_step), hook]
    ) as s:
        while not s.should_stop():
            copies.step = s.state.global_step + 1
            await s.run(step_fn)
        copies.step = last_step + 1  # the close


@pytest.mark.parametrize("last_step", [5, 6])
async def test_device_outputs_are_written_at_their_step_and_no_step_waits_for_them(
    standin_cupy: StandinCupy,
    copies: Copies,
    logdir: str,
    events: Any,
    scalars: Any,
    last_step: int,
) -> None:
    hook = SummarySaverHook(save_steps=2, output_dir=logdir, step_outputs=True)
    await _train(hook, device_step(standin_cupy.module), last_step, copies)
    written = scalars(events(logdir))
    due = [1, 3, 5] + ([6] if last_step == 6 else [])
    assert [step for step, _ in written["loss"]] == due
    assert [value for _, value in written["loss"]] == pytest.approx([1 / s for s in due])
    assert written["acc"] == [(s, float(s)) for s in due], "each value with its own step"
    assert [step for step, _ in written["lr"]] == due
    assert "w" not in written
    # Due steps start one copy (both device outputs packed together); no step waits.
    assert copies.started == [1, 3, 5]
    # Only the close reads the last step, when it was not due (6), as TF1 writes it.
    assert copies.blocking == ([last_step + 1] if last_step == 6 else [])


async def test_the_last_due_steps_outputs_are_written_before_the_writer_closes(
    standin_cupy: StandinCupy, copies: Copies, logdir: str, events: Any, scalars: Any
) -> None:
    # Every step due: each step's outputs arrive at the next; the last ones at the stop.
    hook = SummarySaverHook(save_steps=1, output_dir=logdir, step_outputs=True)
    await _train(hook, device_step(standin_cupy.module), 4, copies)
    written = scalars(events(logdir))
    assert written["acc"] == [(s, float(s)) for s in range(1, 5)]
    assert copies.started == [1, 2, 3, 4]
    assert not copies.blocking
    # The event file ends with the STOP, after the last step's values.
    last = events(logdir)[-1]
    assert last.step == 4
    assert last.HasField("session_log")


async def test_a_failure_drops_the_outputs_still_on_their_way_as_documented(
    standin_cupy: StandinCupy, copies: Copies, logdir: str, events: Any, scalars: Any
) -> None:
    """No hook runs once a session fails (docs/hooks.md, lag=1): step 2's values, on
    their way when step 3 failed, are not written; step 1's are, and the step's own
    error is what is raised."""
    run = device_step(standin_cupy.module)

    def failing(state: TrainState) -> dict[str, Any]:
        if state.global_step == 2:
            raise RuntimeError("boom at step 3")
        return run(state)

    hook = SummarySaverHook(save_steps=1, output_dir=logdir, step_outputs=True)
    with pytest.raises(RuntimeError, match="boom at step 3"):
        await _train(hook, failing, 10, copies)
    assert scalars(events(logdir))["acc"] == [(1, 1.0)]
    assert not copies.blocking


async def test_save_secs_hooks_fetch_the_outputs_one_step_late_too(
    standin_cupy: StandinCupy, copies: Copies, logdir: str, events: Any, scalars: Any
) -> None:
    hook = SummarySaverHook(save_secs=3600, output_dir=logdir, step_outputs=True)
    await _train(hook, device_step(standin_cupy.module), 3, copies)
    written = scalars(events(logdir))
    assert [step for step, _ in written["loss"]] == [1, 3], "the first step, and the end"
    assert copies.started == [1]
    assert copies.blocking == [4], "the end step, read at the close"


async def test_host_outputs_take_the_same_path(logdir: str, events: Any, scalars: Any) -> None:
    values = iter([np.float32(4.0), np.float32(5.0), np.float32(6.0)])

    def host_step(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        out = np.array(next(values))
        result = {"loss": out}
        return result

    hook = SummarySaverHook(save_steps=2, output_dir=logdir, step_outputs=True)
    async with MonitoredSession(TrainState(), hooks=[StopAtStepHook(last_step=3), hook]) as s:
        while not s.should_stop():
            await s.run(host_step)
    assert scalars(events(logdir))["loss"] == [(1, 4.0), (3, 6.0)]


async def test_written_scalars_are_handed_on_only_when_another_sink_is_there(
    logdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[int] = []
    original = MonitoredSession.write_summaries

    async def counting(self: MonitoredSession, step: int, summaries: Any) -> None:
        handed.append(step)
        await original(self, step, summaries)

    monkeypatch.setattr(MonitoredSession, "write_summaries", counting)

    def recording(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        summaries_module.scalar("acc", 0.5)
        return {}

    class Sink:
        def __init__(self) -> None:
            self.got: list[int] = []

        def write_summaries(self, session: object, step: int, values: Any) -> None:
            self.got.append(step)

    for others in ([], [Sink()]):
        handed.clear()
        hooks = [StopAtStepHook(last_step=3), SummarySaverHook(save_steps=2, output_dir=logdir)]
        async with MonitoredSession(TrainState(), hooks=[*hooks, *others]) as s:
            while not s.should_stop():
                await s.run(recording)
        assert handed == ([1, 3] if others else [])
        if others:
            assert others[0].got == [1, 3]
