"""SummarySaverHook: TF1's timing, SessionLog events, declarative fetches, the core's sink."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import numpy as np
import pytest

import monitored_summaries as summaries
from monitored import (
    MissingPluginError,
    MonitoredSession,
    MonitoredTrainingSession,
    StepCounterHook,
    StopAtStepHook,
    TrainState,
)
from monitored_summaries import SummarySaverHook, SummaryScheduleError

pytestmark = pytest.mark.anyio


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    summaries.scalar("loss", 1.0 / state.global_step)
    return {"lr": np.float32(0.5), "out": np.arange(4.0)}


async def train(hooks: list[object], last_step: int, **kwargs: Any) -> TrainState:
    state = TrainState({"w": np.ones(3)})
    async with MonitoredSession(state, hooks=[StopAtStepHook(last_step=last_step), *hooks]) as s:
        while not s.should_stop():
            await s.run(step, **kwargs)
    return state


async def test_tf1_timing_save_steps_3_last_step_7_writes_1_4_7(
    logdir: str, events: Any, scalars: Any
) -> None:
    await train([SummarySaverHook(save_steps=3, output_dir=logdir)], 7)
    assert [s for s, _ in scalars(events(logdir))["loss"]] == [1, 4, 7]


async def test_file_starts_with_version_then_start_and_ends_with_stop(
    logdir: str, events: Any
) -> None:
    await train([SummarySaverHook(save_steps=1, output_dir=logdir)], 3)
    evs = events(logdir)
    assert evs[0].file_version == "brain.Event:2"
    logs = [(e.step, e.session_log.status) for e in evs if e.HasField("session_log")]
    assert logs == [(1, 1), (3, 2)]  # START before the first step written, STOP at the end


async def test_steps_that_are_not_due_never_look_at_the_values(logdir: str) -> None:
    seen = []

    def lazy_step(state: TrainState) -> None:
        state.global_step += 1
        # Not an array: an error on a due step, nothing at all on the others.
        if state.global_step in (1, 5):
            summaries.scalar("x", 1.0)
        else:
            summaries.scalar("x", object())
            summaries.histogram("", "not even a name")
            summaries.image("img", None)
        seen.append(state.global_step)

    state = TrainState()
    hooks = [StopAtStepHook(last_step=6), SummarySaverHook(save_steps=4, output_dir=logdir)]
    async with MonitoredSession(state, hooks=hooks) as s:
        while not s.should_stop():
            await s.run(lazy_step)
    assert seen == [1, 2, 3, 4, 5, 6]


async def test_nested_and_async_steps_record(logdir: str, scalars: Any, events: Any) -> None:
    def inner(value: float) -> None:
        summaries.scalar("nested", value)

    async def async_step(state: TrainState) -> None:
        state.global_step += 1
        inner(float(state.global_step))

    state = TrainState()
    hooks = [StopAtStepHook(last_step=4), SummarySaverHook(save_steps=2, output_dir=logdir)]
    async with MonitoredSession(state, hooks=hooks) as s:
        while not s.should_stop():
            await s.run(async_step)
    assert scalars(events(logdir))["nested"] == [(1, 1.0), (3, 3.0)]


async def test_declarative_scalars_and_histograms_fetched_on_due_steps_only(
    logdir: str, events: Any, scalars: Any
) -> None:
    hook = SummarySaverHook(save_steps=2, output_dir=logdir, scalars=["lr"], histograms=["w"])
    await train([hook], 4)
    evs = events(logdir)
    assert [s for s, _ in scalars(evs)["lr"]] == [1, 3, 4]  # the end step is always written
    histos = [(e.step, v.histo.num) for e in evs for v in e.summary.value if v.tag == "w"]
    assert histos == [(1, 3), (3, 3), (4, 3)]


async def test_a_hook_without_fetches_has_no_before_run(logdir: str) -> None:
    assert not hasattr(SummarySaverHook(save_steps=1, output_dir=logdir), "before_run")
    assert hasattr(SummarySaverHook(save_steps=1, output_dir=logdir, scalars=["x"]), "before_run")


async def test_global_step_per_sec_reaches_the_event_file(
    logdir: str, events: Any, scalars: Any
) -> None:
    hooks = [StepCounterHook(every_n_steps=2), SummarySaverHook(save_steps=10, output_dir=logdir)]
    await train(hooks, 5)
    assert [s for s, _ in scalars(events(logdir))["global_step/sec"]] == [3, 5]


async def test_non_finite_scalars_are_written_as_tf_writes_them(
    logdir: str, events: Any, scalars: Any
) -> None:
    def nan_step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("nan", float("nan"))
        summaries.scalar("inf", np.float32(-np.inf))

    state = TrainState()
    hooks = [StopAtStepHook(last_step=1), SummarySaverHook(save_steps=1, output_dir=logdir)]
    async with MonitoredSession(state, hooks=hooks) as s:
        await s.run(nan_step)
    found = scalars(events(logdir))
    assert math.isnan(found["nan"][0][1])
    assert found["inf"][0][1] == -math.inf


async def _saved_checkpoints(directory: str, last_step: int, events: Any) -> list[tuple[int, str]]:
    """Train to ``last_step`` saving every 2 steps; the ``SessionLog.CHECKPOINT`` events."""
    async with MonitoredTrainingSession(
        TrainState({"w": np.ones(3)}),
        checkpoint_dir=directory,
        save_checkpoint_steps=2,
        save_summaries_steps=1,
        hooks=[StopAtStepHook(last_step=last_step)],
    ) as s:
        while not s.should_stop():
            await s.run(step)
    return [
        (e.step, e.session_log.checkpoint_path)
        for e in events(directory)
        if e.HasField("session_log") and e.session_log.status == 3
    ]


async def test_checkpoint_plugin_saves_become_session_log_checkpoint(
    tmp_path: Any, events: Any
) -> None:
    checkpoints = await _saved_checkpoints(str(tmp_path / "run"), 4, events)
    assert [s for s, _ in checkpoints] == [0, 2, 4]
    assert all(path.endswith(f"model.ckpt-{s}") for s, path in checkpoints)


async def test_a_checkpoint_path_that_is_not_utf8_is_written_escaped(
    tmp_path: Any, events: Any
) -> None:
    """A directory named with bytes that are not UTF-8 fails no save's SessionLog."""
    directory = os.path.join(str(tmp_path), "run-\udcff")
    paths = [path for _, path in await _saved_checkpoints(directory, 2, events)]
    assert [path.rsplit(os.sep, 2)[-2:] for path in paths] == [
        ["run-\\xff", "model.ckpt-0"],
        ["run-\\xff", "model.ckpt-2"],
    ]


async def test_monitored_training_session_writes_summaries_on_the_chief(
    tmp_path: Any, events: Any, scalars: Any
) -> None:
    directory = str(tmp_path / "run")
    summary_dir = str(tmp_path / "summaries")
    state = TrainState({"w": np.ones(3)})
    async with MonitoredTrainingSession(
        state,
        checkpoint_dir=directory,
        summary_dir=summary_dir,
        save_summaries_steps=2,
        log_step_count_steps=2,
        hooks=[StopAtStepHook(last_step=5)],
    ) as s:
        while not s.should_stop():
            await s.run(step)
    found = scalars(events(summary_dir))
    assert [s for s, _ in found["loss"]] == [1, 3, 5]
    assert [s for s, _ in found["global_step/sec"]] == [3, 5]


@pytest.mark.parametrize("switch", [0, None])
async def test_save_summaries_steps_0_or_none_is_off(tmp_path: Any, switch: int | None) -> None:
    directory = tmp_path / "run"
    state = TrainState({"w": np.ones(3)})
    async with MonitoredTrainingSession(
        state,
        checkpoint_dir=str(directory),
        save_summaries_steps=switch,
        hooks=[StopAtStepHook(last_step=2)],
    ) as s:
        while not s.should_stop():
            await s.run(step)
    assert not list(directory.glob("events.out.tfevents.*"))


async def test_workers_write_nothing(tmp_path: Any, caplog: Any) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    state = TrainState({"w": np.ones(3)})
    session = MonitoredTrainingSession(
        state,
        is_chief=False,
        checkpoint_dir=str(directory),
        save_summaries_steps=1,
        hooks=[StopAtStepHook(last_step=2)],
        max_wait_secs=0,
    )
    assert "summaries" not in {info.name for info in session.plugins}
    assert not list(directory.glob("events.out.tfevents.*"))


async def test_asking_for_summaries_with_the_plugin_disabled_names_the_package(
    tmp_path: Any,
) -> None:
    with pytest.raises(
        MissingPluginError, match="'summaries' plugin provides, but it is disabled"
    ) as info:
        async with MonitoredTrainingSession(
            TrainState(),
            checkpoint_dir=str(tmp_path),
            save_summaries_steps=10,
            disable_plugins=["summaries"],
        ):
            pass
    assert info.value.distribution == "monitored-summaries"


def test_save_steps_and_save_secs_both_or_neither(logdir: str) -> None:
    with pytest.raises(SummaryScheduleError, match="exactly one of save_steps and save_secs"):
        SummarySaverHook(save_steps=1, save_secs=1.0, output_dir=logdir)
    with pytest.raises(SummaryScheduleError, match="exactly one of save_steps and save_secs"):
        SummarySaverHook(output_dir=logdir)
    with pytest.raises(SummaryScheduleError, match="save_steps must be a positive int, got 0"):
        SummarySaverHook(save_steps=0, output_dir=logdir)


async def test_save_secs_writes_the_first_step(logdir: str, events: Any, scalars: Any) -> None:
    await train([SummarySaverHook(save_secs=3600, output_dir=logdir)], 3)
    assert [s for s, _ in scalars(events(logdir))["loss"]] == [1]


async def test_loaded_plugin_is_listed(caplog: Any, tmp_path: Any) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    async with MonitoredSession(TrainState()):
        pass
    assert "summaries" in caplog.text


async def test_save_secs_writes_again_once_the_time_is_up(
    logdir: str, events: Any, scalars: Any
) -> None:
    await train([SummarySaverHook(save_secs=1e-9, output_dir=logdir)], 3)
    assert [s for s, _ in scalars(events(logdir))["loss"]] == [1, 2, 3]


# -- issue 22: steps that run rarely, save_secs read as the step starts ---------------------------
def validation_step(state: TrainState) -> dict[str, Any]:
    """Records nothing and leaves the global step alone (a validation or test step)."""
    return {"cost": np.float32(2.0)}


async def test_a_due_step_that_records_nothing_leaves_the_slot_to_the_next_step_that_records(
    logdir: str, events: Any, scalars: Any
) -> None:
    hook = SummarySaverHook(save_steps=3, output_dir=logdir)
    async with MonitoredSession(TrainState(), hooks=[hook]) as s:
        await s.run(validation_step)  # due (the first step): nothing recorded
        await s.run(step)  # step 1 records: it is written
        for _ in range(3):
            await s.run(step)  # 2, 3, 4: 4 is due
            await s.run(validation_step)
        await s.run(step)  # 5
    assert [s for s, _ in scalars(events(logdir))["loss"]] == [1, 4]


async def test_save_secs_reads_the_clock_when_the_step_starts(
    logdir: str, events: Any, scalars: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr("monitored._core._timer.time.monotonic", lambda: now[0])
    monkeypatch.setattr("monitored_summaries._hook.monotonic", lambda: now[0])
    hook = SummarySaverHook(save_secs=10, output_dir=logdir)
    assert hasattr(hook, "before_run"), "a save_secs hook reads the clock in before_run"
    assert not hasattr(SummarySaverHook(save_steps=3, output_dir=logdir), "before_run")
    async with MonitoredSession(TrainState(), hooks=[hook]) as s:
        await s.run(step)  # 1: the first step
        now[0] += 10  # the time passes between two runs
        await s.run(step)  # 2: due when it starts (read after step 1 it was not)
        now[0] += 5
        await s.run(step)
        await s.run(step)
    assert [s for s, _ in scalars(events(logdir))["loss"]] == [1, 2]


async def test_save_secs_given_positionally_reads_the_clock_too(logdir: str) -> None:
    assert hasattr(SummarySaverHook(None, 10, logdir), "before_run")
    assert hasattr(SummarySaverHook(None, 10, logdir, scalars=["lr"]), "before_run")


async def test_save_secs_with_fetches_fetches_on_due_steps(
    logdir: str, events: Any, scalars: Any
) -> None:
    hook = SummarySaverHook(save_secs=3600, output_dir=logdir, scalars=["lr"])
    await train([hook], 3)
    assert [s for s, _ in scalars(events(logdir))["lr"]] == [1, 3]  # the first and the end


# -- issue 24: what a step records reaches every summary sink ------------------------------------
class Sink:
    """A third-party summary sink: a plain hook implementing ``write_summaries``."""

    def __init__(self) -> None:
        self.got: list[tuple[int, dict[str, Any]]] = []

    def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
        self.got.append((step, dict(summaries)))

    def points(self, tag: str) -> list[tuple[int, float]]:
        return [(step, float(values[tag])) for step, values in self.got if tag in values]


def recording_step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    summaries.scalar("loss", 1.0 / state.global_step)
    summaries.scalar("Train/Training Loss", 2.0)
    summaries.histogram("w", np.arange(5.0))
    summaries.image("img", np.zeros((1, 2, 2, 3), np.uint8))
    summaries.text("note", "hello")
    return {"lr": np.float32(0.5)}


async def test_recorded_scalars_reach_every_other_sink_once_at_the_step_written(
    logdir: str, events: Any, scalars: Any
) -> None:
    sink = Sink()
    hooks = [
        StopAtStepHook(last_step=7),
        sink,
        SummarySaverHook(save_steps=3, output_dir=logdir, step_outputs=True),
        StepCounterHook(every_n_steps=2),
    ]
    async with MonitoredSession(TrainState(), hooks=hooks) as s:
        while not s.should_stop():
            await s.run(recording_step)
    assert sink.points("loss") == [(1, 1.0), (4, 0.25), (7, pytest.approx(1 / 7))]
    # Under the tag TensorBoard shows; histograms, images and text stay in the event file.
    assert [step for step, _ in sink.points("Train/Training_Loss")] == [1, 4, 7]
    recorded = [values for _, values in sink.got if "loss" in values]
    # Not the step's scalar output ``lr``: every sink takes step outputs itself.
    assert all(set(values) == {"loss", "Train/Training_Loss"} for values in recorded)
    assert all(type(v) is np.ndarray and v.size == 1 for d in recorded for v in d.values())
    written = scalars(events(logdir))
    assert [step for step, _ in written["loss"]] == [1, 4, 7], "each point once in the file"
    assert [step for step, _ in written["Train/Training_Loss"]] == [1, 4, 7]
    assert [step for step, _ in written["global_step/sec"]] == [3, 5, 7]
    assert [step for step, _ in sink.points("global_step/sec")] == [3, 5, 7]


async def test_named_scalars_reach_the_other_sinks_the_end_step_included(logdir: str) -> None:
    sink = Sink()
    hook = SummarySaverHook(save_steps=2, output_dir=logdir, scalars=["lr"], histograms=["w"])
    await train([sink, hook], 4)
    assert sink.points("lr") == [(1, 0.5), (3, 0.5), (4, 0.5)]
    assert all(set(values) == {"loss", "lr"} for _, values in sink.got[:-1])
    assert set(sink.got[-1][1]) == {"lr"}, "at the end: what scalars= names, fetched"


async def test_steps_that_record_nothing_hand_nothing_on(logdir: str) -> None:
    sink = Sink()
    hook = SummarySaverHook(save_steps=1, output_dir=logdir)
    async with MonitoredSession(TrainState(), hooks=[sink, hook]) as s:
        for _ in range(3):
            await s.run(validation_step)
        await s.run(step)
    assert [step for step, _ in sink.got] == [1]


async def test_hooks_sharing_a_writer_write_what_one_hands_on_once(
    logdir: str, events: Any
) -> None:
    # Both write into logdir's shared writer; each skips what the other handed on.
    first = SummarySaverHook(save_steps=1, output_dir=logdir, step_outputs=True)
    second = SummarySaverHook(save_steps=1, output_dir=logdir, step_outputs=True)
    await train([first, second], 4)
    assert first.writer is second.writer
    points = [(e.step, v.tag) for e in events(logdir) for v in e.summary.value]
    expected = [(step, tag) for step in range(1, 5) for tag in ("loss", "lr")]
    assert sorted(points) == expected, "the step's scalar output lr once a step"


async def test_a_hook_with_its_own_writer_writes_what_another_hands_on(
    tmp_path: Any, events: Any, scalars: Any
) -> None:
    # A second event file (another directory) is a sink like any other. Step 1 is due
    # for both: the hook armed last records it (second); first writes the step's
    # outputs then (and what second hands on), then records 3; 4, the end, is outputs.
    first = SummarySaverHook(save_steps=2, output_dir=str(tmp_path / "a"), step_outputs=True)
    second = SummarySaverHook(save_steps=10**6, output_dir=str(tmp_path / "b"), step_outputs=True)
    await train([first, second], 4)
    assert [step for step, _ in scalars(events(str(tmp_path / "b")))["loss"]] == [1, 3]
    assert [step for step, _ in scalars(events(str(tmp_path / "a")))["loss"]] == [1, 3]
    assert [step for step, _ in scalars(events(str(tmp_path / "a")))["lr"]] == [1, 3, 4]


async def test_a_sink_that_fails_raises_naming_itself_and_the_point_is_in_the_file(
    logdir: str, events: Any, scalars: Any
) -> None:
    class Broken:
        def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
            raise OSError("tracker gone")

    hook = SummarySaverHook(save_steps=1, output_dir=logdir)
    with pytest.raises(OSError, match="tracker gone") as raised:
        await train([Broken(), hook], 3)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "hook 'write_summaries'" in notes
    assert "Broken" in notes
    assert "at step 1" in notes
    assert scalars(events(logdir))["loss"] == [(1, 1.0)], "written before it was handed on"


async def test_step_outputs_of_training_steps_only_are_written_when_asked(
    logdir: str, events: Any, scalars: Any
) -> None:
    def training_step(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(1.0 / state.global_step), "out": np.arange(4.0)}

    hook = SummarySaverHook(save_steps=2, output_dir=logdir, step_outputs=True)
    async with MonitoredSession(TrainState(), hooks=[hook]) as s:
        await s.run(validation_step)  # due (the first step), but no training step: nothing
        for _ in range(4):
            await s.run(training_step)  # 1, 2, 3, 4: 1 and 3 are due
            await s.run(validation_step)
        await s.run(training_step)  # 5: the end, not due
    written = scalars(events(logdir))
    assert [step for step, _ in written["loss"]] == [1, 3, 5]
    assert "cost" not in written, "a validation step's outputs are not the run's curves"
    assert "out" not in written, "four elements: no scalar"
