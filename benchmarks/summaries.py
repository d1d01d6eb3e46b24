"""Cost of ``monitored-summaries`` on the step loop, against baselines in the same run.

* **not due**: per-step cost of a ``MonitoredSession`` whose step calls
  ``summaries.scalar`` 10 times, with a ``SummarySaverHook`` that is not due
  (``save_steps`` = 10**9: only the first step writes), against the same loop
  and the same step with no summaries plugin at all, and against a step
  without the 10 calls. Blocks of 2 000 steps alternate between the three
  loops so a slow spell of the shared machine hits all of them; medians over
  the repeats.
* **due**: every step due, each recording 10 scalars and one histogram of a
  1M-element float32 array (TF's buckets), written to a temporary directory,
  against the same steps writing the same with ``tensorboardX.SummaryWriter``
  directly (``add_scalar`` x10, ``add_histogram(bins="tensorflow")``). Each
  contender's time includes the final ``flush``, so the work left to the
  writer's thread is counted too. Alternating repeats; medians.

Usage::

    python benchmarks/summaries.py [--repeats 7] [--due-steps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only the hooks given below

import anyio
import numpy as np
import tensorboardX

import monitored_summaries as summaries
from monitored import MonitoredSession, TrainState
from monitored_summaries import FileWriterCache, SummarySaverHook

BLOCK = 2000


def step_with_calls(state: TrainState) -> None:
    w = state["w"]
    np.subtract(w, 0.001, out=w)
    state.global_step += 1
    for i in range(10):
        summaries.scalar("loss", 0.5)
        del i


def step_plain(state: TrainState) -> None:
    w = state["w"]
    np.subtract(w, 0.001, out=w)
    state.global_step += 1


async def not_due(repeats: int, logdir: str) -> dict[str, list[float]]:
    """us/step of each loop, one figure per repeat."""
    sessions = {
        "plugin, step calls scalar x10": (
            MonitoredSession(
                TrainState({"w": np.ones(64, np.float32)}),
                hooks=[SummarySaverHook(save_steps=10**9, output_dir=logdir)],
            ),
            step_with_calls,
        ),
        "no plugin, step calls scalar x10": (
            MonitoredSession(TrainState({"w": np.ones(64, np.float32)})),
            step_with_calls,
        ),
        "no plugin, step without the calls": (
            MonitoredSession(TrainState({"w": np.ones(64, np.float32)})),
            step_plain,
        ),
    }
    results: dict[str, list[float]] = {name: [] for name in sessions}
    async with contextlib.AsyncExitStack() as stack:  # closed in reverse order
        for session, _ in sessions.values():
            await stack.enter_async_context(session)
        for _ in range(2):  # warm-up
            for session, fn in sessions.values():
                for _ in range(BLOCK):
                    await session.run(fn)
        for _ in range(repeats):
            totals = dict.fromkeys(sessions, 0.0)
            for _ in range(10):
                for name, (session, fn) in sessions.items():
                    run = session.run
                    start = time.perf_counter()
                    for _ in range(BLOCK):
                        await run(fn)
                    totals[name] += time.perf_counter() - start
            for name in sessions:
                results[name].append(totals[name] / (10 * BLOCK) * 1e6)
    FileWriterCache.clear()
    return results


async def due(repeats: int, steps: int, root: str) -> dict[str, list[float]]:
    """ms per due step (including the final flush), one figure per repeat."""
    rng = np.random.default_rng(0)
    big = rng.standard_normal(1 << 20).astype(np.float32)
    results: dict[str, list[float]] = {"monitored-summaries": [], "tensorboardX directly": []}

    def ours_step(state: TrainState) -> None:
        w = state["w"]
        np.multiply(w, 0.999, out=w)
        state.global_step += 1
        for i in range(10):
            summaries.scalar(f"s{i}", 0.5 + i)
        summaries.histogram("w", w)

    for r in range(repeats):
        # ours
        logdir = os.path.join(root, f"ours-{r}")
        state = TrainState({"w": big.copy()})
        hook = SummarySaverHook(save_steps=1, output_dir=logdir)
        start = time.perf_counter()
        async with MonitoredSession(state, hooks=[hook]) as session:
            for _ in range(steps):
                await session.run(ours_step)
        assert hook.writer is not None
        hook.writer.flush()
        results["monitored-summaries"].append((time.perf_counter() - start) / steps * 1e3)
        FileWriterCache.clear()
        # tensorboardX directly
        logdir = os.path.join(root, f"tbx-{r}")
        w = big.copy()
        writer = tensorboardX.SummaryWriter(logdir)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            np.multiply(w, 0.999, out=w)
            for i in range(10):
                writer.add_scalar(f"s{i}", 0.5 + i, step)
            writer.add_histogram("w", w, step, bins="tensorflow")
        writer.flush()
        results["tensorboardX directly"].append((time.perf_counter() - start) / steps * 1e3)
        writer.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--due-steps", type=int, default=20)
    args = parser.parse_args()
    print(
        f"Machine: {os.cpu_count()} CPUs, {platform.machine()}, {platform.system()} "
        f"{platform.release()}, CPython {platform.python_version()}; numpy {np.__version__}, "
        f"tensorboardX {tensorboardX.__version__}; load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as root:
        nd = anyio.run(not_due, args.repeats, os.path.join(root, "not-due"))
        base = statistics.median(nd["no plugin, step calls scalar x10"])
        plain = statistics.median(nd["no plugin, step without the calls"])
        print("\nSteps that are not due (us/step, median of repeats; 10 scalar calls per step)\n")
        print("| loop | us/step | over 'no plugin, same step' | over 'step without calls' |")
        print("|---|--:|--:|--:|")
        for name, values in nd.items():
            m = statistics.median(values)
            print(f"| {name} | {m:.2f} | {m - base:+.2f} | {m - plain:+.2f} |")
        paired = [
            a - b
            for a, b in zip(
                nd["plugin, step calls scalar x10"],
                nd["no plugin, step calls scalar x10"],
                strict=True,
            )
        ]
        print(
            f"\nPlugin's cost per step that is not due: median {statistics.median(paired):+.2f} us "
            f"(paired over repeats, min {min(paired):+.2f}, max {max(paired):+.2f}); "
            "target <= 0.5 us"
        )
        d = anyio.run(due, args.repeats, args.due_steps, os.path.join(root, "due"))
        ours = statistics.median(d["monitored-summaries"])
        tbx = statistics.median(d["tensorboardX directly"])
        print(
            f"\nDue steps: 10 scalars + histogram of 1M float32 ({args.due_steps} steps + flush)\n"
        )
        print("| writer | ms/step (median) | min - max | x tensorboardX |")
        print("|---|--:|--:|--:|")
        for name, values in d.items():
            m = statistics.median(values)
            print(f"| {name} | {m:.2f} | {min(values):.2f} - {max(values):.2f} | {m / tbx:.2f} |")
        print(f"\nRatio {ours / tbx:.2f}x; target <= 1.2x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
