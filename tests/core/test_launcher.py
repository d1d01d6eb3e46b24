"""Tasks launched together but not connected are refused before training (``_launcher``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monitored._core._launcher import (
    ALLOW_ENV,
    UnconnectedTasksError,
    check_launch,
    launched_tasks,
)

#: A one-process training (a world of one): prints ``trained N`` or the error's class.
CHILD = textwrap.dedent(
    """
    import sys
    import anyio, numpy as np
    import monitored

    async def main():
        state = monitored.TrainState({"w": np.zeros(2)})
        def step(state):
            state.global_step += 1
        async with monitored.MonitoredSession(
            state, hooks=[monitored.StopAtStepHook(last_step=2)]
        ) as sess:
            while not sess.should_stop():
                await sess.run(step)
        print("trained", state.global_step, flush=True)

    try:
        anyio.run(main)
    except monitored.UnconnectedTasksError as exc:
        print("REFUSED", exc, flush=True)
        sys.exit(3)
    """
)

_LAUNCHER_VARS = (
    "SLURM_STEP_NUM_TASKS",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "PMIX_RANK",
    "MV2_COMM_WORLD_SIZE",
    ALLOW_ENV,
)


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", CHILD],
        env=child_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_srun_tasks_that_are_not_connected_are_refused(tmp_path: Path) -> None:
    # srun -n 2 without --mpi: the step's variables, and a world of one.
    done = _run(
        tmp_path, SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_ID="7"
    )
    assert done.returncode == 3, done.stderr
    assert "SLURM_STEP_NUM_TASKS=2" in done.stdout
    assert "SLURM_PROCID=1" in done.stdout
    assert "srun --mpi=pmi2" in done.stdout
    assert ALLOW_ENV in done.stdout
    assert "trained" not in done.stdout


def test_open_mpi_tasks_that_are_not_connected_are_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, OMPI_COMM_WORLD_SIZE="4")
    assert done.returncode == 3, done.stderr
    assert "OMPI_COMM_WORLD_SIZE=4" in done.stdout


def test_a_batch_script_or_salloc_shell_trains(tmp_path: Path) -> None:
    # The allocation's SLURM_NTASKS (and SLURM_PROCID=0 of the batch step) alone: one
    # process on purpose, as a notebook in an allocation.
    done = _run(tmp_path, SLURM_NTASKS="8", SLURM_NPROCS="8", SLURM_PROCID="0", SLURM_JOB_ID="7")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trained 2" in done.stdout


def test_a_one_task_step_trains(tmp_path: Path) -> None:
    done = _run(tmp_path, SLURM_STEP_NUM_TASKS="1", SLURM_PROCID="0", SLURM_NTASKS="8")
    assert done.returncode == 0, done.stdout + done.stderr


def test_independent_tasks_on_purpose_train(tmp_path: Path) -> None:
    done = _run(tmp_path, SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1", **{ALLOW_ENV: "1"})
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("env", "found"),
    [
        (
            {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"},
            {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"},
        ),
        ({"SLURM_STEP_NUM_TASKS": "4"}, set()),  # no task id: not a task of the step
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, set()),
        ({"PMI_SIZE": "2", "PMI_RANK": "0"}, {"PMI_SIZE"}),
        ({"PMI_SIZE": "1"}, set()),
        ({"MV2_COMM_WORLD_SIZE": "3"}, {"MV2_COMM_WORLD_SIZE"}),
        ({"OMPI_COMM_WORLD_SIZE": "x"}, set()),
    ],
)
def test_which_variables_count(env: dict[str, str], found: set[str]) -> None:
    assert set(launched_tasks(env)) == found


def test_a_connected_world_is_not_checked() -> None:
    check_launch(trains_alone=False, environ={"PMI_SIZE": "2"})
    with pytest.raises(UnconnectedTasksError, match="monitored-mpi is not installed") as info:
        check_launch(trains_alone=True, environ={"PMI_SIZE": "2"})
    assert info.value.variables == {"PMI_SIZE": "2"}
    with pytest.raises(UnconnectedTasksError, match="mpi is installed but supplied no cluster"):
        check_launch(trains_alone=True, idle_suppliers=["mpi"], environ={"PMI_SIZE": "2"})


def test_a_launcher_variable_with_control_characters_is_printed_escaped(tmp_path: Path) -> None:
    """Issue 34 §2: the values of the environment are named escaped, on one line."""
    from _hostile import HOSTILE, assert_safe_line

    with pytest.raises(UnconnectedTasksError) as info:
        check_launch(
            trains_alone=True, environ={"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": HOSTILE}
        )
    assert_safe_line(str(info.value))
    assert info.value.variables["SLURM_PROCID"] == HOSTILE  # the attribute stays exact
    # A real process under such an environment (no NUL in an environment).
    done = _run(tmp_path, SLURM_STEP_NUM_TASKS="2", SLURM_PROCID=HOSTILE.replace("\0", ""))
    assert done.returncode == 3, done.stderr
    refused = done.stdout.removeprefix("REFUSED ").removesuffix("\n")
    assert_safe_line(refused)
