"""monitored-early-stopping: stop training when a watched value stops improving.

:class:`EarlyStoppingHook` decides exactly as Keras's ``EarlyStopping`` for the
same sequence of values; :func:`stop_if_no_decrease_hook` and
:func:`stop_if_no_increase_hook` are TF1 Estimator's, counted in global steps.
The hook watches a training output every ``every_n_steps`` (optionally
smoothed), or any metric handed to :meth:`EarlyStoppingHook.observe`, stops
through the session's one stop decision, keeps its state in checkpoints and can
put the best state back at the end.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from monitored import PrintableFilter as _PrintableFilter

from ._errors import (
    EarlyStoppingConfigError,
    EarlyStoppingError,
    EarlyStoppingStateError,
    MonitoredValueError,
)
from ._hook import EarlyStoppingHook, stop_if_no_decrease_hook, stop_if_no_increase_hook
from ._rules import Decision, KerasRule, NoImprovementRule, Rule, infer_mode

# Its log lines name the best checkpoint, a path restored from a checkpoint (read back, maybe
# hostile): none prints a terminal sequence or a forged line.
logging.getLogger("monitored.early_stopping").addFilter(_PrintableFilter())

try:
    __version__ = version("monitored-early-stopping")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "Decision",
    "EarlyStoppingConfigError",
    "EarlyStoppingError",
    "EarlyStoppingHook",
    "EarlyStoppingStateError",
    "KerasRule",
    "MonitoredValueError",
    "NoImprovementRule",
    "Rule",
    "__version__",
    "infer_mode",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]
