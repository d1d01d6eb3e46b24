"""Refuse a launch whose tasks were started together but not connected into one world.

``srun -n 4 python train.py`` without ``--mpi=...`` (or any launcher whose tasks
do not find each other) starts four processes that each see an MPI world of one,
or no MPI at all: each trains alone as "rank 0 of 1", as the chief, and all four
write the same run directory. The launcher's environment tells: a process it
started as one task of several carries the size of its step. When it does and
this process nevertheless trains alone (the session's cluster is the one-process
:class:`LocalCluster`), the session stops before training with
:class:`UnconnectedTasksError`, naming the variables and the fix.

Which variables mean "one task of several launched together" (an allocation's
own ``SLURM_NTASKS``/``SLURM_NPROCS`` are also set in a batch script or an
``salloc`` shell that runs one process on purpose, so they do not count):

- Slurm's ``srun``: ``SLURM_STEP_NUM_TASKS`` (the job step's tasks) with ``SLURM_PROCID``;
- Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_SIZE``;
- MPICH/Hydra and Intel MPI (and ``srun --mpi=pmi2``): ``PMI_SIZE``;
- MVAPICH: ``MV2_COMM_WORLD_SIZE``.

Independent tasks on purpose (a sweep of one task per trial, each with its own
directory) set ``MONITORED_ALLOW_UNCONNECTED_TASKS=1``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Final

from ._errors import MonitoredError, install_hint
from ._printable import printable

__all__ = ["ALLOW_ENV", "UnconnectedTasksError", "check_launch", "launched_tasks"]

#: Set to ``1`` to let tasks launched together train alone (each its own run).
ALLOW_ENV: Final = "MONITORED_ALLOW_UNCONNECTED_TASKS"

#: ``(size variable, variable that must also be set)`` per launcher.
_SIGNS: Final = (
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
    ("OMPI_COMM_WORLD_SIZE", None),
    ("PMI_SIZE", None),
    ("MV2_COMM_WORLD_SIZE", None),
)


class UnconnectedTasksError(MonitoredError):
    """This process is one of several tasks launched together, but trains alone."""

    def __init__(self, message: str, *, variables: Mapping[str, str]) -> None:
        super().__init__(message)
        #: The launcher's variables that say how many tasks were started.
        self.variables = dict(variables)


def launched_tasks(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher variables of ``environ`` that say this is one task of several."""
    env = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for size_var, with_var in _SIGNS:
        raw = env.get(size_var, "").strip()
        try:
            size = int(raw)
        except ValueError:
            continue
        if size > 1 and (with_var is None or with_var in env):
            found[size_var] = raw
            if with_var is not None:
                found[with_var] = env[with_var]
    return found


def check_launch(
    *,
    trains_alone: bool,
    idle_suppliers: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`UnconnectedTasksError` if the launcher started several tasks that
    are not connected, while this process ``trains_alone``."""
    env = os.environ if environ is None else environ
    if not trains_alone or env.get(ALLOW_ENV, "").strip() in ("1", "true", "yes"):
        return
    found = launched_tasks(env)
    if not found:
        return
    shown = ", ".join(f"{k}={printable(v)}" for k, v in found.items())
    idle = sorted(idle_suppliers)
    if idle:
        why = (
            f"{', '.join(idle)} is installed but supplied no cluster (no MPI launcher it "
            "knows, or an MPI world of one process): the launcher did not connect the tasks "
            "(srun without --mpi=pmi2, or an MPI library other than the one the launcher "
            "speaks)"
        )
    else:
        why = (
            "no plugin connects them (monitored-mpi is not installed: "
            f"{install_hint('monitored-mpi')})"
        )
    raise UnconnectedTasksError(
        f"this process is one of several tasks launched together ({shown}), but it trains "
        f"alone: {why}. Each task would train as its own chief and write the same "
        "directories. Fix: launch with an MPI the tasks connect through (srun --mpi=pmi2 "
        "with the mpich wheel, or mpiexec/mpirun), see docs/scaling-out.md; or, to run "
        f"independent tasks on purpose, set {ALLOW_ENV}=1 and give each its own directory",
        variables=found,
    )


# Tracebacks name the public path, as for the ownership errors (see _ownership.py).
UnconnectedTasksError.__module__ = "monitored"
