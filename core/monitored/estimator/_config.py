"""``RunConfig``: the TF ``tf.estimator.RunConfig`` fields that mean something here."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any, final

from .._core._errors import UnsupportedArgumentError
from ._errors import EstimatorError

__all__ = ["RunConfig"]

#: TF's fields with no counterpart, and why.
_NOT_HERE = {
    "session_config": "there is no tf.Session to configure",
    "train_distribute": "distribution is the monitored-mpi plugin (docs/scaling-out.md)",
    "eval_distribute": "distribution is the monitored-mpi plugin (docs/scaling-out.md)",
    "device_fn": "arrays are placed by their module (NumPy or CuPy), not by a device function",
    "protocol": "there is no TF server",
    "experimental_distribute": "distribution is the monitored-mpi plugin",
}


@final
@dataclasses.dataclass(frozen=True, slots=True, init=False)
class RunConfig:
    """Where and how often an :class:`Estimator` writes: TF's ``RunConfig`` with its defaults.

    ``save_checkpoints_steps`` and ``save_checkpoints_secs`` are exclusive (TF's
    600 s when neither is given); ``save_summary_steps`` (100) writes the loss
    and the step rate; ``keep_checkpoint_max`` (5) and
    ``keep_checkpoint_every_n_hours`` (10,000) are the checkpoint plugin's
    retention; ``log_step_count_steps`` (100) logs the loss and ``global_step/sec``;
    ``tf_random_seed`` seeds the state's generator (variables' initial values,
    anything ``model_fn`` draws). ``task_type``, ``task_id`` and ``is_chief``
    come from the ``TF_CONFIG`` environment variable when it is set
    (:func:`monitored.estimator.learn_runner.run` picks a schedule from them).
    TF's ``session_config``, ``train_distribute``, ``device_fn`` and ``protocol``
    are refused with the reason.
    """

    model_dir: str | None = None
    tf_random_seed: int | None = None
    save_summary_steps: int = 100
    save_checkpoints_steps: int | None = None
    save_checkpoints_secs: float | None = None
    keep_checkpoint_max: int | None = 5
    keep_checkpoint_every_n_hours: float = 10000
    log_step_count_steps: int | None = 100
    task_type: str | None = None
    task_id: int = 0
    is_chief: bool = True

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, **fields: Any) -> None:
        for name in fields:
            if name in _NOT_HERE:
                raise UnsupportedArgumentError(f"RunConfig({name}=...): {_NOT_HERE[name]}")
            if name not in RunConfig.__dataclass_fields__ or name == "model_dir":
                raise EstimatorError(f"RunConfig({name}=...): not a RunConfig field")
        task = _task_from_env()
        values: dict[str, Any] = {
            name: field.default for name, field in RunConfig.__dataclass_fields__.items()
        }
        values.update(task)
        values.update(fields)
        values["model_dir"] = os.fspath(model_dir) if model_dir is not None else None
        if (
            values["save_checkpoints_steps"] is not None
            and values["save_checkpoints_secs"] is not None
        ):
            raise EstimatorError(
                "RunConfig: save_checkpoints_steps and save_checkpoints_secs cannot both be set"
            )
        if values["save_checkpoints_steps"] is None and values["save_checkpoints_secs"] is None:
            values["save_checkpoints_secs"] = 600
        for name in (
            "save_summary_steps",
            "save_checkpoints_steps",
            "keep_checkpoint_max",
            "log_step_count_steps",
            "tf_random_seed",
        ):
            value = values[name]
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise EstimatorError(f"RunConfig({name}={value!r}): a whole number >= 0 or None")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def replace(self, **fields: Any) -> RunConfig:
        """A copy with ``fields`` changed (TF's ``RunConfig.replace``)."""
        current = {
            name: getattr(self, name)
            for name in RunConfig.__dataclass_fields__
            if name != "model_dir"
        }
        if "save_checkpoints_steps" in fields and "save_checkpoints_secs" not in fields:
            current["save_checkpoints_secs"] = None
        if "save_checkpoints_secs" in fields and "save_checkpoints_steps" not in fields:
            current["save_checkpoints_steps"] = None
        current.update(fields)
        model_dir = current.pop("model_dir", self.model_dir)
        return RunConfig(model_dir, **current)

    def session_options(self) -> dict[str, Any]:
        """The :func:`~monitored.MonitoredTrainingSession` arguments these fields mean."""
        return {
            "save_checkpoint_steps": self.save_checkpoints_steps,
            "save_checkpoint_secs": self.save_checkpoints_secs,
            "save_summaries_steps": self.save_summary_steps or None,
            "log_step_count_steps": self.log_step_count_steps or None,
        }


def _task_from_env() -> dict[str, Any]:
    """``task_type``/``task_id``/``is_chief`` from ``TF_CONFIG``, as TF's RunConfig reads it."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise EstimatorError(f"TF_CONFIG is not valid JSON: {exc}") from None
    task = config.get("task") if isinstance(config, Mapping) else None
    if not isinstance(task, Mapping):
        return {}
    task_type = task.get("type")
    task_id = task.get("index", 0)
    if not isinstance(task_type, str) or isinstance(task_id, bool) or not isinstance(task_id, int):
        raise EstimatorError(
            "TF_CONFIG's task must be {'type': <str>, 'index': <int>}, got "
            f"{json.dumps(task)[:200]!r}"
        )
    is_chief = task_type in ("chief", "master") or (
        task_type == "worker" and task_id == 0 and "chief" not in config.get("cluster", {})
    )
    return {"task_type": task_type, "task_id": task_id, "is_chief": is_chief}
