"""``monitored-optuna`` installs alone beside the core, into a fresh virtual environment,
and prunes a trial there: nothing it needs comes from the workspace's other plugins."""

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
import anyio, numpy as np, optuna, monitored, monitored_optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)

def rising(state):
    state.global_step += 1
    return {"loss": np.float32(state.global_step)}

async def objective(trial):
    async with monitored.MonitoredTrainingSession(
        hooks=[monitored.StopAtStepHook(last_step=50)],
        plugin_options={"optuna": {"monitor": "loss", "every_n_steps": 1}},
    ) as sess:
        while not sess.should_stop():
            await sess.run(rising)
    return float(sess.state.global_step)

async def main():
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=10.0))
    await monitored_optuna.optimize(study, objective, n_trials=2)
    print(sorted({p.name for p in monitored.installed_plugins()}))
    print([t.state.name for t in study.trials], [t.last_step for t in study.trials])

anyio.run(main)
"""


@pytest.mark.slow
def test_monitored_optuna_installs_alone_beside_the_core_and_prunes(tmp_path: Path) -> None:
    uv = uv_command()
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    env.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("MONITORED_DISABLE_PLUGINS", None)
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run(
        [*uv, "pip", "install", "-q", "--python", str(python), str(ROOT), str(PLUGIN)],
        check=True,
        env=env,
    )
    done = subprocess.run(
        [str(python), "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    plugins, trials = done.stdout.splitlines()
    assert plugins == "['optuna']"
    assert trials == "['PRUNED', 'PRUNED'] [11, 11]"
