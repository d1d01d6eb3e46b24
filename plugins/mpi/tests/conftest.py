"""Running the test scripts under ``mpiexec``, with hard limits so a deadlock fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
#: Seconds after which MPICH's launcher kills the whole job (a hang fails the test).
JOB_LIMIT = 90


def mpiexec() -> str | None:
    """The ``mpiexec`` of this environment (the ``mpich`` wheel's), else one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


@pytest.fixture
def run_mpi(tmp_path: Path) -> Any:
    """``run_mpi(n, script, *args, env=...)`` -> (CompletedProcess, {rank: result}).

    ``script`` is a file of ``scripts/`` (or any path); it gets the output folder
    as its last argument and writes ``rank<N>.json`` there.
    """
    launcher = mpiexec()
    if launcher is None:  # pragma: no cover - the dev group installs the mpich wheel
        pytest.skip("no mpiexec: install the mpich wheel (the dev group does)")

    def run(
        n: int,
        script: str | Path,
        *args: str,
        env: dict[str, str] | None = None,
        out: Path | None = None,
        pass_out: bool = True,
    ) -> tuple[subprocess.CompletedProcess[str], dict[int, dict[str, Any]]]:
        out = out or tmp_path / f"out-{Path(script).name}-{n}-{'-'.join(args)}"
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("rank*.json"):
            old.unlink()
        full_env = {
            **os.environ,
            "MPIEXEC_TIMEOUT": str(JOB_LIMIT),
            "MONITORED_MPI_TIMEOUT": "10",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        command = [launcher, "-n", str(n), sys.executable, str(SCRIPTS / script), *args]
        if pass_out:
            command.append(str(out))
        proc = subprocess.run(
            command, env=full_env, capture_output=True, text=True, timeout=JOB_LIMIT + 30
        )
        results = {}
        for path in sorted(out.glob("rank*.json")):
            try:
                results[int(path.stem.removeprefix("rank"))] = json.loads(path.read_text())
            except json.JSONDecodeError:
                # A rank ended by another's abort while it wrote: it has no result.
                continue
        return proc, results

    return run
