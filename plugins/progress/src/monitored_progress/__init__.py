"""monitored-progress: a live progress display for monitored, with ``rich``.

Installed, every chief session shows step, steps/s, elapsed time, the ETA when
the last step is known, chosen outputs and checkpoint saves: as a live bar on
an interactive terminal or in Jupyter, as plain log lines elsewhere.
:class:`ProgressHook` is the same display as a hook object.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._errors import ProgressConfigError, ProgressError
from ._hook import ProgressHook, progress_enabled

try:
    __version__ = version("monitored-progress")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "ProgressConfigError",
    "ProgressError",
    "ProgressHook",
    "__version__",
    "progress_enabled",
]
