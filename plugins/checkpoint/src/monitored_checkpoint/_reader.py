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
from typing import Any, Final

import numpy as np

from ._entries import entry_names, local_directory
from ._errors import CheckpointError, CheckpointNotFoundError
from ._format import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    Manifest,
    check_step_name,
    read_arrays,
    read_manifest,
)
from ._saver import latest_checkpoint, split_save_path
from ._store import Store, open_store

__all__ = [
    "list_variables",
    "load_variable",
    "locate_checkpoint",
    "read_checkpoint",
    "resolve_checkpoint",
]


def resolve_checkpoint(ckpt_dir_or_file: str | os.PathLike[str]) -> str:
    """The checkpoint path ``ckpt_dir_or_file`` names.

    A directory names its newest checkpoint (:func:`latest_checkpoint`); any
    other path names the checkpoint whose manifest ``<path>.json`` sits beside
    it (``runs/a/model.ckpt-100``), or is the path of its manifest or data file
    (``runs/a/model.ckpt-100.json``, ``.safetensors``: what a shell's completion
    gives). A manifest that is there but is no regular file (a FIFO, a
    directory) still names its checkpoint: reading it then says what it is. A
    directory is taken as a directory even when a file ``<directory>.json``
    sits beside it (``runs/pretrained/`` and a config ``runs/pretrained.json``).
    Raises :class:`CheckpointNotFoundError` when it is neither, or a directory
    without a checkpoint.
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
    store, name = locate_checkpoint(trimmed)
    return store.path(name)


def locate_checkpoint(path: str) -> tuple[Store, str]:
    """The store and the name of the checkpoint that ``path`` (not a directory) names.

    ``dir/model.ckpt-5``, ``dir/model.ckpt-5.json`` or ``dir/model.ckpt-5.safetensors``
    -> (the store of ``dir``, ``"model.ckpt-5"``), when ``dir`` has an entry
    ``model.ckpt-5.json`` of any kind; else :class:`CheckpointNotFoundError`.
    """
    store, name = split_save_path(path)
    entries = set(entry_names(store))
    if name + MANIFEST_SUFFIX in entries:
        return store, name
    stem = name
    for suffix in (MANIFEST_SUFFIX, DATA_SUFFIX):
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)]
            if stem + MANIFEST_SUFFIX in entries:
                return store, stem
    directory = local_directory(store)
    if directory is not None and not os.path.lexists(directory):
        raise CheckpointNotFoundError(f"{path} does not exist: there is no directory {store.url}")
    if directory is not None and not os.path.lexists(os.path.join(directory, name)):
        raise CheckpointNotFoundError(
            f"{path} does not exist: it is no directory, and no checkpoint (there is no "
            f"{stem}{MANIFEST_SUFFIX} beside it)"
        )
    raise CheckpointNotFoundError(
        f"{path} is neither a checkpoint (there is no {stem}{MANIFEST_SUFFIX} beside it) "
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
        raise CheckpointError(
            f"checkpoint {manifest.path} (step {manifest.step}) holds no array {name!r}"
            f"{_close_names(name, list(arrays), manifest.path)}"
        )
    return arrays[name]


#: Up to this many arrays, a missing name's error lists them all.
_LISTED_NAMES: Final = 20


def _close_names(name: str, names: list[str], path: str) -> str:
    """``"; did you mean 'w'? (3 arrays: b, count, w)"``: the names closest to
    ``name`` (case aside), and every name of a small checkpoint."""
    folded = {n.casefold(): n for n in sorted(names, reverse=True)}
    close = [folded[name.casefold()]] if name.casefold() in folded else []
    close += [
        folded[n]
        for n in difflib.get_close_matches(name.casefold(), list(folded), n=3)
        if folded[n] not in close
    ]
    hint = f"; did you mean {', '.join(map(repr, close[:3]))}?" if close else ""
    count = f"{len(names)} array{'s' * (len(names) != 1)}"
    if len(names) <= _LISTED_NAMES:
        return f"{hint} ({count}: {', '.join(sorted(names))})"
    return f"{hint} ({count}: monitored checkpoint show {path})"
