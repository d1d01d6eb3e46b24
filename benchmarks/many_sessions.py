"""Eight training sessions in one event loop against one alone (issue 33, section 3).

A session is a ``MonitoredTrainingSession(checkpoint_dir=...)`` with every
installed plugin at its defaults (checkpoint every ``--save-every`` steps,
summaries every 10 steps, NaN guard, progress, early stopping off), on a state
of the size of the digits MLP (64-128-10, float32, about 40 KB), whose step
awaits 2 ms of simulated device time (``anyio.sleep(0.002)``: the loop is free
meanwhile), touches the weights and returns a loss. Set-up and close are
included. Timed, in one process and in alternating order: one session alone,
and eight sessions in one task group (each with its own directory). The figure
of merit is the wall time of eight over one (target: at most 1.2; eight one
after another would take 8).

Usage::

    python benchmarks/many_sessions.py [--steps 500] [--repeats 5] [--sessions 8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import monitored


def _state() -> monitored.TrainState:
    rng = np.random.default_rng(0)
    return monitored.TrainState(
        {
            "w1": rng.standard_normal((64, 128)).astype(np.float32),
            "b1": np.zeros(128, np.float32),
            "w2": rng.standard_normal((128, 10)).astype(np.float32),
            "b2": np.zeros(10, np.float32),
        }
    )


async def _device_step(state: monitored.TrainState) -> dict[str, Any]:
    await anyio.sleep(0.002)  # the device computes; the loop is free meanwhile
    state["b2"] += np.float32(0.001)
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}


async def _session(directory: Path, steps: int, save_every: int) -> None:
    async with monitored.MonitoredTrainingSession(
        state=_state(),
        checkpoint_dir=str(directory),
        save_checkpoint_steps=save_every,
        save_checkpoint_secs=None,
        save_summaries_steps=10,
        save_summaries_secs=None,
        hooks=[monitored.StopAtStepHook(last_step=steps)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(_device_step)


async def _many(root: Path, count: int, steps: int, save_every: int) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(_session, root / f"s{i}", steps, save_every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    os.environ.setdefault("MONITORED_PROGRESS", "0")
    one: list[float] = []
    many: list[float] = []
    cpu_one: list[float] = []
    cpu_many: list[float] = []
    root = Path(tempfile.mkdtemp(prefix="monitored-many-", dir=args.dir))
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            anyio.run(_many, root / "warm", 2, 50, args.save_every)
            for r in range(args.repeats):
                runs = [("one", 1), ("many", args.sessions)]
                for label, count in runs if r % 2 == 0 else runs[::-1]:
                    directory = root / f"{r}-{label}"
                    c, w = time.process_time(), time.perf_counter()
                    anyio.run(_many, directory, count, args.steps, args.save_every)
                    (one if count == 1 else many).append(time.perf_counter() - w)
                    (cpu_one if count == 1 else cpu_many).append(time.process_time() - c)
                    shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}; load {os.getloadavg()[0]:.1f}"
    )
    ratios = [m / o for m, o in zip(many, one, strict=True)]
    print()
    print("| run | wall s (median, range) | CPU s (median) | wall / one alone (paired median) |")
    print("|---|--:|--:|--:|")
    print(
        f"| one session, {args.steps} steps | {statistics.median(one):.3f} "
        f"({min(one):.3f}-{max(one):.3f}) | {statistics.median(cpu_one):.3f} | 1.00 |"
    )
    print(
        f"| {args.sessions} sessions in one loop | {statistics.median(many):.3f} "
        f"({min(many):.3f}-{max(many):.3f}) | {statistics.median(cpu_many):.3f} | "
        f"**{statistics.median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )


if __name__ == "__main__":
    main()
