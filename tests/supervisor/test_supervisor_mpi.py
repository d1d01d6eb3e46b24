"""A Supervisor under ``mpiexec -n 2``: rank 0 alone saves checkpoints and writes summaries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("monitored_mpi")

#: Seconds after which MPICH's launcher kills the job (a hang fails the test).
JOB_LIMIT = 90

SCRIPT = """
import json, sys
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi

LOGDIR, OUT = sys.argv[1], Path(sys.argv[2])
summarized = []


def step(state):
    state["w"] += 1
    state.global_step += 1


async def main():
    state = monitored.TrainState({"w": np.zeros(3)}, seed=0)
    sv = monitored.Supervisor(
        state,
        logdir=LOGDIR,
        save_model_secs=0.01,
        save_summaries_secs=0.01,
        summary_op=lambda state: summarized.append(state.global_step) or {"w0": state["w"][0]},
    )
    async with sv.managed_session() as sess:
        while not sv.should_stop() and state.global_step < 6:
            await sess.run(step)
            await anyio.sleep(0.02)
        writer = sv.summary_writer is not None
    result = {"chief": sv.is_chief, "summarized": len(summarized), "writer": writer}
    (OUT / f"rank{monitored_mpi.rank()}.json").write_text(json.dumps(result))


anyio.run(main)
"""


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def test_only_rank_0_writes_into_the_shared_logdir(tmp_path: Path) -> None:
    launcher = _mpiexec()
    if launcher is None:  # pragma: no cover - the dev group installs the mpich wheel
        pytest.skip("no mpiexec: install the mpich wheel (the dev group does)")
    script, logdir, out = tmp_path / "train.py", tmp_path / "logdir", tmp_path / "out"
    script.write_text(textwrap.dedent(SCRIPT))
    out.mkdir()
    env = {
        **os.environ,
        "MPIEXEC_TIMEOUT": str(JOB_LIMIT),
        "MONITORED_MPI_TIMEOUT": "10",
        "MONITORED_DISABLE_PLUGINS": "progress,nan-guard,early-stopping",
    }
    env.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)  # the MPI plugin must load
    proc = subprocess.run(
        [launcher, "-n", "2", sys.executable, str(script), str(logdir), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_LIMIT + 30,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    assert results["rank0"]["chief"]
    assert results["rank0"]["writer"]
    assert results["rank0"]["summarized"] > 0
    assert results["rank1"] == {"chief": False, "summarized": 0, "writer": False}
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1, "one event file: rank 0's"
    manifests = sorted(p.name for p in logdir.glob("model.ckpt-*.json"))
    assert "model.ckpt-6.json" in manifests, manifests
