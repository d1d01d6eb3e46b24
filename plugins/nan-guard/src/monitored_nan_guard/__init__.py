"""monitored-nan-guard: stop, fail or roll back when training diverges.

``NanTensorHook`` is TF1's hook of that name (NaN loss: log "Model diverged
with loss = NaN." and raise :class:`~monitored.NanLossDuringTrainingError`, or
request a stop), plus what large trainings need beyond it: infinities as
failures, periodic scans of every state array for non-finite values, loss-spike
detection, and rolling back to the newest checkpoint older than the failure.
Installed, it guards every session's ``loss`` output (if the step returns one).
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from monitored import PrintableFilter as _PrintableFilter

from ._errors import (
    LossSpikeError,
    NanGuardConfigError,
    NanGuardError,
    NanLossDuringTrainingError,
    NonFiniteLossError,
    NonFiniteStateError,
    RollbackError,
)
from ._hook import Failure, NanTensorHook, Rollback

# Its log lines name the checkpoints it rolls back to (read back, maybe hostile): none prints a
# terminal sequence or a forged line.
logging.getLogger("monitored.nan_guard").addFilter(_PrintableFilter())

try:
    __version__ = version("monitored-nan-guard")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "Failure",
    "LossSpikeError",
    "NanGuardConfigError",
    "NanGuardError",
    "NanLossDuringTrainingError",
    "NanTensorHook",
    "NonFiniteLossError",
    "NonFiniteStateError",
    "Rollback",
    "RollbackError",
    "__version__",
]
