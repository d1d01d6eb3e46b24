"""The evaluations of one process append to one event file per directory.

An evaluation's writer is given back open (``FileWriterCache.release(keep_open=True)``)
and the next evaluation of the directory takes it again, unless another writer's file
sorts after it; unused, it is closed after ``idle_close_secs``.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import monitored
from monitored import TrainState, evaluate_once
from monitored_summaries import FileWriter, FileWriterCache

pytestmark = pytest.mark.anyio


def _eval_step(state: TrainState, batch: Any, metrics: dict[str, Any]) -> None:
    metrics["mean"].update(np.asarray(batch, dtype=np.float64) + state.global_step)


def _event_files(directory: Path) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))


async def test_n_evaluations_in_one_process_write_one_event_file(tmp_path: Path) -> None:
    eval_dir = tmp_path / "eval"
    state = TrainState()
    for step in range(1, 6):
        state.global_step = step
        await evaluate_once(
            _eval_step,
            {"mean": monitored.metrics.Mean()},
            input=[[1.0, 3.0]],
            state=state,
            summary_dir=eval_dir,
        )
    assert len(_event_files(eval_dir)) == 1, _event_files(eval_dir)
    accumulator = EventAccumulator(str(eval_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    points = {e.step: e.value for e in accumulator.Scalars("mean")}
    assert points == {step: 2.0 + step for step in range(1, 6)}


async def test_a_newer_file_in_the_directory_gets_the_next_evaluation_a_new_file(
    tmp_path: Path,
) -> None:
    eval_dir = tmp_path / "eval"
    state = TrainState()

    async def evaluate(step: int) -> None:
        state.global_step = step
        await evaluate_once(
            _eval_step,
            {"mean": monitored.metrics.Mean()},
            input=[[0.0]],
            state=state,
            summary_dir=eval_dir,
        )

    await evaluate(1)
    (first,) = _event_files(eval_dir)
    FileWriter(eval_dir).close()  # another writer's file, sorting after the first
    await evaluate(2)
    files = _event_files(eval_dir)
    assert len(files) == 3
    assert files[0] == first
    accumulator = EventAccumulator(str(eval_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("mean")] == [1, 2]


def test_a_writer_kept_open_is_closed_when_idle_and_training_writers_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = FileWriterCache.acquire(tmp_path / "eval")
    FileWriterCache.release(kept, keep_open=True)
    assert not kept.closed
    assert FileWriterCache.acquire(tmp_path / "eval") is kept, "taken again by the next"
    monkeypatch.setattr(FileWriterCache, "idle_close_secs", 0.05)
    FileWriterCache.release(kept, keep_open=True)
    deadline = time.monotonic() + 60
    while not kept.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kept.closed, "an idle writer is closed"
    assert FileWriterCache.acquire(tmp_path / "eval") is not kept
    plain = FileWriterCache.acquire(tmp_path / "train")
    FileWriterCache.release(plain)
    assert plain.closed, "without keep_open the last release closes it"
