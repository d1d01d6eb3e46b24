"""The ``mlflow`` entry point: an :class:`MlflowHook` in ``MonitoredTrainingSession``s, when asked.

Installed, the plugin is idle until a tracking destination is configured: the
``MLFLOW_TRACKING_URI`` environment variable, the ``tracking_uri`` option, or
``enabled=true`` for MLflow's own default store (``sqlite:///mlflow.db`` in the
working directory). An installed plugin that wrote a database into every
project's working directory, in every session of every script and test suite,
would surprise; an environment variable or an option is one line. Idle, it
contributes no hook, so it costs nothing per step.

``chief_only``: workers of a cluster log nothing; ``training_only``: evaluation
sessions log nothing themselves (the training session's run gets their
results, ``eval/*``, through ``after_evaluate``). It provides ``"mlflow"``: an
:class:`MlflowHook` passed in ``hooks=[...]`` takes it over.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._errors import MlflowConfigError
from ._hook import LOG_CHECKPOINTS, MlflowHook
from ._uri import without_password

if TYPE_CHECKING:
    from collections.abc import Mapping

    from monitored import MonitoredSession, TrainingConfig

__all__ = [
    "chief_only",
    "declare_options",
    "is_configured",
    "plugin_status",
    "provides",
    "training_hooks",
    "training_only",
]

#: The session's MLflow run, unless an ``MlflowHook`` passed in ``hooks=[...]`` takes over.
provides: Final = frozenset({"mlflow"})
#: The chief logs the run; workers do not.
chief_only: Final = True
#: Evaluation sessions report to the training session's run instead.
training_only: Final = True


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option("enabled", False, "log to MLflow even without a tracking URI"),
        monitored.Option("tracking_uri", "", "where to log (default: MLFLOW_TRACKING_URI)"),
        monitored.Option("experiment", "", "experiment name (default: monitored)"),
        monitored.Option("run_name", "", "the run's name (default: MLflow's choice)"),
        monitored.Option("log_every_n_steps", 100, "log step scalars every this many steps"),
        monitored.Option("log_checkpoints", "", "checkpoints as artifacts: '', best or all"),
        monitored.Option("best_metric", "loss", "evaluation metric that picks the best"),
        monitored.Option("best_mode", "min", "min or max: which best_metric is better"),
        monitored.Option("params", {}, "hyper-parameters to log", type=dict),
        monitored.Option("tags", {}, "tags to add to the run", type=dict),
        monitored.Option("retries", 3, "retries of a failed request before dropping it"),
        monitored.Option("max_pending", 100_000, "points waiting for the store; thinned past it"),
        monitored.Option(
            "start_timeout_secs", 60.0, "how long the session's start waits for the run"
        ),
    ]


def is_configured(options: Mapping[str, Any]) -> bool:
    """Whether the plugin logs: enabled, given a tracking URI, or ``MLFLOW_TRACKING_URI`` set."""
    return bool(
        options.get("enabled")
        or options.get("tracking_uri")
        or os.environ.get("MLFLOW_TRACKING_URI")
    )


def training_hooks(config: TrainingConfig) -> list[object] | None:
    """An :class:`MlflowHook` for the chief when the plugin is configured; else nothing."""
    options = config.plugin_options.get("mlflow", {})
    log_checkpoints = options.get("log_checkpoints") or None
    if log_checkpoints not in LOG_CHECKPOINTS:  # checked even where idle, so a typo shows
        raise MlflowConfigError(
            f"plugin option mlflow.log_checkpoints must be '', 'best' or 'all', got "
            f"{log_checkpoints!r}"
        )
    if not config.is_chief or not is_configured(options):
        return None
    return [
        MlflowHook(
            options.get("tracking_uri") or None,
            experiment=options.get("experiment") or None,
            run_name=options.get("run_name") or None,
            log_every_n_steps=options.get("log_every_n_steps", 100),
            log_checkpoints=log_checkpoints,
            best_metric=options.get("best_metric", "loss"),
            best_mode=options.get("best_mode", "min"),
            params=options.get("params") or {},
            tags=options.get("tags") or {},
            retries=options.get("retries", 3),
            max_pending=options.get("max_pending", 100_000),
            start_timeout_secs=options.get("start_timeout_secs", 60.0),
        )
    ]


def plugin_status(session: MonitoredSession) -> str:
    """For the "Loaded plugins" line: where this session logs, or how to switch it on."""
    for info in session.plugins:
        if isinstance(info.plugin, MlflowHook):
            return f"logging to {without_password(info.plugin.tracking_uri)}"
    if not session.is_chief:
        return "inactive: only the chief logs"
    if session.training_config is None:
        return "inactive: a MonitoredSession takes no plugin hooks (pass an MlflowHook in hooks=)"
    return "off: set MLFLOW_TRACKING_URI (or the option mlflow.tracking_uri) to log"
