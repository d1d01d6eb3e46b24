"""Every entry of a checkpoint directory, whatever its kind: for the commands that look inside.

A store lists regular files only (what a restore reads), so a FIFO, a device,
a directory or a link to ``/dev/zero`` named like a checkpoint file is not
there for it. ``monitored checkpoint ls/show/verify`` name such entries
instead of passing over them: they list every entry here (a listing opens
nothing, so nothing can block) and read each one through the store, which
refuses what is not a regular file of the directory with the plugin's own
error before reading a byte.
"""

from __future__ import annotations

import os
import stat

from ._errors import CheckpointDirectoryError
from ._store import LocalStore, Store

__all__ = ["entry_kind", "entry_names", "local_directory"]


def local_directory(store: Store) -> str | None:
    """The directory of ``store`` on the local filesystem, ``None`` for another store."""
    return store._dir if isinstance(store, LocalStore) else None


def entry_names(store: Store) -> list[str]:
    """The names of every entry of the directory, sorted: files, FIFOs, devices, links,
    subdirectories (an fsspec store: its files only). Empty when it does not exist."""
    directory = local_directory(store)
    if directory is None:
        return store.list()
    try:
        with os.scandir(directory) as entries:
            return sorted(entry.name for entry in entries)
    except FileNotFoundError:
        return []
    except NotADirectoryError as exc:
        raise CheckpointDirectoryError(
            f"checkpoint directory {store.url} is not a directory"
        ) from exc


def entry_kind(store: Store, name: str) -> str:
    """What the entry ``name`` is, from its metadata (nothing is opened): "a directory",
    "a FIFO", "a link to nowhere"...; "an entry" where the store cannot tell."""
    directory = local_directory(store)
    if directory is None:
        return "an entry"
    path = os.path.join(directory, name)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a symbolic link to nowhere" if os.path.islink(path) else "an entry"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"
