"""``monitored-mlflow`` installs alone beside the core and logs to a SQLite store.

MLflow's default store, and the demo's, is a ``sqlite:///`` file, which
``mlflow-skinny`` cannot open without SQLAlchemy and Alembic: the plugin
declares them, so a fresh environment with the core and this plugin only (no
``monitored-optuna`` bringing SQLAlchemy along) logs a run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import uv_command

ROOT = Path(__file__).parents[3]
PLUGIN = Path(__file__).parents[1]

SCRIPT = """
import sys
import anyio, numpy as np, monitored
from mlflow import MlflowClient
from monitored_mlflow import MlflowHook

def step(state):
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}

async def main():
    hook = MlflowHook(sys.argv[1], log_every_n_steps=1)
    async with monitored.MonitoredSession(
        monitored.TrainState(), hooks=[hook, monitored.StopAtStepHook(last_step=20)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    run = MlflowClient(sys.argv[1]).get_run(hook.run_id)
    print(run.info.status, len(MlflowClient(sys.argv[1]).get_metric_history(hook.run_id, "loss")))

anyio.run(main)
"""


@pytest.mark.slow
def test_monitored_mlflow_installs_alone_and_logs_to_a_sqlite_store(tmp_path: Path) -> None:
    uv = uv_command()
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    env.pop("MLFLOW_TRACKING_URI", None)
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run(
        [*uv, "pip", "install", "-q", "--python", str(python), str(ROOT), str(PLUGIN)],
        check=True,
        env=env,
    )
    done = subprocess.run(
        [str(python), "-c", SCRIPT, f"sqlite:///{tmp_path / 'mlflow.db'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["FINISHED", "20"], done.stderr[-3000:]
    assert "UnsupportedModelRegistryStoreURIException" not in done.stderr
