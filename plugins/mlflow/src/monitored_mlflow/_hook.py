"""``MlflowHook``: one MLflow run per training, fed off the step loop.

On a step that is not due the session does not call the hook at all
(``skip_step_hooks``), and a call that finds nothing due compares two integers
and returns: nothing is fetched, converted, locked or awaited. On a due step (every
``log_every_n_steps`` global steps) the step's scalar outputs are copied to host
in one transfer and appended to the sender's list; what summary sinks receive
(``write_summaries``: the scalars the summaries plugin writes, ``global_step/sec``,
the Supervisor's summaries) and evaluation results (``after_evaluate``, prefixed
``eval/``) are appended when they come. A tag is logged once per step: one that
reaches the hook again at the same step (a step output the summaries plugin also
wrote) is not logged twice. A :class:`~monitored_mlflow._sender.Sender` ships them
to a process of its own, which sends them to MLflow.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import math
import os
import posixpath
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio
import anyio.to_thread
import numpy as np

from monitored import PluginError, scalar_outputs, to_host

from ._errors import MlflowConfigError
from ._sender import Sender, SenderConfig
from ._uri import without_password
from ._writer import MAX_PARAM_VALUE_LENGTH

if TYPE_CHECKING:
    from monitored import (
        Coordinator,
        MonitoredSession,
        PluginInfo,
        SessionRunContext,
        SessionRunValues,
    )

__all__ = ["DEFAULT_EXPERIMENT", "LOG_CHECKPOINTS", "MlflowHook", "run_status"]

#: The experiment runs go to unless one is named (or ``MLFLOW_EXPERIMENT_NAME`` is set).
DEFAULT_EXPERIMENT: Final = "monitored"
#: The values of ``log_checkpoints``.
LOG_CHECKPOINTS: Final = (None, "best", "all")
log = logging.getLogger("monitored.mlflow")

#: Plugin options whose contents are logged as parameters or tags of their own.
_LOGGED_AS_THEMSELVES: Final = {"mlflow": ("params", "tags"), "summaries": ("hparams",)}


def run_status(error: BaseException | None) -> str:
    """The MLflow run status for a session that ended with ``error``.

    ``FINISHED`` after a normal end; ``KILLED`` when it was interrupted from
    outside (``KeyboardInterrupt``, ``SystemExit``, a cancellation); ``FAILED``
    for any other exception.
    """
    if error is None:
        return "FINISHED"
    if isinstance(error, KeyboardInterrupt | SystemExit | _cancelled()):
        return "KILLED"
    if isinstance(error, BaseExceptionGroup) and all(
        run_status(inner) == "KILLED" for inner in error.exceptions
    ):
        return "KILLED"
    return "FAILED"


def _cancelled() -> type[BaseException]:
    """The running async library's cancellation exception (asyncio's outside a loop)."""
    try:
        return anyio.get_cancelled_exc_class()
    except anyio.NoEventLoopError:
        return asyncio.CancelledError


class MlflowHook:
    """Logs a training run to MLflow: parameters, scalars, evaluations, checkpoints, status.

    Args:
        tracking_uri: where to log (``http://host:5000``, ``sqlite:///path.db``);
            ``None``: ``MLFLOW_TRACKING_URI``, else MLflow's own default store.
        experiment: the experiment's name (made if missing); ``None``:
            ``MLFLOW_EXPERIMENT_NAME``, else ``"monitored"``.
        run_name: the run's display name (``None``: the name of the training's
            checkpoint directory, ``demo`` for ``runs/demo``; without one, MLflow
            makes one up).
        log_every_n_steps: log the step's scalar outputs every this many global steps.
        log_checkpoints: ``None``, ``"all"`` (every checkpoint a checkpoint plugin
            writes, as artifacts under ``checkpoints/``) or ``"best"`` (the
            checkpoint of each evaluation that improves ``best_metric``).
        best_metric: the evaluation metric ``"best"`` judges by, and
        best_mode: ``"min"`` or ``"max"``.
        params: hyper-parameters to log (nested mappings are flattened with ``.``).
        optimizer: a ``monitored`` optimizer whose settings are logged as ``optimizer.*``.
        tags: run tags to add.
        artifact_location: where a new experiment keeps artifacts (``None``: the
            server's choice; for a ``sqlite:///`` store, ``mlartifacts`` beside the database).
        retries: tries after the first for each request before its items are dropped.
        backoff_secs: the wait before the first retry, doubled after each.
        max_pending: metric points waiting for the store (while it does not
            answer, or is slower than the training): past it, each metric's
            pending points are thinned to every other one, its newest kept, and
            the drop is warned about with its count. Also the steps' records
            the training process keeps while the sender process does not read
            (the newest are dropped past it, counted).
        flush_secs: what gathered is shipped to the sender process every this
            many seconds (at least 0.05), so that one ``log_batch`` carries many steps.
        start_timeout_secs: how long the session's start waits for the run to
            be created (MLflow's import, a new SQLite store's tables: seconds),
            so that the run exists from the first step. It stops waiting at once
            when a first try failed (a server that does not answer: the sender
            goes on trying in the background); past the timeout, a warning,
            and training starts.
    """

    #: Passed in ``hooks=[...]`` it owns the session's MLflow run: the installed
    #: ``mlflow`` plugin adds no second one.
    provides: ClassVar[frozenset[str]] = frozenset({"mlflow"})
    #: Keys the run id in checkpoints whatever the hook's position in ``hooks``.
    plugin_name: ClassVar[str] = "mlflow_run"

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment: str | None = None,
        run_name: str | None = None,
        log_every_n_steps: int = 100,
        log_checkpoints: str | None = None,
        best_metric: str = "loss",
        best_mode: str = "min",
        params: Mapping[str, Any] | None = None,
        optimizer: object = None,
        tags: Mapping[str, Any] | None = None,
        artifact_location: str | None = None,
        retries: int = 3,
        backoff_secs: float = 0.5,
        max_pending: int = 100_000,
        flush_secs: float = 1.0,
        start_timeout_secs: float = 60.0,
    ) -> None:
        if (
            not isinstance(log_every_n_steps, int)
            or isinstance(log_every_n_steps, bool)
            or log_every_n_steps < 1
        ):
            raise MlflowConfigError(
                f"MlflowHook: log_every_n_steps must be a positive int, got {log_every_n_steps!r}"
            )
        if log_checkpoints not in LOG_CHECKPOINTS:
            raise MlflowConfigError(
                f"MlflowHook: log_checkpoints must be None, 'best' or 'all', got "
                f"{log_checkpoints!r}"
            )
        if best_mode not in ("min", "max"):
            raise MlflowConfigError(
                f"MlflowHook: best_mode must be 'min' or 'max', got {best_mode!r}"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise MlflowConfigError(f"MlflowHook: retries must be an int >= 0, got {retries!r}")
        if not backoff_secs >= 0:
            raise MlflowConfigError(
                f"MlflowHook: backoff_secs must be a number >= 0, got {backoff_secs!r}"
            )
        if not flush_secs >= 0:
            raise MlflowConfigError(
                f"MlflowHook: flush_secs must be a number >= 0, got {flush_secs!r}"
            )
        if (
            isinstance(start_timeout_secs, bool)
            or not isinstance(start_timeout_secs, int | float)
            or not start_timeout_secs >= 0
        ):
            raise MlflowConfigError(
                f"MlflowHook: start_timeout_secs must be a number >= 0, got {start_timeout_secs!r}"
            )
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise MlflowConfigError(
                f"MlflowHook: max_pending must be a positive int, got {max_pending!r}"
            )
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        self.experiment = (
            experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        )
        self.run_name = run_name
        self.log_every_n_steps = log_every_n_steps
        self.log_checkpoints = log_checkpoints
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.params = _flatten("MlflowHook: params", dict(params or {}))
        if optimizer is not None:
            self.params.update(optimizer_params(optimizer))
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.artifact_location = artifact_location
        self.retries = retries
        self.backoff_secs = backoff_secs
        self.max_pending = max_pending
        self.flush_secs = flush_secs
        self.start_timeout_secs = float(start_timeout_secs)
        self._sender: Sender | None = None
        self._next_due = 0
        self._run_id: str | None = None
        self._run_key = uuid.uuid4().hex
        self._best: float | None = None
        self._last_checkpoint: tuple[int, str] | None = None
        #: The step of the best evaluation when its checkpoint was not announced
        #: yet: ``after_save`` comes once the write has finished, often later.
        self._best_unsaved: int | None = None
        #: The tags logged at step ``_logged_step`` (a tag is logged once per step).
        self._logged_step = -1
        self._logged: set[str] = set()
        self._active = False
        #: When the session began (ms since the epoch): the new run's start time.
        self._started_ms: int | None = None

    @property
    def sender(self) -> Sender | None:
        """The sender of the running (or last) session: its ``run_id``, ``dropped``, ``sent``."""
        return self._sender

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id, once the sender created or found it."""
        if self._sender is not None and self._sender.run_id is not None:
            return self._sender.run_id
        return self._run_id

    # -- hooks ------------------------------------------------------------------------------
    def begin(self, session: MonitoredSession) -> None:
        # Workers of a cluster log nothing (the chief logs the run).
        self._active = session.is_chief
        self._next_due = 1 << 62 if not self._active else 0
        self._started_ms = int(time.time() * 1000)

    def load_plugin_state(self, session: MonitoredSession, state: Mapping[str, Any]) -> None:
        run_id, run_key = state.get("run_id"), state.get("run_key")
        if run_id is not None and not isinstance(run_id, str):
            raise MlflowConfigError(f"mlflow_run: saved run_id must be a string, got {run_id!r}")
        if not isinstance(run_key, str) or not run_key:
            raise MlflowConfigError(f"mlflow_run: saved run_key must be a string, got {run_key!r}")
        if self._sender is not None:
            return  # a rollback or re-creation: the run goes on as it is
        self._run_id, self._run_key = run_id, run_key
        best = state.get("best")
        self._best = float(best) if isinstance(best, int | float) else None

    def plugin_state(self, session: MonitoredSession) -> dict[str, Any] | None:
        if not self._active:
            return None
        return {"run_id": self.run_id, "run_key": self._run_key, "best": self._best}

    async def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        if not self._active:
            session.skip_step_hooks(self, None)
            return
        step = session.state.global_step
        self._next_due = (step // self.log_every_n_steps + 1) * self.log_every_n_steps
        # The steps before the next due one call nothing of this hook.
        session.skip_step_hooks(self, self._next_due)
        if self._sender is not None:
            return  # re-created after an error: same run
        sender = self._sender = Sender(
            SenderConfig(
                tracking_uri=self.tracking_uri,
                experiment=self.experiment,
                run_name=self.run_name or default_run_name(session),
                run_key=self._run_key,
                run_id=self._run_id,
                artifact_location=self.artifact_location or _artifacts_beside(self.tracking_uri),
                retries=self.retries,
                backoff_secs=self.backoff_secs,
                max_pending=self.max_pending,
                flush_secs=self.flush_secs,
                tags={**_version_tags(session), **self.tags},
                start_time_ms=self._started_ms,
            )
        )
        sender.add_params({**session_params(session), **self.params})
        sender.start()
        # The run exists before the first step: a run that training outpaces, or that
        # is stopped early, is still there, with its parameters.
        # In a thread left behind on a cancellation: a Ctrl-C meanwhile is not held up.
        await anyio.to_thread.run_sync(
            sender.wait_opened, self.start_timeout_secs, abandon_on_cancel=True
        )
        if not sender.opened:
            log.warning(
                "monitored-mlflow: the MLflow run on %s is not created after %gs "
                "(start_timeout_secs); training starts, and its points wait for the run in "
                "the background (at most max_pending=%d, thinned past it)",
                self.tracking_uri or "(MLflow's default store)",
                self.start_timeout_secs,
                self.max_pending,
            )

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        # Sync on purpose: a step that is not due costs an attribute chain and a compare.
        session = run_context.session
        step = session.state.global_step
        if step < self._next_due:
            return
        self._next_due = (step // self.log_every_n_steps + 1) * self.log_every_n_steps
        session.skip_step_hooks(self, self._next_due)
        self._log_outputs(step, session.last_outputs)

    def write_summaries(
        self, session: MonitoredSession, step: int, summaries: Mapping[str, Any]
    ) -> None:
        """The core's summary sink: the summaries plugin's scalars, ``global_step/sec``,
        other hooks' scalars."""
        if self._sender is not None:
            self._log_outputs(step, summaries)

    def after_evaluate(
        self, session: MonitoredSession, step: int, metrics: Mapping[str, Any]
    ) -> None:
        sender = self._sender
        if sender is None:
            return
        values = _scalars(metrics)
        sender.add_metrics(step, {f"eval/{key}": value for key, value in values.items()})
        value = values.get(self.best_metric)
        if value is None or math.isnan(value):
            return
        improved = self._best is None or (
            value < self._best if self.best_mode == "min" else value > self._best
        )
        if improved:
            self._best = value
            if self.log_checkpoints == "best":
                saved = self._last_checkpoint
                if saved is not None and saved[0] == step:
                    self._log_best(saved[1])
                else:
                    self._best_unsaved = step

    def _log_best(self, path: str) -> None:
        sender = self._sender
        assert sender is not None
        self._best_unsaved = None
        sender.add_artifact(path, "checkpoints")
        sender.add_tags({"monitored.best_checkpoint": os.path.basename(path)})

    def after_save(self, session: MonitoredSession, step: int, path: str) -> None:
        if self._sender is None or self.log_checkpoints is None:
            return
        self._last_checkpoint = (step, os.fspath(path))
        if self.log_checkpoints == "all":
            self._sender.add_artifact(os.fspath(path), "checkpoints")
        elif self._best_unsaved == step:
            # The checkpoint of the best evaluation so far, announced after it.
            self._log_best(os.fspath(path))

    def end(self, session: MonitoredSession) -> None:
        # The last step's outputs, unless it was due (they are logged then).
        self._log_outputs(session.state.global_step, session.last_outputs)

    async def before_close(self, session: MonitoredSession, error: BaseException | None) -> None:
        sender = self._sender
        if sender is None:
            return
        await anyio.to_thread.run_sync(
            sender.close, run_status(error), session.stop_grace_period_secs
        )
        self._run_id = sender.run_id

    # -- logging ------------------------------------------------------------------------------
    def _log_outputs(self, step: int, outputs: Any) -> None:
        sender = self._sender
        if sender is None or not isinstance(outputs, Mapping):
            return
        values = _scalars(outputs)
        if step != self._logged_step:
            self._logged_step, self._logged = step, set()
        elif self._logged:
            values = {key: value for key, value in values.items() if key not in self._logged}
        if values:
            sender.add_metrics(step, values)
            self._logged.update(values)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.tracking_uri or 'default store'} {self.experiment!r}>"


def _scalars(values: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of ``values`` by the rule every summary sink follows
    (:func:`monitored.scalar_outputs`), as floats (one transfer off a device)."""
    names: list[str] = []
    picked: list[Any] = []
    out: dict[str, float] = {}
    for key, value in scalar_outputs(values).items():
        if isinstance(value, int | float | np.generic):
            out[key] = float(value)
        elif isinstance(value, np.ndarray):
            out[key] = float(value.item())
        else:
            names.append(key)  # on a device: all of them in one transfer below
            picked.append(value)
    if picked:
        for key, host in zip(names, to_host(picked), strict=True):
            out[key] = float(host.reshape(()))
    return out


def _flatten(what: str, params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` as ``{"a.b": "1"}``: MLflow parameters are flat strings."""
    out: dict[str, str] = {}
    for key, value in params.items():
        if not isinstance(key, str) or not key:
            raise MlflowConfigError(f"{what}: keys must be non-empty strings, got {key!r}")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(what, value, f"{name}."))
        else:
            out[name] = str(value)[:MAX_PARAM_VALUE_LENGTH]
    return out


def optimizer_params(optimizer: object) -> dict[str, str]:
    """A ``monitored`` optimizer's settings: its class, name, learning rate and arguments."""
    out = {"optimizer": type(optimizer).__name__}
    name = getattr(optimizer, "name", None)
    if isinstance(name, str):
        out["optimizer.name"] = name
    if hasattr(optimizer, "learning_rate"):
        out["optimizer.learning_rate"] = str(optimizer.learning_rate)
    config = getattr(optimizer, "_config", None)
    if callable(config):
        settings = config()
        if isinstance(settings, Mapping):
            out.update({f"optimizer.{k}": str(v) for k, v in settings.items()})
    return {k: v[:MAX_PARAM_VALUE_LENGTH] for k, v in out.items()}


def default_run_name(session: MonitoredSession) -> str | None:
    """The run directory's name (``runs/demo``: ``demo``), which a user knows the run by.

    ``None`` without a checkpoint directory: MLflow then makes a name up.
    """
    config = session.training_config
    directory = None if config is None else config.checkpoint_dir
    if not directory:
        return None
    name = posixpath.basename(str(directory).replace("\\", "/").rstrip("/"))
    return name or None


def session_params(session: MonitoredSession) -> dict[str, str]:
    """Parameters a session knows: the training configuration, the plugin options set
    to other than their defaults, and hyper-parameters given to the summaries plugin
    (its HParams) or a hook."""
    params: dict[str, Any] = {}
    config = session.training_config
    if config is not None:
        for name in (
            "checkpoint_dir",
            "save_checkpoint_secs",
            "save_checkpoint_steps",
            "save_summaries_steps",
            "save_summaries_secs",
            "log_step_count_steps",
        ):
            params[f"config.{name}"] = getattr(config, name)
    for info in session.plugins:
        try:
            options = session.options_for(info.name)
        except PluginError:
            options = {}
        changed = _changed_options(info, options)
        if changed:
            params[f"plugin.{info.name}"] = changed
        if info.name == "summaries" and isinstance(options.get("hparams"), Mapping):
            params.update(options["hparams"])
        hparams = getattr(info.plugin, "hparams", None)  # a SummarySaverHook's HParams
        if isinstance(hparams, Mapping):
            params.update(hparams)
    return _flatten("session parameters", params)


def _changed_options(info: PluginInfo, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``info``'s plugin that differ from its declared defaults.

    A default is implied by the plugin's version (a tag of the run); a parameter
    for each would bury the settings someone chose. Options that are logged as
    themselves (the ``mlflow`` plugin's ``params`` and ``tags``, the summaries
    plugin's ``hparams``) are not logged again as options, and a password in a
    URL (a ``tracking_uri``) is not logged at all.
    """
    declare = getattr(info.plugin, "declare_options", None)
    defaults: dict[str, Any] = {}
    if callable(declare):
        for option in declare() or ():
            default = option.default
            defaults[option.name] = list(default) if isinstance(default, tuple) else default
    own = _LOGGED_AS_THEMSELVES.get(info.name, ())
    return {
        key: without_password(value) if isinstance(value, str) else value
        for key, value in options.items()
        if key not in own and (key not in defaults or value != defaults[key])
    }


def _version_tags(session: MonitoredSession) -> dict[str, str]:
    tags = {"monitored.version": _version("monitored")}
    for info in session.plugins:
        if info.distribution is not None and info.version is not None:
            tags[f"monitored.plugin.{info.name}"] = f"{info.distribution} {info.version}"
    return tags


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree
        return "unknown"


def _artifacts_beside(tracking_uri: str | None) -> str | None:
    """For a ``sqlite:///`` store: ``mlartifacts`` beside the database, not in the cwd."""
    if tracking_uri is None or not tracking_uri.startswith("sqlite:///"):
        return None
    database = os.path.abspath(tracking_uri[len("sqlite:///") :])
    return "file://" + os.path.join(os.path.dirname(database), "mlartifacts")
