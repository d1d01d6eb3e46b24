"""A resumed run's points are never hidden, whatever the wall clock did (``_naming``).

The first run trains to step 20 and ends; the second resumes with its wall
clock one hour behind (``time.time`` shifted in the child, as after a VM
snapshot restore or an NTP step) and trains to step 40. TensorBoard's own
readers must show all 40 points, once each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator

from monitored_summaries._naming import event_file_name, next_stamp

CHILD = textwrap.dedent(
    """
    import sys, time
    shift = float(sys.argv[3])
    if shift:
        real = time.time
        time.time = lambda: real() + shift
        real_ns = time.time_ns
        time.time_ns = lambda: real_ns() + int(shift * 1e9)
    import anyio
    import numpy as np
    import monitored_summaries as summaries
    from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState

    directory, last = sys.argv[1], int(sys.argv[2])

    def step(state):
        state.global_step += 1
        summaries.scalar("loss", float(state.global_step))

    async def main():
        state = TrainState({"w": np.zeros(2)})
        async with MonitoredTrainingSession(
            state,
            checkpoint_dir=directory,
            save_checkpoint_steps=5,
            save_summaries_steps=1,
            hooks=[StopAtStepHook(last_step=last)],
            log_step_count_steps=None,
        ) as s:
            while not s.should_stop():
                await s.run(step)

    anyio.run(main)
    """
)


def _train(directory: Path, last: int, shift: float) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MONITORED_PLUGIN_OPTIONS"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), str(last), str(shift)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("shift", [-3600.0, 0.0])
def test_a_resume_with_the_clock_set_back_shows_every_point(tmp_path: Path, shift: float) -> None:
    _train(tmp_path, 20, 0.0)
    _train(tmp_path, 40, shift)
    files = sorted(p.name for p in tmp_path.iterdir() if "tfevents" in p.name)
    assert len(files) == 2
    acc = event_accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("loss")]
    assert steps == list(range(1, 41))
    # The reader TensorBoard's data server path uses too (scalars as tensors).
    plugin_acc = plugin_event_accumulator.EventAccumulator(str(tmp_path))
    plugin_acc.Reload()
    assert [e.step for e in plugin_acc.Tensors("loss")] == list(range(1, 41))


def test_names_follow_the_directory_not_the_clock() -> None:
    names = ["events.out.tfevents.1700000000.host.x", "checkpoint", "events.out.tfevents.bad"]
    assert next_stamp(names, 1600000000.5) == 1700000001
    assert next_stamp(names, 1800000000.5) == 1800000000
    assert next_stamp([], 1600000000.9) == 1600000000
    name = event_file_name(names, 1600000000.0, ".suffix")
    assert name.startswith("events.out.tfevents.1700000001.")
    assert name.endswith(".suffix")
    assert sorted([names[0], name])[-1] == name
