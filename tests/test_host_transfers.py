"""What a default install reads from the device, step by step (docs/performance.md).

A full default session (every plugin package installed and loaded, in a
``MonitoredTrainingSession`` with checkpoints and summaries) trains a state held
on the stand-in CuPy of ``tests/_standin_device.py`` for 1,000 steps. Every
device-to-host copy is recorded with the step it was issued in and whether the
host waited for it, and every wait for an event with the step the event was
recorded in: a wait for an event of an earlier step is for work that has
normally long finished, a wait for one of the same step stalls the loop.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _standin_device import StandinCupy

import monitored
from monitored_nan_guard import NanTensorHook

STEPS = 1000
SAVE_EVERY = 250


@dataclass
class Record:
    """Host reads by step: step 0 is the session's start, ``STEPS + 1`` its close."""

    step: int = 0
    #: (step, blocking) of every device-to-host copy.
    copies: list[tuple[int, bool]] = field(default_factory=list)
    #: (step waited in, step the event was recorded in) of every event waited for.
    waits: list[tuple[int, int]] = field(default_factory=list)

    def blocking(self) -> collections.Counter[int]:
        return collections.Counter(step for step, blocking in self.copies if blocking)

    def started(self) -> collections.Counter[int]:
        return collections.Counter(step for step, blocking in self.copies if not blocking)


@pytest.fixture
def record(standin_cupy: StandinCupy, monkeypatch: pytest.MonkeyPatch) -> Iterator[Record]:
    """Record copies and event waits of the stand-in CuPy, by the step they happen in."""
    cupy = standin_cupy.module
    record = Record()
    get, event_record = cupy.ndarray._get, cupy.cuda.Event.record
    synchronize = cupy.cuda.Event.synchronize

    def recording_get(
        self: Any, kind: str, stream: Any, order: str, out: Any, blocking: bool
    ) -> Any:
        record.copies.append((record.step, blocking))
        return get(self, kind, stream, order, out, blocking)

    def recording_record(self: Any, stream: Any = None) -> None:
        self.recorded_in = record.step
        event_record(self, stream)

    def recording_synchronize(self: Any) -> None:
        record.waits.append((record.step, getattr(self, "recorded_in", -1)))
        synchronize(self)

    monkeypatch.setattr(cupy.ndarray, "_get", recording_get)
    monkeypatch.setattr(cupy.cuda.Event, "record", recording_record)
    monkeypatch.setattr(cupy.cuda.Event, "synchronize", recording_synchronize)
    return record


def _step(state: monitored.TrainState) -> dict[str, Any]:
    w = state["w"]
    w *= 0.999
    state.global_step += 1
    return {"loss": (w * w).sum()}  # a 0-d device array


async def _train(
    standin_cupy: StandinCupy, record: Record, tmp_path: Path, **kwargs: Any
) -> monitored.MonitoredSession:
    state = monitored.TrainState({"w": standin_cupy.module.ones(1000, dtype="float32")})
    async with monitored.MonitoredTrainingSession(
        state, checkpoint_dir=str(tmp_path), save_checkpoint_steps=SAVE_EVERY, **kwargs
    ) as sess:
        for step in range(1, STEPS + 1):
            record.step = step
            await sess.run(_step)
        record.step = STEPS + 1
    return sess


async def test_a_default_install_never_waits_for_the_step_it_runs(
    standin_cupy: StandinCupy, record: Record, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    sess = await _train(standin_cupy, record, tmp_path)
    loaded = {info.name for info in sess.plugins}
    assert {"checkpoint", "summaries", "nan_guard", "early_stopping", "progress", "mpi"} <= loaded

    saves = {0, *range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)}  # the first at the start
    blocking = record.blocking()
    # A step where nothing is due waits for no transfer; a checkpoint save reads its
    # one array (w) with one blocking copy.
    assert {step: blocking[step] for step in range(STEPS + 1)} == {
        step: 1 if step in saves else 0 for step in range(STEPS + 1)
    }
    # The NaN guard's loss: one copy per step, started without waiting ...
    assert record.started() == dict.fromkeys(range(1, STEPS + 1), 1)
    # ... and collected at the next step (or at the close, for the last step), by
    # waiting for the event of the step before: never for the step being run.
    assert record.waits == [(step + 1, step) for step in range(1, STEPS + 1)]


async def test_an_explicit_tf1_nan_tensor_hook_checks_each_loss_in_its_step(
    standin_cupy: StandinCupy, record: Record, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "nan_guard")
    await _train(standin_cupy, record, tmp_path, hooks=[NanTensorHook("loss")])
    saves = {0, *range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)}
    blocking = record.blocking()
    # TF1's same-step check: the loss comes to the host in its own step, waited for.
    assert {step: blocking[step] for step in range(STEPS + 1)} == {
        step: (1 if step else 0) + (1 if step in saves else 0) for step in range(STEPS + 1)
    }
    assert not record.started()
    assert not record.waits
