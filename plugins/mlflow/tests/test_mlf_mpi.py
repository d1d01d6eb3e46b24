"""Under ``mpiexec`` (monitored-mpi) the chief logs the run; workers log nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

SCRIPT = Path(__file__).parent / "scripts" / "mpi_train.py"


def test_only_the_chief_logs_under_mpiexec(tracking_uri: str, tmp_path: Path) -> None:
    launcher = Path(sys.executable).parent / "mpiexec"
    if not launcher.exists():  # pragma: no cover - the dev group installs the mpich wheel
        pytest.skip("no mpiexec: install the mpich wheel (the dev group does)")
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MPIEXEC_TIMEOUT": "240",
        "MONITORED_MPI_TIMEOUT": "60",
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
    }
    proc = subprocess.run(
        [str(launcher), "-n", "2", sys.executable, str(SCRIPT), "6", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    assert ranks["rank0"]["chief"]
    assert not ranks["rank1"]["chief"]
    assert "mlflow_run" in ranks["rank0"]["plugins"], "the chief's session logs"
    assert "mlflow" not in ranks["rank1"]["plugins"], "chief_only: not loaded on a worker"
    assert "mlflow_run" not in ranks["rank1"]["plugins"]
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("monitored")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])  # one run, the chief's
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == [1, 2, 3, 4, 5, 6]
