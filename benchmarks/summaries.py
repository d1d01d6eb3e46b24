"""Cost of ``monitored-summaries`` on the step loop, against baselines in the same run.

* **not due**: per-step cost of a ``MonitoredSession`` whose step calls
  ``summaries.scalar`` 10 times, with a ``SummarySaverHook`` that is not due
  (``save_steps`` = 10**9, or ``save_secs`` = 10**9: only the first step
  writes), against the same loop and the same step with no summaries plugin
  at all, and against a step without the 10 calls. A second, identical
  no-plugin loop is the A/A control: its paired difference from the first is
  pure noise, so the spread of the plugin's difference can be compared with
  it. Blocks of 2 000 steps alternate between the loops so a slow spell of
  the shared machine hits all of them; medians over the repeats. The first
  steps of each session (the first write, the warm-up) are run before timing
  starts and reported apart: the mean of the first 2 000 steps.
* **the hook's calls alone**: the plugin's whole cost on a step that is not
  due is one call of ``SummarySaverHook.after_run`` (``save_steps``), or one
  ``before_run`` reading the clock and one ``after_run`` (``save_secs``: the
  clock is read as the step starts, as TF1's); timed here directly (a million
  steps' calls, best of the repeats, minus the same loop calling as many no-op
  methods), a figure the machine's noise barely moves.
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
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

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
        "plugin (save_steps), step calls scalar x10": (
            MonitoredSession(
                TrainState({"w": np.ones(64, np.float32)}),
                hooks=[SummarySaverHook(save_steps=10**9, output_dir=logdir)],
            ),
            step_with_calls,
        ),
        "plugin (save_secs), step calls scalar x10": (
            MonitoredSession(
                TrainState({"w": np.ones(64, np.float32)}),
                hooks=[SummarySaverHook(save_secs=10**9, output_dir=logdir)],
            ),
            step_with_calls,
        ),
        "no plugin, step calls scalar x10": (
            MonitoredSession(TrainState({"w": np.ones(64, np.float32)})),
            step_with_calls,
        ),
        "A/A control: the same again": (
            MonitoredSession(TrainState({"w": np.ones(64, np.float32)})),
            step_with_calls,
        ),
        "no plugin, step without the calls": (
            MonitoredSession(TrainState({"w": np.ones(64, np.float32)})),
            step_plain,
        ),
    }
    results: dict[str, list[float]] = {name: [] for name in sessions}
    first: dict[str, list[float]] = {name: [] for name in sessions}
    async with contextlib.AsyncExitStack() as stack:  # closed in reverse order
        for session, _ in sessions.values():
            await stack.enter_async_context(session)
        for _ in range(2):  # warm-up; the first block of each session is reported apart
            for name, (session, fn) in sessions.items():
                start = time.perf_counter()
                for _ in range(BLOCK):
                    await session.run(fn)
                if not first[name]:
                    first[name].append((time.perf_counter() - start) / BLOCK * 1e6)
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
    for name, values in first.items():
        results[f"{name} [first {BLOCK} steps]"] = values
    return results


class _Capture:
    """Keeps the last step's run context and values, to call a hook with them later."""

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.args = (run_context, run_values)

    def noop(self, run_context: Any, run_values: Any) -> None:
        return None

    def noop_before(self, run_context: Any) -> None:
        return None


async def after_run_alone(repeats: int, logdir: str) -> dict[str, float]:
    """ns per not-due step of the hook's calls (``before_run`` where it has one, then
    ``after_run``), minus as many no-op calls: best of ``repeats``."""
    out: dict[str, float] = {}
    for name, kwargs in (("save_steps", {"save_steps": 10**9}), ("save_secs", {"save_secs": 1e9})):
        hook = SummarySaverHook(output_dir=logdir, **kwargs)
        capture = _Capture()
        state = TrainState({"w": np.ones(64, np.float32)})
        async with MonitoredSession(state, hooks=[hook, capture]) as session:
            for _ in range(3):
                await session.run(step_plain)
            args = capture.args
            n = 1_000_000
            best = {"hook": math.inf, "noop": math.inf}
            before = getattr(hook, "before_run", None)
            calls = {
                "hook": (before, hook.after_run),
                "noop": (capture.noop_before if before else None, capture.noop),
            }
            context = args[0]
            for _ in range(repeats):
                for label, (first, then) in calls.items():
                    start = time.perf_counter()
                    if first is None:
                        for _ in range(n):
                            then(*args)
                    else:
                        for _ in range(n):
                            first(context)
                            then(*args)
                    best[label] = min(best[label], (time.perf_counter() - start) / n * 1e9)
        out[name] = best["hook"] - best["noop"]
    FileWriterCache.clear()
    return out


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
        first = {k: v for k, v in nd.items() if k.endswith("steps]")}
        nd = {k: v for k, v in nd.items() if k not in first}
        baseline = "no plugin, step calls scalar x10"
        base = statistics.median(nd[baseline])
        plain = statistics.median(nd["no plugin, step without the calls"])
        print("\nSteps that are not due (us/step, median of repeats; 10 scalar calls per step)\n")
        print("| loop | us/step | over 'no plugin, same step' | over 'step without calls' |")
        print("|---|--:|--:|--:|")
        for name, values in nd.items():
            m = statistics.median(values)
            print(f"| {name} | {m:.2f} | {m - base:+.2f} | {m - plain:+.2f} |")
        print(f"\nDifference from '{baseline}', paired over the {args.repeats} repeats (us/step)\n")
        print("| loop | median | min | max | max - min |")
        print("|---|--:|--:|--:|--:|")
        for name in (
            "plugin (save_steps), step calls scalar x10",
            "plugin (save_secs), step calls scalar x10",
            "A/A control: the same again",
        ):
            paired = [a - b for a, b in zip(nd[name], nd[baseline], strict=True)]
            print(
                f"| {name} | {statistics.median(paired):+.2f} | {min(paired):+.2f} | "
                f"{max(paired):+.2f} | {max(paired) - min(paired):.2f} |"
            )
        print("\nTarget: the plugin's median <= +0.5 us over the same loop without it.")
        print(f"\nThe first {BLOCK} steps of each session (us/step, mean; one sample each):\n")
        for name, values in first.items():
            print(f"- {name}: {values[0]:.2f}")
        alone = anyio.run(after_run_alone, args.repeats, os.path.join(root, "alone"))
        print(
            "\nThe hook's calls on a not-due step alone (ns per step over as many no-op calls,"
            " best of repeats)\n"
        )
        for name, ns in alone.items():
            print(f"- {name}: {ns:.0f} ns")
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
