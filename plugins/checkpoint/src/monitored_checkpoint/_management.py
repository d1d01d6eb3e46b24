"""TF1's checkpoint-management functions and ``tf.train.CheckpointManager``.

The module-level helpers of ``tf.train`` that scripts call around a saver
(``checkpoint_exists``, ``get_checkpoint_mtimes``, ``remove_checkpoint``,
``generate_checkpoint_state_proto``, ``update_checkpoint_state``) and the
manager that numbers, keeps and rotates a directory's checkpoints. All of them
work on checkpoints of this package, through :class:`~monitored_checkpoint.Saver`.

Two safety rules differ from TF1 on purpose: every checkpoint a state file
names must be a file of its directory (TF1 accepts any path, ``./x`` and
``../y`` included), and a checkpoint is deleted only if its files show they are
ours. And as TF1's manager, a manager tracks (and so may delete) only the
checkpoints a rotating saver wrote: one saved beside it by a saver that keeps
all, or listed by :func:`update_checkpoint_state`, is never deleted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, final

import numpy as np

from monitored import TrainState

from ._format import DATA_SUFFIX, MANIFEST_SUFFIX
from ._saver import (
    STATE_FILENAME,
    CheckpointState,
    Saver,
    _delete_checkpoint,
    _format_state,
    _state_of,
    checkpoint_mtimes,
    latest_checkpoint,
    split_save_path,
)
from ._store import is_plain_name, open_store, write_all

__all__ = [
    "CheckpointManager",
    "checkpoint_exists",
    "generate_checkpoint_state_proto",
    "get_checkpoint_mtimes",
    "remove_checkpoint",
    "update_checkpoint_state",
]


def checkpoint_exists(checkpoint_prefix: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint ``checkpoint_prefix`` (``dir/model.ckpt-5``) is on disk, whole.

    Both of its files must be listed: the manifest and the data file. Decided
    from the directory's listing; nothing is read, and a missing directory is
    ``False``.
    """
    store, name = split_save_path(checkpoint_prefix)
    try:
        names = set(store.list())
    except (FileNotFoundError, NotADirectoryError):
        return False
    return name + MANIFEST_SUFFIX in names and name + DATA_SUFFIX in names


def get_checkpoint_mtimes(checkpoint_prefixes: Sequence[str | os.PathLike[str]]) -> list[float]:
    """The modification times of the checkpoints that exist, in order; absent ones left out."""
    return checkpoint_mtimes([os.fspath(prefix) for prefix in checkpoint_prefixes])


def remove_checkpoint(
    checkpoint_prefix: str | os.PathLike[str],
    checkpoint_format_version: object = None,
    meta_graph_suffix: str = "meta",
) -> None:
    """Delete the checkpoint ``checkpoint_prefix``: its manifest first, then its data file.

    Only files that show they are part of a checkpoint of ours are deleted
    (another file of that name is left, with a warning). The last two
    arguments are TF1's and mean nothing here: one format, no meta graph.
    """
    del checkpoint_format_version, meta_graph_suffix
    store, name = split_save_path(checkpoint_prefix)
    _delete_checkpoint(store, name)


def _name_in(save_dir: str, path: str) -> str:
    """The file name of ``path`` in ``save_dir``; ``ValueError`` if it is not a file of it.

    ``path`` is absolute, or relative to the working directory as in TF1
    (``train/model-2`` for ``save_dir="train"``).
    """
    if "://" in save_dir or "://" in path:
        base = save_dir.rstrip("/") + "/"
        name = path[len(base) :] if path.startswith(base) else ""
    elif os.path.dirname(os.path.abspath(path)) == os.path.abspath(save_dir):
        name = os.path.basename(path)
    else:
        name = ""
    if not is_plain_name(name):
        raise ValueError(
            f"checkpoint {path!r} is not a file of the directory {save_dir!r}: a state file "
            "names only checkpoints of its own directory"
        )
    return name


def generate_checkpoint_state_proto(
    save_dir: str | os.PathLike[str],
    model_checkpoint_path: str | os.PathLike[str],
    all_model_checkpoint_paths: Sequence[str | os.PathLike[str]] | None = None,
    all_model_checkpoint_timestamps: Sequence[float] | None = None,
    last_preserved_timestamp: float | None = None,
) -> CheckpointState:
    """A :class:`CheckpointState` naming ``model_checkpoint_path`` as the newest (TF1's).

    ``all_model_checkpoint_paths`` gets ``model_checkpoint_path`` appended when it
    does not end with it. Paths are kept as given, except that with a relative
    ``save_dir`` a relative path is made relative to it (``train/model-0`` ->
    ``model-0``), as in TF1. Each must name a file of ``save_dir``
    (``ValueError`` otherwise); so must timestamps match the paths one to one.
    """
    directory = os.fspath(save_dir)
    newest = os.fspath(model_checkpoint_path)
    paths = [os.fspath(p) for p in all_model_checkpoint_paths or ()]
    if not paths or paths[-1] != newest:
        paths.append(newest)
    stamps = tuple(float(t) for t in all_model_checkpoint_timestamps or ())
    if stamps and len(stamps) != len(paths):
        raise ValueError(
            f"{len(stamps)} checkpoint timestamps given for {len(paths)} checkpoint paths"
        )
    names = tuple(_name_in(directory, path) for path in paths)

    def shown(path: str, name: str) -> str:
        relative = "://" not in directory and not os.path.isabs(directory)
        return name if relative and not os.path.isabs(path) else path

    return CheckpointState(
        model_checkpoint_path=shown(newest, names[-1]),
        all_model_checkpoint_paths=tuple(shown(p, n) for p, n in zip(paths, names, strict=True)),
        all_model_checkpoint_timestamps=stamps,
        last_preserved_timestamp=float(last_preserved_timestamp or 0.0),
        names=names,
    )


def update_checkpoint_state(
    save_dir: str | os.PathLike[str],
    model_checkpoint_path: str | os.PathLike[str],
    all_model_checkpoint_paths: Sequence[str | os.PathLike[str]] | None = None,
    latest_filename: str | None = None,
    all_model_checkpoint_timestamps: Sequence[float] | None = None,
    last_preserved_timestamp: float | None = None,
) -> None:
    """Write the ``checkpoint`` state file of ``save_dir`` (TF1's), atomically.

    The arguments are :func:`generate_checkpoint_state_proto`'s. Checkpoints listed
    without timestamps are never deleted by a saver or a manager that later
    takes the directory over (they were not written by it).
    """
    if latest_filename not in (None, STATE_FILENAME):
        raise ValueError(f"latest_filename must be {STATE_FILENAME!r}, got {latest_filename!r}")
    state = generate_checkpoint_state_proto(
        save_dir,
        model_checkpoint_path,
        all_model_checkpoint_paths,
        all_model_checkpoint_timestamps,
        last_preserved_timestamp,
    )
    store = open_store(save_dir)
    text = _format_state(
        state.names, state.all_model_checkpoint_timestamps, state.last_preserved_timestamp
    )
    store.write(STATE_FILENAME, lambda f: write_all(f, text))


@final
class CheckpointManager:
    """Numbers, keeps and rotates the checkpoints of one directory (``tf.train.CheckpointManager``).

    Args:
        checkpoint: the :class:`~monitored.TrainState` to save, or the session
            that trains it (TF's ``tf.train.Checkpoint``).
        directory: where checkpoints go, as ``<directory>/<checkpoint_name>-<number>``.
        max_to_keep: how many to keep; ``None`` keeps (and tracks) all of them.
        keep_checkpoint_every_n_hours: past ``max_to_keep``, keep one per this many
            hours, counted from the manager's creation (``None``: none).
        checkpoint_name: the checkpoints' prefix (``"ckpt"``).
        step_counter: what ``checkpoint_interval`` counts: a callable, an int-like
            (a 0-d array of the state), or ``None`` for the state's global step.
        checkpoint_interval: with ``save(check_interval=True)``, save only once the
            step counter has moved this far since the last save.
        init_fn: called by :meth:`restore_or_initialize` when there is nothing to restore.
        last_checkpoint_step: the step of the last save, for ``checkpoint_interval``.

    The manager takes over the checkpoints its directory's state file tracks
    (those a rotating saver or manager wrote, with their timestamps); others
    are never deleted. A checkpoint is numbered by ``checkpoint_number``, else
    by the state's global step, which it also records (TF numbers by a save
    counter of its own).
    """

    __slots__ = (
        "_checkpoint",
        "_checkpoint_interval",
        "_directory",
        "_init_fn",
        "_last_checkpoint_step",
        "_latest",
        "_prefix",
        "_saver",
        "_step_counter",
    )

    def __init__(
        self,
        checkpoint: Any,
        directory: str | os.PathLike[str],
        max_to_keep: int | None,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], object] | None = None,
        last_checkpoint_step: int | None = None,
    ) -> None:
        _state_of(checkpoint, "CheckpointManager")
        if max_to_keep is not None and max_to_keep <= 0:
            raise ValueError(f"max_to_keep must be positive or None, got {max_to_keep}")
        if checkpoint_interval is not None and checkpoint_interval <= 0:
            raise ValueError(f"checkpoint_interval must be positive, got {checkpoint_interval}")
        if not checkpoint_name or not is_plain_name(f"{checkpoint_name}-0"):
            raise ValueError(f"checkpoint_name must be a plain file name, got {checkpoint_name!r}")
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._prefix = open_store(self._directory).path(checkpoint_name)
        self._saver = Saver(
            max_to_keep=sys.maxsize if max_to_keep is None else max_to_keep,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours or float("inf"),
        )
        self._saver.prepare(self._prefix)
        self._latest = latest_checkpoint(self._directory)
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._last_checkpoint_step = last_checkpoint_step

    @property
    def directory(self) -> str:
        """The directory of the checkpoints, as given."""
        return self._directory

    @property
    def checkpoint_interval(self) -> int | None:
        """Steps between two saves with ``save(check_interval=True)``; ``None``: every call."""
        return self._checkpoint_interval

    @property
    def checkpoints(self) -> list[str]:
        """The checkpoints the manager tracks (and may delete), oldest first."""
        return self._saver.last_checkpoints

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint: the last saved, else the directory's newest at creation."""
        return self._latest

    def _current_step(self, state: TrainState) -> int:
        counter = self._step_counter
        if counter is None:
            return state.global_step
        return int(np.asarray(counter() if callable(counter) else counter))

    def save(self, checkpoint_number: Any = None, check_interval: bool = True) -> str | None:
        """Save a checkpoint, rotate the old ones, and return its path.

        ``None`` (nothing saved) when a ``checkpoint_interval`` is set and the step
        counter has not moved since the last save, or (with ``check_interval``)
        has not moved ``checkpoint_interval`` steps.
        """
        state = _state_of(self._checkpoint, "CheckpointManager.save")
        if self._checkpoint_interval is not None:
            current = self._current_step(state)
            last = self._last_checkpoint_step
            if last is not None:
                if current == last:
                    return None
                if check_interval and current < last + self._checkpoint_interval:
                    return None
            self._last_checkpoint_step = current
        number = None if checkpoint_number is None else int(np.asarray(checkpoint_number))
        self._latest = self._saver.save(state, self._prefix, number)
        return self._latest

    def restore_or_initialize(self) -> str | None:
        """Restore the newest checkpoint, return its path; else call ``init_fn`` (``None``)."""
        state = _state_of(self._checkpoint, "CheckpointManager.restore_or_initialize")
        path = self._latest
        if path is not None:
            self._saver.restore(state, path)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = self._current_step(state)
            return path
        if self._init_fn is not None:
            self._init_fn()
        return None
