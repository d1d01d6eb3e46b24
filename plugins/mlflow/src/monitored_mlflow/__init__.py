"""monitored-mlflow: MLflow experiment tracking for monitored.

Installed beside the core and configured (``MLFLOW_TRACKING_URI``, or the
plugin's ``tracking_uri``/``enabled`` options), every ``MonitoredTrainingSession``
on the chief logs one MLflow run: its parameters, the step's scalar outputs
every ``log_every_n_steps``, what summary sinks receive (``global_step/sec``),
evaluation results (``eval/*``), version and git tags, optionally checkpoints
as artifacts, and how it ended (``FINISHED``, ``FAILED``, ``KILLED``). A resumed
training continues the same run. Everything is sent from a process of its own
with ``MlflowClient.log_batch``; a slow or absent server never stalls or stops
training. Pass :class:`MlflowHook` in ``hooks=[...]`` to log a plain
``MonitoredSession``, or to choose its arguments in code.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from monitored import PrintableFilter as _PrintableFilter

from ._errors import MlflowConfigError, MlflowPluginError
from ._hook import DEFAULT_EXPERIMENT, MlflowHook, optimizer_params, run_status
from ._sender import RUN_KEY_TAG, STEP_TAG, Sender

# Its log lines name run ids, checkpoint paths and the store's answers (read back, maybe
# hostile): none prints a terminal sequence or a forged line.
logging.getLogger("monitored.mlflow").addFilter(_PrintableFilter())

try:
    __version__ = version("monitored-mlflow")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_EXPERIMENT",
    "RUN_KEY_TAG",
    "STEP_TAG",
    "MlflowConfigError",
    "MlflowHook",
    "MlflowPluginError",
    "Sender",
    "__version__",
    "optimizer_params",
    "run_status",
]
