"""Resume shows one curve: kill a real training process, resume from its checkpoint.

The first run trains to step 10 with a checkpoint at step 6 and summaries at
every step, flushes, and is killed with SIGKILL; the second resumes from step 6
to step 15. TensorBoard's own ``EventAccumulator`` (purge of orphaned data on)
must then show every tag once per step, and the second run's values after 6.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")

CHILD = textwrap.dedent(
    """
    import sys, time
    import anyio
    import numpy as np
    import monitored_summaries as summaries
    from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState

    directory, run, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def init(state):
        state["w"] = np.zeros(4)

    def step(state):
        state.global_step += 1
        state["w"] += 1.0
        summaries.scalar("loss", 1000.0 * run + state.global_step)
        summaries.histogram("w", state["w"] + run)
        return {"accuracy": np.float32(run)}

    async def main():
        state = TrainState({"w": np.zeros(4)})
        async with MonitoredTrainingSession(
            state,
            checkpoint_dir=directory,
            save_checkpoint_steps=6,
            save_summaries_steps=1,
            hooks=[StopAtStepHook(last_step=last)],
            log_step_count_steps=2,
        ) as s:
            print("started", state.global_step, flush=True)
            while not s.should_stop():
                await s.run(step)
                if run == 1 and state.global_step == last - 1:
                    break
            if run == 1:
                # The checkpoint of step 6 is written in the background (listening
                # to saves does not make them wait): wait until it is on disk.
                from monitored_checkpoint import latest_checkpoint
                deadline = time.monotonic() + 60
                while not (latest_checkpoint(directory) or "").endswith("-6"):
                    assert time.monotonic() < deadline, "the checkpoint of step 6 never came"
                    time.sleep(0.01)
                # Every point of steps 1..10 is on disk; then the process dies.
                from monitored_summaries import FileWriterCache
                FileWriterCache.get(directory).flush()
                print("flushed", state.global_step, flush=True)
                time.sleep(600)

    anyio.run(main)
    """
)


def run_child(script: Path, directory: Path, run: int, last: int) -> list[str]:
    child = subprocess.Popen(
        [sys.executable, "-u", str(script), str(directory), str(run), str(last)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = []
    try:
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("flushed"):
                child.send_signal(signal.SIGKILL)
                break
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if run == 1:
        assert child.returncode == -signal.SIGKILL, err
    else:
        assert child.returncode == 0, err
    return lines


def test_resume_after_kill_shows_one_curve(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    directory = tmp_path / "run"
    first = run_child(script, directory, run=1, last=11)
    assert first == ["started 0", "flushed 10"]
    second = run_child(script, directory, run=2, last=15)
    assert second == ["started 6"], "resumed from the checkpoint of step 6"

    accumulator = EventAccumulator(
        str(directory),
        size_guidance={"scalars": 0, "histograms": 0},  # keep every point
        purge_orphaned_data=True,
    )
    accumulator.Reload()
    tags = accumulator.Tags()
    assert {"loss", "global_step/sec"} <= set(tags["scalars"])
    assert "w" in tags["histograms"]
    for tag in tags["scalars"]:
        steps = [e.step for e in accumulator.Scalars(tag)]
        assert len(steps) == len(set(steps)), f"{tag}: a step appears twice: {steps}"
    loss = {e.step: e.value for e in accumulator.Scalars("loss")}
    assert sorted(loss) == list(range(1, 16))
    assert all(loss[s] == 1000 + s for s in range(1, 7)), "the first run up to its checkpoint"
    assert all(loss[s] == 2000 + s for s in range(7, 16)), "the second run after step 6"
    histograms = {e.step: e.histogram_value.max for e in accumulator.Histograms("w")}
    assert sorted(histograms) == list(range(1, 16))
    assert all(histograms[s] == s + (1 if s <= 6 else 2) for s in histograms)
