"""What one poll of an evaluator costs, in a clean directory and in one flooded with junk.

An evaluator (``checkpoints_iterator``, ``evaluate_repeatedly``) looks at the
checkpoint directory every ``poll_secs``. This times, in a directory holding
one real checkpoint:

* **latest**: ``latest_checkpoint(dir)``;
* **first poll**: a fresh ``checkpoints_iterator`` finding the checkpoint (its
  manifest read and checked);
* **next poll**: the same iterator looking again, nothing new (what an
  evaluator does between checkpoints);
* **restore_latest**: a training run resuming from the directory (the
  checkpoint read and verified into a fresh state; the junk named in one
  warning, unread);

first in the clean directory (the baseline), then after ``--junk`` files
``model.ckpt-N.json`` holding only the format marker, of steps above the real
one and without a data file, were added and the state file removed (the
flood of issue 25). For reference, **read every manifest** times what the
listing used to cost there: reading and decoding each manifest in the
directory (what ``latest_checkpoint`` did before it looked at data files).
The floor is **list the directory** (``os.listdir``): a poll must list
it. Medians of ``--repeats`` runs, alternating clean and flooded directories;
the ratios are flooded over clean, and each flooded time over the flooded
listing's.

Usage::

    python benchmarks/evaluator_poll.py [--junk 10000] [--repeats 21] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from monitored import TrainState
from monitored_checkpoint import (
    CorruptCheckpointWarning,
    Saver,
    checkpoints_iterator,
    latest_checkpoint,
    restore_latest,
)
from monitored_checkpoint._format import MAX_MANIFEST_BYTES, load_json
from monitored_checkpoint._store import open_store


def _timed(fn: Callable[[str], Any], directory: str) -> float:
    started = time.perf_counter()
    fn(directory)
    return time.perf_counter() - started


def _directory(parent: str, junk: int) -> str:
    directory = tempfile.mkdtemp(prefix="evaluator-poll-", dir=parent)
    state = TrainState({"w": np.zeros((256, 256), np.float32)}, global_step=5)
    Saver().save(state, os.path.join(directory, "model.ckpt"))
    if junk:
        os.remove(os.path.join(directory, "checkpoint"))
        for step in range(100, 100 + junk):
            Path(directory, f"model.ckpt-{step}.json").write_text(
                '{"format": "monitored-checkpoint"}'
            )
    return directory


def _first_poll(directory: str) -> None:
    assert next(checkpoints_iterator(directory, timeout=0, poll_secs=0)).endswith("-5")


def _resume(directory: str) -> None:
    state = TrainState({"w": np.zeros((256, 256), np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptCheckpointWarning)  # the flood, named once
        manifest = restore_latest(state, directory)
    assert manifest is not None
    assert manifest.step == 5


def _read_every_manifest(directory: str) -> None:
    store = open_store(directory)
    for name in store.list():
        if name.endswith(".json"):
            load_json(store.read_bytes(name, MAX_MANIFEST_BYTES), name, "the manifest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junk", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--dir", default=None, help="parent of the scratch directories")
    args = parser.parse_args()
    clean, flooded = _directory(args.dir, 0), _directory(args.dir, args.junk)
    followers = {d: checkpoints_iterator(d, timeout=0, poll_secs=0) for d in (clean, flooded)}
    for follower in followers.values():
        next(follower)  # the newest is yielded: from now on, polls find nothing new
    cases: dict[str, Callable[[str], Any]] = {
        "list the directory (os.listdir)": os.listdir,
        "latest_checkpoint": lambda d: latest_checkpoint(d),
        "first poll (manifest read)": _first_poll,
        "next poll (nothing new)": lambda d: list(followers[d]),
        "restore_latest (a resume)": _resume,
        "read every manifest (the old listing)": _read_every_manifest,
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for label, case in cases.items():
            for kind, directory in (("clean", clean), ("flooded", flooded)):
                times.setdefault((label, kind), []).append(_timed(case, directory))
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats} runs\n")
    listing = statistics.median(times[("list the directory (os.listdir)", "flooded")])
    print(
        f"| per poll | clean directory | with {args.junk:,} junk manifests | flooded / clean "
        "| flooded / its listing |"
    )
    print("| --- | --- | --- | --- | --- |")
    for label in cases:
        base = statistics.median(times[(label, "clean")])
        flood = statistics.median(times[(label, "flooded")])
        print(
            f"| {label} | {base * 1e3:.2f} ms | {flood * 1e3:.2f} ms | {flood / base:.1f} "
            f"| {flood / listing:.1f} |"
        )
    print(f"\n    {shlex.join(['python', *sys.argv])}")
    for directory in (clean, flooded):
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))
        os.rmdir(directory)


if __name__ == "__main__":
    main()
