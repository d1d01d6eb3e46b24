"""monitored-optuna: Optuna trials trained by monitored sessions, pruned and run at once.

:class:`OptunaPruningHook` reports an evaluation result or a step output to an
Optuna trial and prunes it (a clean stop, then ``optuna.TrialPruned``); the
installed ``optuna`` plugin does the same from options for the current trial.
:func:`optimize` runs a study's trials, several at once, in one event loop
through Optuna's ask/tell interface.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from monitored import PrintableFilter as _PrintableFilter

from ._errors import MonitoredValueError, OptunaConfigError, OptunaError
from ._hook import OptunaPruningHook
from ._optimize import optimize, resume_trial
from ._retry import original_trial_number
from ._trial import current_trial, use_trial

# Its log lines name studies, trials and storage errors (read back, maybe hostile): none prints a
# terminal sequence or a forged line.
logging.getLogger("monitored.optuna").addFilter(_PrintableFilter())

try:
    __version__ = version("monitored-optuna")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "MonitoredValueError",
    "OptunaConfigError",
    "OptunaError",
    "OptunaPruningHook",
    "__version__",
    "current_trial",
    "optimize",
    "original_trial_number",
    "resume_trial",
    "use_trial",
]
