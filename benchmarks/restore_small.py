"""Restoring a small checkpoint against ``safetensors.numpy.load_file`` (issue 33).

A state of ``--size-mb`` MB of float32 in four arrays, saved once by
``Saver.save`` and once by ``safetensors.numpy.save_file``; then, from the page
cache, ``restore`` into an empty ``TrainState`` (manifest parsed and checked,
header checked against it, CRC-32 of every byte) against ``load_file`` of the
same arrays (no check), ``--repeats`` times each in alternating order. Medians
of wall time and of process CPU time.

Usage::

    python benchmarks/restore_small.py [--size-mb 1] [--repeats 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

import monitored
from monitored_checkpoint import Saver, restore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    per = int(args.size_mb * (1 << 20)) // 16
    state = monitored.TrainState(
        {f"l{i}": np.random.default_rng(i).random(per, dtype=np.float32) for i in range(4)}
    )
    root = Path(tempfile.mkdtemp(prefix="monitored-restore-"))
    try:
        path = Saver().save(state, str(root / "model.ckpt"))
        plain = str(root / "plain.safetensors")
        save_file(dict(state.items()), plain)

        def ours() -> None:
            restore(monitored.TrainState(), path)

        def theirs() -> None:
            load_file(plain)

        wall: dict[str, list[float]] = {"restore": [], "load_file": []}
        cpu: dict[str, list[float]] = {"restore": [], "load_file": []}
        for i in range(args.repeats):
            pair = [("restore", ours), ("load_file", theirs)]
            for name, fn in pair if i % 2 else pair[::-1]:
                c, w = time.process_time(), time.perf_counter()
                fn()
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}; load {os.getloadavg()[0]:.1f}"
    )
    w = {k: statistics.median(v) for k, v in wall.items()}
    c = {k: statistics.median(v) for k, v in cpu.items()}
    print()
    print("| | wall ms | CPU ms |")
    print("|---|--:|--:|")
    for name in wall:
        print(f"| {name} | {w[name] * 1e3:.3f} | {c[name] * 1e3:.3f} |")
    print(
        f"| restore / load_file | **{w['restore'] / w['load_file']:.2f}** | "
        f"{c['restore'] / c['load_file']:.2f} |"
    )


if __name__ == "__main__":
    main()
