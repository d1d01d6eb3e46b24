"""TensorFlow's ``SummarySaverHook`` tests (``basic_session_run_hooks_test.py``) and
``MonitoredTrainingSession``'s summary tests (``monitored_session_test.py``), ported to
the ``monitored-summaries`` plugin (skipped without it).

TF's summary op ``scalar('my_summary', assign_add(var, 1.0))`` adds one to ``var``
each time it is *evaluated*, which is on due steps only: its values (1, 2, 3, ...)
count the writes. Here a step records its summaries itself; :func:`summary_op` plays
TF's op, adding one only on steps whose summaries are recorded. TF's fake summary
writer becomes the event file, read back with ``summary_iterator``. TF drives the hook
through its private ``_HookedSession`` (no ``after_create_session``); here the hook
runs in a real session, whose first step it writes as TF's does (``_next_step is
None``). ``mock.patch(time.time)`` becomes a fake clock for both clocks the hook reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tf1 import FakeClock, do_step

import monitored
from monitored import MonitoredSession, TrainState

summaries = pytest.importorskip("monitored_summaries")
_record = pytest.importorskip("monitored_summaries._record")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("monitored._core._timer.time", fake)
    monkeypatch.setattr("monitored_summaries._hook.monotonic", fake.monotonic)
    return fake


@pytest.fixture
def writer(tmp_path: Path) -> Any:
    """TF's ``FakeSummaryWriter(log_dir)``: a writer of its own directory."""
    made = summaries.FileWriter(tmp_path / "log")
    yield made
    made.close()


def written(writer: Any) -> dict[int, dict[str, float]]:
    """``{step: {tag: value}}`` of the summaries in ``writer``'s file (TF's assert_summaries)."""
    writer.flush()
    found: dict[int, dict[str, float]] = {}
    for event in summaries.summary_iterator(writer.path):
        for value in event.summary.value:
            found.setdefault(event.step, {})[value.tag] = value.simple_value
    return found


def summary_op(*ops: tuple[str, float]) -> Any:
    """TF's ``var = Variable(0.0); scalar(tag, assign_add(var, 1.0) * factor)``, as a step.

    Adds one to ``var`` only when the step's summaries are recorded (a due step), as
    evaluating TF's summary op did, then advances the global step (TF's ``train_op``).
    """

    def step(state: TrainState) -> dict[str, Any]:
        if _record.current() is not None:
            state["var"] += 1.0
            for tag, factor in ops:
                summaries.scalar(tag, state["var"] * factor)
        return do_step(state)

    return step


def new_state() -> TrainState:
    return TrainState({"var": np.zeros((), dtype=np.float32)})


async def run(hook: Any, steps: int, clock: FakeClock | None = None, tick: float = 0.0) -> None:
    step = summary_op(("my_summary", 1.0))
    async with MonitoredSession(new_state(), hooks=[hook]) as sess:
        for _ in range(steps):
            await sess.run(step)
            if clock is not None:
                clock.value += tick


# -- SummarySaverHookTest -----------------------------------------------------------------------
def test_SummarySaverHookTest_test_raise_when_scaffold_and_summary_op_both_missing() -> None:
    # Difference: here a hook needs no summary op (the step records its own
    # summaries), so neither scaffold nor summary_op is required; the call TF
    # refused, with no argument at all, is still refused: it has no schedule.
    with pytest.raises(ValueError, match="exactly one of save_steps and save_secs"):
        summaries.SummarySaverHook()


def test_SummarySaverHookTest_test_raise_when_scaffold_and_summary_op_both_present() -> None:
    # Difference: a summary op has no equivalent here, so one is refused with what
    # to do instead, scaffold or not.
    with pytest.raises(ValueError, match="summary_op has no equivalent here"):
        summaries.SummarySaverHook(
            save_steps=1,
            output_dir="log/dir",
            scaffold=monitored.Scaffold(),
            summary_op="my_summary",
        )


def test_SummarySaverHookTest_test_raise_in_both_secs_and_steps(writer: Any) -> None:
    with pytest.raises(ValueError):
        summaries.SummarySaverHook(save_secs=10, save_steps=20, summary_writer=writer)


def test_SummarySaverHookTest_test_raise_in_none_secs_and_steps(writer: Any) -> None:
    with pytest.raises(ValueError):
        summaries.SummarySaverHook(save_secs=None, save_steps=None, summary_writer=writer)


async def test_SummarySaverHookTest_test_save_steps(writer: Any) -> None:
    await run(summaries.SummarySaverHook(save_steps=8, summary_writer=writer), 30)
    assert written(writer) == {
        1: {"my_summary": 1.0},
        9: {"my_summary": 2.0},
        17: {"my_summary": 3.0},
        25: {"my_summary": 4.0},
    }


async def test_SummarySaverHookTest_test_multiple_summaries(writer: Any) -> None:
    hook = summaries.SummarySaverHook(save_steps=8, summary_writer=writer)
    step = summary_op(("my_summary", 1.0), ("my_summary2", 2.0))
    async with MonitoredSession(new_state(), hooks=[hook]) as sess:
        for _ in range(10):
            await sess.run(step)
    assert written(writer) == {
        1: {"my_summary": 1.0, "my_summary2": 2.0},
        9: {"my_summary": 2.0, "my_summary2": 4.0},
    }


async def test_SummarySaverHookTest_test_save_secs_saving_once_every_step(
    writer: Any, clock: FakeClock
) -> None:
    # The clock moves between the runs: each run starts 0.5 s after the last write,
    # so each is due (the clock is read as the step starts, as TF1's before_run).
    await run(summaries.SummarySaverHook(save_secs=0.5, summary_writer=writer), 4, clock, 0.5)
    assert written(writer) == {
        1: {"my_summary": 1.0},
        2: {"my_summary": 2.0},
        3: {"my_summary": 3.0},
        4: {"my_summary": 4.0},
    }


async def test_SummarySaverHookTest_test_save_secs_saving_once_every_three_steps(
    writer: Any, clock: FakeClock
) -> None:
    await run(summaries.SummarySaverHook(save_secs=9.0, summary_writer=writer), 8, clock, 3.1)
    # 24.8 seconds passed (3.1 * 8); a write every 9 seconds from the first:
    assert written(writer) == {
        1: {"my_summary": 1.0},
        4: {"my_summary": 2.0},
        7: {"my_summary": 3.0},
    }


async def test_ResourceSummarySaverHookTest_test_save_steps(writer: Any) -> None:
    # TF's resource variables change nothing here: the same numbers as test_save_steps.
    await run(summaries.SummarySaverHook(save_steps=8, summary_writer=writer), 30)
    assert written(writer) == {
        1: {"my_summary": 1.0},
        9: {"my_summary": 2.0},
        17: {"my_summary": 3.0},
        25: {"my_summary": 4.0},
    }


# -- MonitoredTrainingSessionTest ---------------------------------------------------------------
def latest_tags(logdir: Path) -> list[str]:
    """The first tag of every summary event in ``logdir`` (TF's ``latest_summaries``)."""
    tags = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for event in summaries.summary_iterator(path):
            if event.summary.value:
                tags.append(event.summary.value[0].tag)
    return tags


def my_summary_step(state: TrainState) -> dict[str, Any]:
    """TF's ``new_gstep = assign_add(gstep, 1); scalar('my_summary_tag', new_gstep * 2)``."""
    state.global_step += 1
    summaries.scalar("my_summary_tag", state.global_step * 2)
    return {"global_step": state.global_step}


@pytest.fixture
def installed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MonitoredTrainingSession``'s summaries come from the installed plugin."""
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress")


async def test_MonitoredTrainingSessionTest_test_summaries_steps(
    tmp_path: Path, installed_plugins: None
) -> None:
    async with monitored.MonitoredTrainingSession(
        TrainState(),
        is_chief=True,
        checkpoint_dir=str(tmp_path),
        save_summaries_steps=100,
        log_step_count_steps=10,
    ) as session:
        for _ in range(101):
            await session.run(my_summary_step)
    tags = latest_tags(tmp_path)
    assert "my_summary_tag" in tags
    assert "global_step/sec" in tags


async def test_MonitoredTrainingSessionTest_test_summaries_secs(
    tmp_path: Path, installed_plugins: None
) -> None:
    import anyio

    async with monitored.MonitoredTrainingSession(
        TrainState(),
        is_chief=True,
        checkpoint_dir=str(tmp_path),
        save_summaries_steps=None,
        save_summaries_secs=0.1,
        log_step_count_steps=10,
    ) as session:
        await session.run(my_summary_step)
        await anyio.sleep(0.2)
        for _ in range(101):
            await session.run(my_summary_step)
    tags = latest_tags(tmp_path)
    assert "my_summary_tag" in tags
    assert "global_step/sec" in tags
