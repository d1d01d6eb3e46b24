"""Cost of run ownership (``monitored._core._ownership``) on saves, against saves without it.

* **per save**: ``Saver.save`` of a small state (one 1 000-element float64
  array, ``max_to_keep=2`` so every save also rotates one checkpoint away) into
  a local directory, with the directory claimed by this process (every commit —
  data file, manifest, state file, each delete — first checks the claim on
  disk: the fencing) against the same saves into a directory nobody claims (the
  check is then one dictionary test). Blocks of 50 saves alternate between the
  two so a slow spell of the shared machine hits both; medians of the per-save
  times of each block.
* **the check alone**: ``check_run_owner`` on a claimed directory (one
  ``listdir`` of ``.monitored-owner/``), the cost each commit pays.
* **claim + release**: once per session, off the step path.

Nothing is added per step: the claim is taken before ``begin`` and the lease
is renewed by a background thread.

Run: ``.venv/bin/python benchmarks/ownership.py``
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from monitored import TrainState, check_run_owner, claim_run
from monitored_checkpoint import Saver

BLOCKS = 20
SAVES = 50


def _saves(directory: Path, saver: Saver, state: TrainState, start: int) -> float:
    began = time.perf_counter()
    for step in range(start, start + SAVES):
        state.global_step = step
        saver.save(state, str(directory / "model.ckpt"))
    return (time.perf_counter() - began) / SAVES


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        owned, free = Path(root, "owned"), Path(root, "free")
        owner = claim_run(owned)
        assert owner is not None
        state = TrainState({"w": np.zeros(1000)})
        savers = {"owned": Saver(max_to_keep=2), "free": Saver(max_to_keep=2)}
        times: dict[str, list[float]] = {"owned": [], "free": []}
        step = 1
        for block in range(BLOCKS):
            order = ("owned", "free") if block % 2 == 0 else ("free", "owned")
            for name in order:
                where = owned if name == "owned" else free
                times[name].append(_saves(where, savers[name], state, step))
            step += SAVES
        checks = []
        for _ in range(20):
            began = time.perf_counter()
            for _ in range(1000):
                check_run_owner(owned / "model.ckpt-1.json")
            checks.append((time.perf_counter() - began) / 1000)
        owner.release()
        claims = []
        for i in range(20):
            began = time.perf_counter()
            claimed = claim_run(Path(root, f"c{i}"))
            assert claimed is not None
            claimed.release()
            claims.append(time.perf_counter() - began)
    owned_ms = statistics.median(times["owned"]) * 1e3
    free_ms = statistics.median(times["free"]) * 1e3
    print(f"save, directory owned (fencing): {owned_ms:.3f} ms (median of {BLOCKS} blocks)")
    print(f"save, directory not owned:       {free_ms:.3f} ms")
    print(f"  ratio {owned_ms / free_ms:.3f}, difference {(owned_ms - free_ms) * 1e3:.0f} µs/save")
    print(f"check_run_owner on a claim:      {statistics.median(checks) * 1e6:.1f} µs/commit")
    print(f"claim + release (per session):   {statistics.median(claims) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
