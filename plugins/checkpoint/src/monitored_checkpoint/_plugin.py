"""The ``checkpoint`` entry point of the ``monitored`` plugin group.

Gives ``MonitoredTrainingSession`` its checkpoints: on the chief with a
``checkpoint_dir``, a :class:`CheckpointSaverHook` saving every
``save_checkpoint_secs`` (or ``save_checkpoint_steps``) and restoring on start,
or, with both set to ``None``, a :class:`CheckpointRestoreHook` that only
restores (as TF1 does). ``chief_only`` makes the core skip this plugin on workers,
``training_only`` in evaluation sessions (which restore through the evaluation's own hook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._hook import CheckpointRestoreHook, CheckpointSaverHook

if TYPE_CHECKING:
    from monitored import TrainingConfig

__all__ = ["chief_only", "training_hooks", "training_only"]

#: Checkpoints are written and restored by the chief only.
chief_only: Final = True
#: Evaluation sessions save no checkpoints.
training_only: Final = True


def training_hooks(config: TrainingConfig) -> list[object] | None:
    """The checkpoint hook for ``config``; when both intervals are set, seconds win (TF1)."""
    if not config.is_chief or config.checkpoint_dir is None:
        return None
    secs, steps = config.save_checkpoint_secs, config.save_checkpoint_steps
    if secs is not None and secs > 0:
        return [CheckpointSaverHook(config.checkpoint_dir, save_secs=secs)]
    if steps is not None and steps > 0:
        return [CheckpointSaverHook(config.checkpoint_dir, save_steps=steps)]
    return [CheckpointRestoreHook(config.checkpoint_dir)]
