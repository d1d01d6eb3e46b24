"""Input pipelines: does prefetch hide loading behind the step, and what does it cost?

Two measurements, each against a baseline taken in the same run:

* **Overlap.** A loader spending ``--work-ms`` per batch in NumPy work that
  releases the GIL (``np.sin`` over an array sized at start to take that long) and a step
  doing the same amount of such work, inside a ``MonitoredSession``:
  the sequential loop (``await sess.run(step, load(i))``) against
  ``prefetch(load, num_workers=2, feed="batch")``. Reported as time per step
  divided by ``max(load, step)`` (each measured alone, same run): 1.0 is
  perfect overlap, 2.0 is none.
* **Overhead per batch.** A free source (a generator yielding one preallocated
  array) consumed with ``async for`` through ``prefetch``, against the same
  generator consumed by a plain ``for`` loop inside the same ``async def``:
  microseconds per batch, as the difference of medians. With ``--baseline REV``
  the ``prefetch`` of that git revision (its ``_prefetch.py``, loaded beside
  this tree's) is measured too, alternating with this tree's in every repeat.
  Thread producers are measured twice: by default (the step never calls the
  source) and with ``in_place=True`` (the source declared cheap: the step makes
  a batch no thread has claimed yet itself); the baseline runs its default.

Usage::

    python benchmarks/input.py [--steps N] [--batches N] [--repeats R] [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np

import monitored
from monitored import data

os.environ.setdefault("MONITORED_DISABLE_PLUGIN_AUTOLOAD", "1")


def calibrate(work_ms: float) -> Callable[[np.ndarray], None]:
    """A function doing about ``work_ms`` of GIL-releasing NumPy work on one core."""
    # np.sin is compute-bound (about 10 ns an element): two threads running it do
    # not fight over memory bandwidth as a streaming add or multiply would.
    probe = 1 << 16
    a = np.random.default_rng(0).random(probe)
    out = np.empty_like(a)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        np.sin(a, out=out)
        times.append(time.perf_counter() - start)
    size = max(1, int(probe * work_ms / 1000 / min(times)))
    a = np.random.default_rng(0).random(size)

    def work(out: np.ndarray) -> None:
        np.sin(a, out=out)

    work.size = size  # type: ignore[attr-defined]
    return work


def per_call(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


async def overlap(
    work_ms: float, steps: int, base: Callable[..., Any] | None = None, base_first: bool = False
) -> dict[str, float]:
    work = calibrate(work_ms)
    size = work.size  # type: ignore[attr-defined]
    load_buf = [np.empty(size) for _ in range(8)]
    step_buf = np.empty(size)

    def load(i: int) -> np.ndarray:
        out = load_buf[i % len(load_buf)]
        work(out)
        return out[:4]

    def step(state: monitored.TrainState, batch: np.ndarray) -> None:
        work(step_buf)
        state.global_step += 1

    state = monitored.TrainState()
    t_load = per_call(lambda: load(0), steps // 2)
    t_step = per_call(lambda: step(state, load_buf[0][:4]), steps // 2)

    async def sequential() -> float:
        async with monitored.MonitoredSession(monitored.TrainState()) as sess:
            start = time.perf_counter()
            for i in range(steps):
                await sess.run(step, load(i))
            return (time.perf_counter() - start) / steps

    async def prefetched(make: Callable[..., Any] = data.prefetch) -> float:
        pipeline = make(load, buffer_size=2, num_workers=2, feed="batch")
        async with monitored.MonitoredSession(monitored.TrainState(), hooks=[pipeline]) as sess:
            await sess.run(step)  # producers started and warm
            start = time.perf_counter()
            for _ in range(steps):
                await sess.run(step)
            return (time.perf_counter() - start) / steps

    t_seq = await sequential()
    t_base = await prefetched(base) if base is not None and base_first else None
    t_pre = await prefetched()
    if base is not None and t_base is None:
        t_base = await prefetched(base)
    bound = max(t_load, t_step)
    result = {
        "load_ms": t_load * 1e3,
        "step_ms": t_step * 1e3,
        "sequential_ms": t_seq * 1e3,
        "prefetch_ms": t_pre * 1e3,
        "sequential_ratio": t_seq / bound,
        "prefetch_ratio": t_pre / bound,
    }
    if t_base is not None:
        result |= {"baseline_ms": t_base * 1e3, "baseline_ratio": t_base / bound}
    return result


def baseline_module(rev: str) -> ModuleType:
    """``monitored.data._prefetch`` as it was at git revision ``rev``."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{rev}:core/monitored/data/_prefetch.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "_prefetch_baseline.py"
    path.write_text(source)
    name = "monitored.data._prefetch_baseline"  # inside the package: its relative imports work
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def overhead(
    batches: int,
    buffer_size: int,
    threads: bool,
    make: Callable[..., Any] = data.prefetch,
    **options: Any,
) -> tuple[float, float]:
    item = np.zeros(4)

    def free() -> Iterator[np.ndarray]:
        for _ in range(batches):
            yield item

    class Free:
        def __iter__(self) -> Iterator[np.ndarray]:
            return free()

    start = time.perf_counter()
    for _ in free():
        pass
    plain = (time.perf_counter() - start) / batches

    pipeline = make(Free(), buffer_size=buffer_size, threads=threads, **options)
    async with pipeline:
        start = time.perf_counter()
        async for _ in pipeline:
            pass
        piped = (time.perf_counter() - start) / batches
    return plain * 1e6, piped * 1e6


PRODUCERS: list[tuple[str, bool, dict[str, Any]]] = [
    ("task", False, {}),
    ("threads", True, {}),
    ("threads, in_place=True", True, {"in_place": True}),
]


async def main(args: argparse.Namespace) -> None:
    base = baseline_module(args.baseline).prefetch if args.baseline else None
    runs = [  # the two prefetch contenders take turns going first
        await overlap(args.work_ms, args.steps, base, base_first=i % 2 == 1)
        for i in range(args.repeats)
    ]
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    rows = []
    for buffer_size in (2, 16, 64):
        # in_place=True: the source is declared cheap, so the step may make its
        # batch itself (the baseline did so by itself for any batch under 20 us).
        for kind, threads, options in PRODUCERS:
            pairs, old = [], []
            for _ in range(args.repeats):  # the contenders alternate
                pairs.append(await overhead(args.batches, buffer_size, threads, **options))
                if base is not None:
                    old.append(await overhead(args.batches, buffer_size, threads, base))
            plain = statistics.median(p for p, _ in pairs + old)
            piped = statistics.median(q for _, q in pairs)
            was = statistics.median(q for _, q in old) if old else None
            rows.append((buffer_size, kind, plain, piped, was))
    print(f"# {platform.python_version()} numpy {np.__version__} on {os.cpu_count()} cores")
    print(
        f"Overlap, {args.steps} steps, medians of {args.repeats}: load {med['load_ms']:.2f} ms, "
        f"step {med['step_ms']:.2f} ms"
    )
    lo = {key: min(r[key] for r in runs) for key in runs[0]}
    hi = {key: max(r[key] for r in runs) for key in runs[0]}
    print("| loop | ms/step | / max(load, step), median | min-max over repeats |")
    print("|---|---|---|---|")
    loops = [("sequential", "sequential"), ("prefetch, 2 workers", "prefetch")]
    if base is not None:
        loops.append((f"prefetch at {args.baseline}, 2 workers", "baseline"))
    for label, key in loops:
        print(
            f"| {label} | {med[key + '_ms']:.2f} | {med[key + '_ratio']:.2f}x | "
            f"{lo[key + '_ratio']:.2f}-{hi[key + '_ratio']:.2f}x |"
        )
    print(f"\nOverhead per batch, free source, {args.batches} batches, medians:")
    extra = f" overhead at {args.baseline} us | ratio |" if base is not None else ""
    print(f"| buffer_size | producer | plain generator us | prefetch us | overhead us |{extra}")
    print("|---|---|---|---|---|" + ("---|---|" if base is not None else ""))
    for buffer_size, kind, plain, piped, was in rows:
        line = f"| {buffer_size} | {kind} | {plain:.2f} | {piped:.2f} | {piped - plain:.2f} |"
        if was is not None:
            line += f" {was - plain:.2f} | {(was - plain) / (piped - plain):.1f}x |"
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batches", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--markdown", action="store_true", help="(tables are Markdown already)")
    parser.add_argument(
        "--baseline", metavar="REV", help="also measure prefetch as of this git revision"
    )
    anyio.run(main, parser.parse_args())
