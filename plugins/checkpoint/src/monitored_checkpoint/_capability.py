"""The ``"checkpoint"`` capability hooks, as plain functions.

The plugin module exposes them (the core and other plugins call them through
``monitored.provider("checkpoint")``), and so do :class:`CheckpointSaverHook`
and :class:`CheckpointRestoreHook`: passed explicitly, such a hook owns the
session's checkpoints and serves another plugin's ``monitored.provider(
"checkpoint", session=...)`` even when the installed plugin is disabled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._errors import CheckpointError
from ._format import check_session_plugin_states, check_step_name, read_manifest
from ._saver import Saver, _complete_names, split_save_path
from ._saver import latest_checkpoint as _latest_checkpoint
from ._saver import restore as _restore
from ._store import open_store

if TYPE_CHECKING:
    from monitored import TrainState

__all__ = ["latest_checkpoint", "list_checkpoints", "restore_checkpoint", "save_checkpoint"]

log = logging.getLogger("monitored.checkpoint")


def latest_checkpoint(checkpoint_dir: str) -> str | None:
    """The newest checkpoint of ``checkpoint_dir``, or ``None`` (:func:`.latest_checkpoint`)."""
    return _latest_checkpoint(checkpoint_dir)


def restore_checkpoint(state: TrainState, path: str) -> str:
    """Restore ``state`` from ``path`` (:func:`monitored_checkpoint.restore`); returns ``path``."""
    _restore(state, path)
    return path


def list_checkpoints(checkpoint_dir: str) -> list[tuple[str, int, Mapping[str, Any]]]:
    """``(path, step, plugin states)`` of each readable checkpoint, oldest step first.

    Every checkpoint whose manifest and data file are both in the directory (not
    only those the state file keeps); one whose manifest cannot be read, or
    holds plugin states of the wrong layout, is left out with a warning. The
    data files are not read: restoring one verifies it.
    """
    store = open_store(checkpoint_dir)
    found: list[tuple[int, str, Mapping[str, Any]]] = []
    for name in _complete_names(store, store.list()):
        try:
            manifest = read_manifest(store, name)
            check_step_name(manifest)
            check_session_plugin_states(manifest)
        except (CheckpointError, OSError) as exc:
            log.warning("leaving out %s: %s", store.path(name), exc)
            continue
        found.append((manifest.step, store.path(name), manifest.plugins))
    found.sort(key=lambda entry: (entry[0], entry[1]))
    return [(path, step, plugins) for step, path, plugins in found]


def save_checkpoint(
    state: TrainState,
    checkpoint_dir: str,
    basename: str,
    step: int,
    plugin_states: Mapping[str, Any],
    max_to_keep: int,
) -> str:
    """Write ``<checkpoint_dir>/<basename>-<step>``; keep the directory's newest ``max_to_keep``.

    A :class:`Saver` made for the call: it adopts the checkpoints the
    directory's state file lists, so the rotation spans calls.
    """
    save_path = os.path.join(os.fspath(checkpoint_dir), basename)
    _, name = split_save_path(save_path)
    if name != basename:
        raise ValueError(f"checkpoint basename {basename!r} must be a plain name")
    saver = Saver(max_to_keep=max_to_keep)
    return saver.save(state, save_path, step, plugin_states=plugin_states)
