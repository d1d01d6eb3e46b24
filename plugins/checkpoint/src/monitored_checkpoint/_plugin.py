"""The ``checkpoint`` entry point of the ``monitored`` plugin group.

Gives ``MonitoredTrainingSession`` its checkpoints: on the chief with a
``checkpoint_dir``, a :class:`CheckpointSaverHook` saving every
``save_checkpoint_secs`` (or ``save_checkpoint_steps``) and restoring on start,
or, with both set to ``None``, a :class:`CheckpointRestoreHook` that only
restores (as TF1 does). ``chief_only`` makes the core skip this plugin on workers,
``training_only`` in evaluation sessions (which restore through the evaluation's own hook).

It provides the ``"checkpoint"`` capability: a :class:`CheckpointSaverHook` or
:class:`CheckpointRestoreHook` passed in ``hooks=[...]`` takes it over (this
plugin then adds nothing to that session), and the core reads, restores and
finds checkpoints through the capability hooks below, never by importing this
package; so do other plugins (a NaN guard's rollback lists and restores
checkpoints, early stopping saves and restores its best one).

Options (``plugin_options={"checkpoint": {...}}`` or ``MONITORED_PLUGIN_OPTIONS``):
``max_to_keep`` and ``keep_checkpoint_every_n_hours``, the :class:`Saver`'s
(TF's ``RunConfig(keep_checkpoint_max=..., keep_checkpoint_every_n_hours=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import monitored

from ._capability import latest_checkpoint, list_checkpoints, restore_checkpoint, save_checkpoint
from ._hook import CheckpointRestoreHook, CheckpointSaverHook
from ._reader import read_checkpoint as _read_checkpoint
from ._saver import CheckpointsIterator, Saver
from ._saver import checkpoints_iterator as _checkpoints_iterator

if TYPE_CHECKING:
    from monitored import Commands, TrainingConfig

__all__ = [
    "checkpoint_hooks",
    "checkpoint_saver",
    "checkpoints_iterator",
    "chief_only",
    "declare_options",
    "latest_checkpoint",
    "list_checkpoints",
    "provides",
    "read_checkpoint",
    "register_commands",
    "restore_checkpoint",
    "save_checkpoint",
    "training_hooks",
    "training_only",
]

#: The capability this plugin owns unless an explicit checkpoint hook takes it over.
provides: Final = frozenset({"checkpoint"})
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


def read_checkpoint(path: str) -> tuple[str, Mapping[str, Any]]:
    """``(resolved path, arrays)`` of a checkpoint or a directory's newest."""
    manifest, arrays = _read_checkpoint(path)
    return manifest.path, arrays


def checkpoints_iterator(
    checkpoint_dir: str,
    min_interval_secs: float,
    timeout: float | None,
    timeout_fn: Callable[[], Any] | None,
    poll_secs: float | None,
) -> CheckpointsIterator:
    """New checkpoints of ``checkpoint_dir`` as they appear (:func:`checkpoints_iterator`)."""
    return _checkpoints_iterator(
        checkpoint_dir,
        min_interval_secs,
        timeout,
        timeout_fn,
        poll_secs=1.0 if poll_secs is None else poll_secs,
    )


def checkpoint_saver(saver: object | None) -> Saver:
    """A new :class:`Saver` for ``None``; ``saver`` itself when it is one."""
    if saver is None:
        return Saver()
    if not isinstance(saver, Saver):
        raise TypeError(
            f"got {type(saver).__name__}; pass a monitored_checkpoint.Saver "
            "(e.g. Saver(max_to_keep=10))"
        )
    return saver


def checkpoint_hooks(
    checkpoint_dir: str, save_secs: float | None, saver: object, checkpoint_basename: str
) -> list[object]:
    """A :class:`CheckpointSaverHook` saving every ``save_secs``, else a restore-only hook."""
    if save_secs:
        return [
            CheckpointSaverHook(
                checkpoint_dir,
                save_secs=save_secs,
                saver=checkpoint_saver(saver),
                checkpoint_basename=checkpoint_basename,
            )
        ]
    return [CheckpointRestoreHook(checkpoint_dir)]


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


def register_commands(commands: Commands) -> None:
    """``monitored checkpoint ls|show|diff|verify`` (imported only when the CLI runs)."""
    from ._cli import register

    register(commands)
