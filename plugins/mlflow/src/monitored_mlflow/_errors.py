"""The exceptions of ``monitored-mlflow``.

Only configuration errors are raised, when the session starts (a misspelled
option must not go unnoticed for a whole training run). Failures to reach the
tracking server are never raised: training goes on, and they are logged as
warnings with a count of what was dropped.
"""

from __future__ import annotations

__all__ = ["MlflowConfigError", "MlflowPluginError"]


class MlflowPluginError(Exception):
    """Base class of this plugin's errors."""


class MlflowConfigError(MlflowPluginError, ValueError):
    """A hook argument or plugin option with a value the plugin cannot use."""
