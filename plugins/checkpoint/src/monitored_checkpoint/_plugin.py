"""The ``checkpoint`` entry point of the ``monitored`` plugin group.

Gives ``MonitoredTrainingSession`` its checkpoints: on the chief with a
``checkpoint_dir``, a :class:`CheckpointSaverHook` saving every
``save_checkpoint_secs`` (or ``save_checkpoint_steps``) and restoring on start,
or, with both set to ``None``, a :class:`CheckpointRestoreHook` that only
restores (as TF1 does). ``chief_only`` makes the core skip this plugin on workers,
``training_only`` in evaluation sessions (which restore through the evaluation's own hook).

Options (``plugin_options={"checkpoint": {...}}`` or ``MONITORED_PLUGIN_OPTIONS``):
``max_to_keep`` and ``keep_checkpoint_every_n_hours``, the :class:`Saver`'s
(TF's ``RunConfig(keep_checkpoint_max=..., keep_checkpoint_every_n_hours=...)``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._hook import CheckpointRestoreHook, CheckpointSaverHook
from ._saver import Saver

if TYPE_CHECKING:
    from monitored import TrainingConfig

__all__ = ["chief_only", "declare_options", "training_hooks", "training_only"]

#: Checkpoints are written and restored by the chief only.
chief_only: Final = True
#: Evaluation sessions save no checkpoints.
training_only: Final = True


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option(
            "max_to_keep", 5, "checkpoints kept (0: all); RunConfig's keep_checkpoint_max"
        ),
        monitored.Option(
            "keep_checkpoint_every_n_hours",
            10000.0,
            "past max_to_keep, keep one checkpoint per this many hours",
        ),
    ]


def training_hooks(config: TrainingConfig) -> list[object] | None:
    """The checkpoint hook for ``config``; when both intervals are set, seconds win (TF1)."""
    saver = _saver(config.plugin_options.get("checkpoint", {}))  # checked even on workers
    if not config.is_chief or config.checkpoint_dir is None:
        return None
    secs, steps = config.save_checkpoint_secs, config.save_checkpoint_steps
    if secs is not None and secs > 0:
        return [CheckpointSaverHook(config.checkpoint_dir, save_secs=secs, saver=saver)]
    if steps is not None and steps > 0:
        return [CheckpointSaverHook(config.checkpoint_dir, save_steps=steps, saver=saver)]
    return [CheckpointRestoreHook(config.checkpoint_dir)]


def _saver(options: Any) -> Saver:
    """The :class:`Saver` of the plugin's options; a value it cannot use names the option."""
    keep = options.get("max_to_keep", 5)
    hours = options.get("keep_checkpoint_every_n_hours", 10000.0)
    if keep < 0:
        raise monitored.PluginOptionError(
            f"plugin option checkpoint.max_to_keep={keep}: give the number of checkpoints "
            "to keep, or 0 to keep them all",
            plugin="checkpoint",
        )
    if not hours > 0 or math.isnan(hours):
        raise monitored.PluginOptionError(
            f"plugin option checkpoint.keep_checkpoint_every_n_hours={hours}: give a "
            "positive number of hours",
            plugin="checkpoint",
        )
    return Saver(max_to_keep=keep, keep_checkpoint_every_n_hours=hours)
