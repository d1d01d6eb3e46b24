"""Reading a checkpoint's arrays without a state: warm starts and inspection.

TF1's ``tf.train.load_checkpoint`` / ``list_variables`` for this format. A
warm start (``monitored.train.warm_start``) copies some arrays of another run's
checkpoint into a new state; it reads them here, through the same hardened
reader as a restore (bounded reads, regular files only, names kept in their
directory, sizes and CRC-32 checked before anything is used).
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import numpy as np

from ._errors import CheckpointError, CheckpointNotFoundError
from ._format import MANIFEST_SUFFIX, Manifest, check_step_name, read_arrays, read_manifest
from ._saver import latest_checkpoint, split_save_path
from ._store import open_store

__all__ = ["list_variables", "load_variable", "read_checkpoint", "resolve_checkpoint"]


def resolve_checkpoint(ckpt_dir_or_file: str | os.PathLike[str]) -> str:
    """The checkpoint path ``ckpt_dir_or_file`` names.

    A directory names its newest checkpoint (:func:`latest_checkpoint`); any
    other path names the checkpoint whose manifest ``<path>.json`` sits beside
    it (``runs/a/model.ckpt-100``). A directory is taken as a directory even when
    a file ``<directory>.json`` sits beside it (``runs/pretrained/`` and a
    config ``runs/pretrained.json``). Raises :class:`CheckpointNotFoundError`
    when it is neither, or a directory without a checkpoint.
    """
    given = os.fspath(ckpt_dir_or_file)
    trimmed = given.rstrip("/") or given
    if open_store(trimmed).is_directory():
        found = latest_checkpoint(trimmed)
        if found is None:
            raise CheckpointNotFoundError(
                f"{given} is a directory without a checkpoint (no checkpoint manifest "
                f"*{MANIFEST_SUFFIX} in it); give a directory holding one, or a checkpoint path"
            )
        return found
    store, name = split_save_path(trimmed)
    if name + MANIFEST_SUFFIX in store.list():
        return store.path(name)
    raise CheckpointNotFoundError(
        f"{given} is neither a checkpoint (there is no {name}{MANIFEST_SUFFIX} beside it) "
        "nor a directory holding one"
    )


def read_checkpoint(
    ckpt_dir_or_file: str | os.PathLike[str],
) -> tuple[Manifest, dict[str, np.ndarray[Any, Any]]]:
    """The manifest and every array (as NumPy) of a checkpoint or a directory's newest.

    The whole data file is read and verified (its CRC-32 covers the file, not
    each array), so memory holds the checkpoint's arrays once. Raises
    :class:`CheckpointNotFoundError`, :class:`CorruptCheckpointError` (naming the
    file and what is wrong) or :class:`CheckpointVersionError`.
    """
    store, name = split_save_path(resolve_checkpoint(ckpt_dir_or_file))
    manifest = read_manifest(store, name)
    check_step_name(manifest)
    return manifest, read_arrays(store, manifest)


def list_variables(ckpt_dir_or_file: str | os.PathLike[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every array of a checkpoint, sorted by name (TF1's function).

    Reads only the manifest.
    """
    store, name = split_save_path(resolve_checkpoint(ckpt_dir_or_file))
    manifest = read_manifest(store, name)
    check_step_name(manifest)
    return sorted((n, info.shape) for n, info in manifest.arrays.items())


def load_variable(ckpt_dir_or_file: str | os.PathLike[str], name: str) -> np.ndarray[Any, Any]:
    """The array ``name`` of a checkpoint or a directory's newest, as NumPy (TF1's function).

    The checkpoint is read and verified whole (its CRC-32 covers the data file,
    not each array), then every other array is dropped. A name the checkpoint
    does not hold is a :class:`CheckpointError` listing the close ones.
    """
    manifest, arrays = read_checkpoint(ckpt_dir_or_file)
    if name not in arrays:
        close = difflib.get_close_matches(name, list(arrays), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise CheckpointError(
            f"checkpoint {manifest.path} (step {manifest.step}) holds no array {name!r}"
            f"{hint} ({len(arrays)} arrays: monitored checkpoint show {manifest.path})"
        )
    return arrays[name]
