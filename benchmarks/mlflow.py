"""Cost of ``monitored-mlflow`` on the step loop, against the same loop without it, in one run.

* **not due**: per-step cost of a ``MonitoredSession`` with an ``MlflowHook``
  that is never due (``log_every_n_steps`` = 10**9), against the same loop and
  the same step (which returns 10 scalars) with no hook; a second identical
  no-hook loop is the A/A control (its difference from the first is pure
  noise). Blocks of 2 000 steps alternate between the loops so a slow spell of
  the shared machine hits all of them; medians over the repeats. Timing starts
  once the hook's sender process has imported MLflow and created its run (a
  one-off of seconds, in that process, reported apart).
* **the hook's call alone**: on a step that is not due the plugin's whole cost
  is one call of ``MlflowHook.after_run``; timed directly (a million calls,
  best of the repeats, minus as many no-op calls).
* **due, alone**: a due ``after_run`` (10 scalars converted and queued),
  timed directly while the sender works, minus a no-op call; median.
* **shipping**: what the hook's thread does with a due step's record once a
  ``flush_secs``, holding the GIL for the pickling: ``pickle`` and write to a
  pipe (here ``/dev/null``), per record, median.
* **due, in the loop**: a step due every 10 steps, its 10
  scalars queued, shipped by the hook's thread to the sender process, which
  sends them to a local SQLite store with ``log_batch`` while the loop goes on,
  against the same loop without the hook and an A/A control; alternating
  blocks of 20 000 steps, 10 rounds a repeat (so that each repeat spans
  several ``flush_secs``, and its mean holds the bursts of shipping and
  sending in proportion), paired medians over the repeats. This figure
  includes everything the sending takes from the loop: the shipping thread's
  share of the GIL, and the sender process's share of the machine's cores.

Comparing designs: ``PYTHONPATH=DIR`` with an older ``monitored_mlflow`` package
copied into ``DIR`` runs the same benchmark against it (the figures in
``docs/performance.md`` for the thread sender were taken so).

Usage::

    python benchmarks/mlflow.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only the hooks given below
# Run as a script, this file's directory comes first on sys.path, and this file would
# be imported as `mlflow` by the hook's sender.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from monitored import MonitoredSession, TrainState  # noqa: E402
from monitored_mlflow import MlflowHook  # noqa: E402

BLOCK = 2000
DUE_BLOCK = 20_000
SCALARS = [f"metric_{i}" for i in range(10)]


def step(state: TrainState) -> dict[str, Any]:
    w = state["w"]
    np.subtract(w, 0.001, out=w)
    state.global_step += 1
    return {name: np.float32(0.5) for name in SCALARS}


async def wait_for_run(hook: MlflowHook) -> float:
    """Seconds until the hook's sender has its run (MLflow imported, run created)."""
    start = time.perf_counter()
    with anyio.fail_after(300):
        while hook.sender is None or hook.sender.run_id is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    return time.perf_counter() - start


async def alternate(
    repeats: int, sessions: dict[str, MonitoredSession], block: int = BLOCK, rounds: int = 5
) -> dict[str, list[float]]:
    """us/step of each open session, blocks alternating, one figure per repeat."""
    results: dict[str, list[float]] = {name: [] for name in sessions}
    for session in sessions.values():  # warm-up
        for _ in range(block):
            await session.run(step)
    for _ in range(repeats):
        totals = dict.fromkeys(sessions, 0.0)
        for _ in range(rounds):
            for name, session in sessions.items():
                run = session.run
                start = time.perf_counter()
                for _ in range(block):
                    await run(step)
                totals[name] += time.perf_counter() - start
        for name in sessions:
            results[name].append(totals[name] / (rounds * block) * 1e6)
    return results


def state() -> TrainState:
    return TrainState({"w": np.ones(64, np.float32)})


async def not_due(repeats: int, root: str) -> tuple[dict[str, list[float]], float]:
    hook = MlflowHook(f"sqlite:///{root}/not-due.db", log_every_n_steps=10**9)
    sessions = {
        "MlflowHook, not due": MonitoredSession(state(), hooks=[hook]),
        "no hook": MonitoredSession(state()),
        "A/A control: no hook again": MonitoredSession(state()),
    }
    async with contextlib.AsyncExitStack() as stack:
        for session in sessions.values():
            await stack.enter_async_context(session)
        await sessions["MlflowHook, not due"].run(step)
        ready = await wait_for_run(hook)
        results = await alternate(repeats, sessions)
    return results, ready


class _Capture:
    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.args = (run_context, run_values)

    def noop(self, run_context: Any, run_values: Any) -> None:
        return None


async def after_run_alone(repeats: int, root: str) -> float:
    """ns per not-due call of ``MlflowHook.after_run``, minus a no-op call: best of repeats."""
    hook = MlflowHook(f"sqlite:///{root}/alone.db", log_every_n_steps=10**9)
    capture = _Capture()
    async with MonitoredSession(state(), hooks=[hook, capture]) as session:
        for _ in range(3):
            await session.run(step)
        await wait_for_run(hook)
        args = capture.args
        n = 1_000_000
        best = {"hook": math.inf, "noop": math.inf}
        for _ in range(repeats):
            for label, call in (("hook", hook.after_run), ("noop", capture.noop)):
                start = time.perf_counter()
                for _ in range(n):
                    call(*args)
                best[label] = min(best[label], (time.perf_counter() - start) / n * 1e9)
    return best["hook"] - best["noop"]


async def due_alone(repeats: int, root: str) -> tuple[float, float, int]:
    """us per due ``after_run`` (10 scalars queued) while the sender sends, minus a no-op
    call: median of repeats of 1 000 calls (the sender, which wakes once per
    ``flush_secs``, drains between them); then the close's flush (s) and points sent."""
    hook = MlflowHook(f"sqlite:///{root}/due.db", log_every_n_steps=1)
    capture = _Capture()
    session = MonitoredSession(state(), hooks=[hook, capture])
    figures: list[float] = []
    async with session:
        for _ in range(3):
            await session.run(step)
        await wait_for_run(hook)
        args = capture.args
        n = 1_000
        for _ in range(repeats):
            await anyio.sleep(1.5)  # the sender sends what is pending, then lingers
            timings = {}
            for label, call in (("hook", hook.after_run), ("noop", capture.noop)):
                start = time.perf_counter()
                for _ in range(n):
                    hook._next_due = 0  # every call due, as on a due step
                    call(*args)
                timings[label] = (time.perf_counter() - start) / n * 1e6
            figures.append(timings["hook"] - timings["noop"])
        flush = time.perf_counter()
    flush = time.perf_counter() - flush
    assert hook.sender is not None
    return statistics.median(figures), flush, hook.sender.sent


async def due_every(
    repeats: int, root: str, every: int
) -> tuple[dict[str, list[float]], float, int, int]:
    """The loop with a due step every ``every`` steps (sender running), against no hook
    and an A/A control; then the close's flush (s), points sent and dropped."""
    hook = MlflowHook(f"sqlite:///{root}/due-{every}.db", log_every_n_steps=every)
    hooked = MonitoredSession(state(), hooks=[hook])
    others = {
        "no hook": MonitoredSession(state()),
        "A/A control: no hook again": MonitoredSession(state()),
    }
    async with contextlib.AsyncExitStack() as stack:
        for session in others.values():
            await stack.enter_async_context(session)
        async with hooked:
            await hooked.run(step)
            await wait_for_run(hook)
            sessions = {f"MlflowHook, due every {every} steps": hooked, **others}
            # Each repeat spans several flush_secs (1 s): its mean holds the shipping
            # and the sender process's bursts in proportion.
            results = await alternate(repeats, sessions, block=DUE_BLOCK, rounds=10)
            flush = time.perf_counter()
        flush = time.perf_counter() - flush
    assert hook.sender is not None
    return results, flush, hook.sender.sent, hook.sender.dropped


def shipping(repeats: int) -> float | None:
    """us per due step's record (10 scalars) that the hook's thread pickles and writes
    to the sender process's pipe (here /dev/null), holding the GIL for the pickling:
    median of repeats of one flush's worth (10 000 records). ``None`` for a
    ``monitored_mlflow`` without a sender process."""
    try:
        from monitored_mlflow._writer import write_frame
    except ImportError:
        return None
    records = [
        (step, 1_700_000_000_000 + step, {name: step + i / 10 for i, name in enumerate(SCALARS)})
        for step in range(10_000)
    ]
    figures = []
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            write_frame(fd, ("items", records, []))
            figures.append((time.perf_counter() - start) / len(records) * 1e6)
    finally:
        os.close(fd)
    return statistics.median(figures)


def children_cpu() -> float:
    """CPU seconds of this process's ended child processes (the sender processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as root:
        results, ready = anyio.run(not_due, args.repeats, root)
        base = results["no hook"]
        print(f"\nnot due (us/step, median of {args.repeats}; run ready after {ready:.1f} s):")
        for name, values in results.items():
            print(f"  {name:45s} {median(values):8.3f}")
        for name in ("MlflowHook, not due", "A/A control: no hook again"):
            diffs = [a - b for a, b in zip(results[name], base, strict=True)]
            print(f"  {name + ' - no hook':45s} {median(diffs):+8.3f}  (paired median)")
        alone = anyio.run(after_run_alone, args.repeats, root)
        print(f"\nMlflowHook.after_run, not due, alone: {alone:.0f} ns/step (best of repeats)")
        cost, flush, sent = anyio.run(due_alone, args.repeats, root)
        print(
            f"\nMlflowHook.after_run, due (10 scalars queued), alone: {cost:.2f} us/due step "
            f"(median); close flushed in {flush:.2f} s, {sent} points sent"
        )
        shipped = shipping(args.repeats)
        if shipped is not None:
            print(
                f"\nshipping a due step's record to the sender process (pickle and write, "
                f"in the hook's thread): {shipped:.2f} us/due step (median)"
            )
        every = 10
        cpu = children_cpu()
        results, flush, sent, dropped = anyio.run(due_every, args.repeats, root, every)
        cpu = children_cpu() - cpu
        base = results["no hook"]
        print(
            f"\nin the loop, due every {every} steps (us/step, median of {args.repeats}; "
            f"load {os.getloadavg()[0]:.1f}):"
        )
        for label, values in results.items():
            print(f"  {label:45s} {median(values):8.3f}")
        for label in (f"MlflowHook, due every {every} steps", "A/A control: no hook again"):
            diffs = [a - b for a, b in zip(results[label], base, strict=True)]
            print(
                f"  {label.split(',')[0] + ' - no hook, per due step':45s} "
                f"{median(diffs) * every:+8.3f}  (paired median, x{every})"
            )
        print(f"  close flushed in {flush:.2f} s; {sent} points sent, {dropped} dropped")
        if cpu:
            print(
                f"  the sender process's CPU time: {cpu:.1f} s, "
                f"{cpu / max(sent, 1) * 1e6:.1f} us per point sent (another core's, "
                "or shared at niceness +10)"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
