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
* **read**: ``summary_iterator``'s throughput (MiB/s of event file, warm page
  cache) on a file of scalar events (small records: the per-record cost) and on
  one of 256 KiB records (the checksum's cost), against reading the same bytes
  with no parsing at all (the ceiling), the whole file split and parsed in
  memory with no checks (what any Python reader must do), the same reader
  with tensorboardX's pure-Python CRC-32C (what reading cost without the
  ``crc32c`` package), and TensorBoard's own ``EventFileLoader`` without
  TensorFlow (pure-Python CRC too).
  The two pure-Python contenders read a 1 MiB prefix of each file (the rate does
  not depend on the size). Alternating repeats; medians.
* **every 10 steps** (``--only every10``): the CPU one written record costs, the
  writer's thread included (process CPU time). A session whose step records
  ``summaries.scalar("loss", ...)`` and returns ``{"loss": ...}``, with the hook
  the ``summaries`` plugin makes (``save_steps=10``, ``step_outputs=True``), over
  the same session without it; against a loop calling
  ``tensorboardX.SummaryWriter.add_scalar`` every 10 steps over the same loop
  without it (the by-hand baseline). 20 000 steps (2 000 records), the final
  ``flush`` and close included, the four in a rotating order; medians.

Usage::

    python benchmarks/summaries.py [--repeats 7] [--due-steps 20] [--only read|every10]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only the hooks given below

import anyio
import numpy as np
import tensorboardX
import tensorboardX.crc32c
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary

import monitored_summaries as summaries
from monitored import MonitoredSession, TrainState
from monitored_summaries import FileWriterCache, SummarySaverHook, _reader, summary_iterator

BLOCK = 2000
MIB = 1 << 20


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


EVERY10_STEPS = 20_000


def _loss_step(state: TrainState) -> dict[str, Any]:
    w = state["w"]
    np.subtract(w, 0.001, out=w)
    loss = np.float32(w[0])
    summaries.scalar("loss", loss)
    state.global_step += 1
    return {"loss": loss}


async def _session_every10(logdir: str, with_hook: bool) -> None:
    hooks: list[object] = []
    if with_hook:
        hooks.append(SummarySaverHook(save_steps=10, output_dir=logdir, step_outputs=True))
    state = TrainState({"w": np.ones(64, np.float32)})
    async with MonitoredSession(state, hooks=hooks) as session:
        for _ in range(EVERY10_STEPS):
            await session.run(_loss_step)
    FileWriterCache.clear()


def _by_hand_every10(logdir: str, with_writer: bool) -> None:
    writer = tensorboardX.SummaryWriter(logdir) if with_writer else None
    w = np.ones(64, np.float32)
    for step in range(1, EVERY10_STEPS + 1):
        np.subtract(w, 0.001, out=w)
        loss = np.float32(w[0])
        if writer is not None and step % 10 == 0:
            writer.add_scalar("loss", float(loss), step)
    if writer is not None:
        writer.close()


def every10(repeats: int, root: str) -> dict[str, list[float]]:
    """Process CPU seconds of each contender, one figure per repeat."""
    contenders: dict[str, Callable[[str], None]] = {
        "session, summaries hook": lambda d: anyio.run(_session_every10, d, True),
        "session without it": lambda d: anyio.run(_session_every10, d, False),
        "loop, add_scalar every 10 steps": lambda d: _by_hand_every10(d, True),
        "loop without it": lambda d: _by_hand_every10(d, False),
    }
    names = list(contenders)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up
        contenders[name](os.path.join(root, f"warm-{names.index(name)}"))
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.process_time()
            contenders[name](os.path.join(root, f"{r}-{names.index(name)}"))
            cpu[name].append(time.process_time() - start)
    return cpu


def print_every10(repeats: int, root: str) -> None:
    cpu = every10(repeats, root)
    med = {name: statistics.median(values) for name, values in cpu.items()}
    records = EVERY10_STEPS // 10
    ours = (med["session, summaries hook"] - med["session without it"]) / records * 1e6
    hand = (med["loop, add_scalar every 10 steps"] - med["loop without it"]) / records * 1e6
    print(f"\nA scalar every 10 steps ({EVERY10_STEPS} steps, {records} records; process CPU)\n")
    print("| contender | CPU s (median, range) |")
    print("|---|--:|")
    for name, values in cpu.items():
        print(f"| {name} | {med[name]:.3f} ({min(values):.3f}-{max(values):.3f}) |")
    print(f"\nPer record: summaries hook {ours:.0f} us, add_scalar by hand {hand:.0f} us;")
    print(f"ratio {ours / hand:.2f}x (load average {os.getloadavg()[0]:.2f})")


def _frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", _reader.masked_crc32c(header))
        + data
        + struct.pack("<I", _reader.masked_crc32c(data))
    )


def _event_file(path: str, records: Iterator[bytes], size: int) -> str:
    """Write framed events to ``path`` until it holds at least ``size`` bytes."""
    written = 0
    with open(path, "wb") as file:
        for data in records:
            framed = _frame(data)
            file.write(framed)
            written += len(framed)
            if written >= size:
                break
    return path


def _scalar_events() -> Iterator[bytes]:
    step = 0
    while True:
        step += 1
        values = [Summary.Value(tag=f"loss/{i}", simple_value=0.5 * i) for i in range(10)]
        event = Event(wall_time=1.7e9 + step, step=step, summary=Summary(value=values))
        yield event.SerializeToString()


def _large_events() -> Iterator[bytes]:
    rng = np.random.default_rng(0)
    step = 0
    while True:
        step += 1
        image = Summary.Image(height=256, width=256, colorspace=4)
        image.encoded_image_string = rng.bytes(256 << 10)
        value = Summary.Value(tag="inputs", image=image)
        yield Event(step=step, summary=Summary(value=[value])).SerializeToString()


def _read_raw(path: str) -> int:
    with open(path, "rb") as file:
        while file.read(MIB):
            pass
    return 0


def _read_unchecked(path: str) -> int:
    """The least any Python reader does: the whole file in memory, split, parsed."""
    with open(path, "rb") as file:
        data = file.read()
    view = memoryview(data)
    offset, count = 0, 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        Event.FromString(view[offset + 12 : offset + 12 + length])
        offset += 16 + length
        count += 1
    return count


def _read_ours(path: str) -> int:
    return sum(1 for _ in summary_iterator(path))


def _read_pure_python_crc(path: str) -> int:
    saved = _reader.crc32c
    _reader.crc32c = tensorboardX.crc32c._crc32c  # tensorboardX's fallback
    try:
        return sum(1 for _ in summary_iterator(path))
    finally:
        _reader.crc32c = saved


def _read_tensorboard(path: str) -> int:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return sum(1 for _ in EventFileLoader(path).Load())


def read_throughput(repeats: int, root: str, size: int) -> dict[str, dict[str, list[float]]]:
    """MiB/s of each reader on each file, one figure per repeat."""
    os.makedirs(root, exist_ok=True)
    files = {
        "scalar events (10 scalars, ~190 B records)": _scalar_events,
        "256 KiB records (an image each)": _large_events,
    }
    readers: dict[str, tuple[Callable[[str], int], bool]] = {
        "raw read, no parsing (ceiling)": (_read_raw, False),
        "in memory, split + parse, no checks (floor of a Python reader)": (
            _read_unchecked,
            False,
        ),
        "summary_iterator (crc32c package)": (_read_ours, False),
        "summary_iterator, pure-Python CRC (without crc32c)": (_read_pure_python_crc, True),
        "TensorBoard EventFileLoader, no TensorFlow": (_read_tensorboard, True),
    }
    results: dict[str, dict[str, list[float]]] = {}
    for i, (label, records) in enumerate(files.items()):
        full = _event_file(os.path.join(root, f"full-{i}"), records(), size)
        prefix = _event_file(os.path.join(root, f"prefix-{i}"), records(), MIB)
        per_reader: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(repeats):
            for name, (read, slow) in readers.items():
                path = prefix if slow else full
                start = time.perf_counter()
                read(path)
                elapsed = time.perf_counter() - start
                per_reader[name].append(os.path.getsize(path) / MIB / elapsed)
        results[label] = per_reader
    return results


def print_read_throughput(repeats: int, root: str, size: int) -> None:
    results = read_throughput(repeats, root, size)
    print(
        f"\nReading event files (MiB/s, median of {repeats} repeats, warm page cache; "
        f"{size // MIB} MiB files, the pure-Python contenders on a 1 MiB prefix)\n"
    )
    print("| file | reader | MiB/s | min - max | x summary_iterator |")
    print("|---|---|--:|--:|--:|")
    for label, per_reader in results.items():
        ours = statistics.median(per_reader["summary_iterator (crc32c package)"])
        for name, values in per_reader.items():
            m = statistics.median(values)
            print(
                f"| {label} | {name} | {m:.1f} | {min(values):.1f} - {max(values):.1f} | "
                f"{m / ours:.3f} |"
            )
    print(
        "\nTargets: summary_iterator >= 10x the pure-Python CRC on both files, and >= 0.5x "
        "the unchecked in-memory parse (what two CRC-32C checks and bounded reads per record "
        "may cost on the smallest records)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--due-steps", type=int, default=20)
    parser.add_argument("--read-mib", type=int, default=64, help="size of the files read")
    parser.add_argument("--only", choices=["read", "every10"], help="run only this part")
    args = parser.parse_args()
    print(
        f"Machine: {os.cpu_count()} CPUs, {platform.machine()}, {platform.system()} "
        f"{platform.release()}, CPython {platform.python_version()}; numpy {np.__version__}, "
        f"tensorboardX {tensorboardX.__version__}; load average {os.getloadavg()[0]:.2f}"
    )
    if args.only == "every10":
        with tempfile.TemporaryDirectory() as root:
            print_every10(args.repeats, root)
        return
    if args.only == "read":
        with tempfile.TemporaryDirectory() as root:
            print_read_throughput(args.repeats, os.path.join(root, "read"), args.read_mib * MIB)
        return
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
        print_read_throughput(args.repeats, os.path.join(root, "read"), args.read_mib * MIB)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
