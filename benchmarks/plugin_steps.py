"""What the NaN guard, early stopping and progress cost per step, and a session's set-up (issue 33).

A trivial step (the global step incremented, a NumPy ``float32`` loss
returned) run by a bare loop and by ``MonitoredTrainingSession`` (no
checkpoint directory, no summaries, a ``StopAtStepHook``) with no installed
plugin, with each of ``nan_guard``, ``early_stopping`` (``monitor="loss"``,
checked every step) and ``progress`` (plain mode: standard output is
``/dev/null``) alone, and with the three. Each repeat runs every
configuration in turn; per configuration, a one-step session measures the
set-up and close, and a ``--steps`` session the rest. Thread CPU time (every
configuration runs on this thread); medians of the repeats.

The per-step figure is a session's CPU less its set-up and close, less the bare
loop's, over the steps; "over the core" subtracts the session without plugins
of the same repeat.

Usage::

    python benchmarks/plugin_steps.py [--steps 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import monitored

#: The installed plugins; those not measured are disabled.
ALL = sorted(info.name for info in monitored.installed_plugins(()))
CONFIGS: dict[str, tuple[str, ...]] = {
    "no plugin": (),
    "nan_guard": ("nan_guard",),
    "early_stopping": ("early_stopping",),
    "progress": ("progress",),
    "the three": ("nan_guard", "early_stopping", "progress"),
}
LOSS = np.float32(0.5)


def _state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros(4, np.float32)})


def _step(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": LOSS}


def bare(steps: int) -> None:
    state = _state()
    for _ in range(steps):
        _step(state)


async def session(steps: int, on: tuple[str, ...]) -> None:
    options = {"early_stopping": {"monitor": "loss", "patience": 10**9}}
    async with monitored.MonitoredTrainingSession(
        state=_state(),
        checkpoint_dir=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        plugin_options=options if "early_stopping" in on else {},
        hooks=[monitored.StopAtStepHook(last_step=steps)],
        disable_plugins=[p for p in ALL if p not in on],
    ) as sess:
        while not sess.should_stop():
            await sess.run(_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    clock = time.thread_time
    bare_cpu: list[float] = []
    setup: dict[str, list[float]] = {name: [] for name in CONFIGS}
    per_step: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        for on in CONFIGS.values():  # warm-up: imports, first plans
            anyio.run(session, 100, on)
        for _ in range(args.repeats):
            start = clock()
            bare(args.steps)
            bare_cpu.append(clock() - start)
            for name, on in CONFIGS.items():
                start = clock()
                anyio.run(session, 1, on)
                setup[name].append(clock() - start)
                start = clock()
                anyio.run(session, args.steps, on)
                total = clock() - start
                per_step[name].append((total - setup[name][-1] - bare_cpu[-1]) / args.steps)
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, NumPy {np.__version__}; load {os.getloadavg()[0]:.1f}"
    )
    print()
    print("| session | set-up and close, ms | µs/step over the bare loop | µs/step over the core |")
    print("|---|--:|--:|--:|")
    core = per_step["no plugin"]
    for name in CONFIGS:
        over_core = [s - c for s, c in zip(per_step[name], core, strict=True)]
        print(
            f"| {name} | {statistics.median(setup[name]) * 1e3:.2f} | "
            f"{statistics.median(per_step[name]) * 1e6:.2f} | "
            f"{statistics.median(over_core) * 1e6:.2f} |"
        )


if __name__ == "__main__":
    main()
