"""MPI initialized without MPI_THREAD_MULTIPLE: the heartbeat is off, and says so.

``python thread_level.py OUT_DIR`` under ``mpiexec -n 2``: writes the warning
(or none) and whether a heartbeat runs to ``OUT_DIR/rank<N>.json``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import mpi4py

mpi4py.rc.thread_level = "serialized"

import monitored_mpi  # noqa: E402 - after the thread level is chosen

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    found = monitored_mpi.world()
assert found is not None
result = {
    "heartbeat": found.heartbeat is not None,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
}
(Path(sys.argv[1]) / f"rank{found.rank}.json").write_text(json.dumps(result))
