"""A trial that is itself an MPI job: the chief reports, every rank stops after the same step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import anyio
    import numpy as np
    import optuna
    from mpi4py import MPI

    import monitored
    from monitored_optuna import OptunaPruningHook

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rank = MPI.COMM_WORLD.Get_rank()

    def step(state):
        state.global_step += 1
        return {"loss": np.float64(state.global_step / 10)}

    async def main():
        # Only the chief holds the trial (in a real sweep: the one it asked the study for).
        trial = None
        if rank == 0:
            pruner = optuna.pruners.ThresholdPruner(upper=0.55)
            trial = optuna.create_study(pruner=pruner).ask()
        hooks = [OptunaPruningHook(trial, "loss", every_n_steps=1)]
        result = {"rank": rank, "pruned": None}
        session = monitored.MonitoredSession(hooks=hooks)
        try:
            async with session:
                assert session.cluster.size == 2
                while not session.should_stop() and session.state.global_step < 20:
                    await session.run(step)
        except optuna.TrialPruned as exc:
            result["pruned"] = str(exc)
        result["step"] = session.state.global_step
        if trial is not None:
            result["reported"] = sorted(trial.storage.get_trial(trial._trial_id).intermediate_values)
        with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
            json.dump(result, f)

    anyio.run(main)
    """
)


def test_the_chief_reports_and_a_prune_stops_every_rank_after_the_same_step(
    tmp_path: Path,
) -> None:
    beside = Path(sys.executable).parent / "mpiexec"
    launcher = str(beside) if beside.exists() else shutil.which("mpiexec")
    if launcher is None:  # pragma: no cover - the dev group installs the mpich wheel
        pytest.skip("no mpiexec: install the mpich wheel (the dev group does)")
    script = tmp_path / "trial.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env |= {
        "MONITORED_DISABLE_PLUGINS": "checkpoint,summaries,progress,nan_guard,early_stopping",
        "MPIEXEC_TIMEOUT": "90",
        "MONITORED_MPI_TIMEOUT": "10",
    }
    done = subprocess.run(
        [launcher, "-n", "2", sys.executable, str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    chief = json.loads((tmp_path / "rank0.json").read_text())
    worker = json.loads((tmp_path / "rank1.json").read_text())
    assert chief["step"] == worker["step"] == 6, "every rank stopped after the same step"
    assert chief["reported"] == [1, 2, 3, 4, 5, 6], "the chief reported"
    assert chief["pruned"] == "Trial 0 was pruned at step 6 (loss = 0.6)"
    assert worker["pruned"] is None, "a worker holds no trial: it ends normally"
