"""Per-step cost of the ``Supervisor``'s services against a bare ``MonitoredSession``.

Three sessions over the same kind of state, open at the same time in one event
loop, take turns in blocks of ``--block`` steps, in a rotating order (so a slow
spell of the shared machine hits all alike):

* ``MonitoredSession`` with no hook (the baseline);
* ``Supervisor(logdir=None)``: no services, the same session underneath;
* ``Supervisor(logdir=tmp)`` with TF1's defaults: the checkpoint hook (every
  600 s) and the summary hook (every 120 s) plus the summary and step-counter
  tasks. No save is due while timing, so this is what the services cost on the
  steps where they do nothing — nearly every step.

The step is a trivial sync function (``w += 1`` on 3 floats), so the figures are
the runner's and the services' own cost. Installed plugins are not autoloaded.
Reports the median µs/step over repeats and each row's ratio to the baseline.

Usage::

    python benchmarks/supervisor.py [--steps N] [--block B] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"

import monitored


def step(state: monitored.TrainState) -> None:
    state["w"] += 1.0
    state.global_step += 1


def new_state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros(3)})


async def measure(steps: int, block: int, logdir: str) -> dict[str, float]:
    rows: dict[str, Callable[[], Any]] = {
        "MonitoredSession, no hooks (baseline)": lambda: monitored.MonitoredSession(new_state()),
        "Supervisor(logdir=None)": lambda: monitored.Supervisor(new_state()).managed_session(),
        "Supervisor(logdir=...), default services": lambda: monitored.Supervisor(
            new_state(), logdir=logdir
        ).managed_session(),
    }
    managers = {name: make() for name, make in rows.items()}
    sessions = {name: await cm.__aenter__() for name, cm in managers.items()}
    spent = dict.fromkeys(rows, 0.0)
    try:
        for session in sessions.values():  # warm up
            for _ in range(block):
                await session.run(step)
        done, order = 0, list(sessions.items())
        while done < steps:
            order = order[1:] + order[:1]  # a rotating order: no row always runs first
            for name, session in order:
                started = time.perf_counter()
                for _ in range(block):
                    await session.run(step)
                spent[name] += time.perf_counter() - started
            done += block
    finally:
        for cm in reversed(managers.values()):  # task groups close in reverse order
            await cm.__aexit__(None, None, None)
    return {name: total / done * 1e6 for name, total in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as logdir:
            for name, us in anyio.run(measure, args.steps, args.block, logdir).items():
                results.setdefault(name, []).append(us)
    baseline = statistics.median(next(iter(results.values())))
    print(f"python {sys.version.split()[0]}, {args.repeats} repeats of {args.steps} steps")
    print("| configuration | µs/step (median) | min-max | ratio to baseline |")
    print("| --- | ---: | ---: | ---: |")
    for name, values in results.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median:.1f} | {min(values):.1f}-{max(values):.1f} "
            f"| {median / baseline:.2f}x |"
        )


if __name__ == "__main__":
    main()
