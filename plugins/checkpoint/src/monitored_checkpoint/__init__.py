"""monitored-checkpoint: crash-safe, asynchronous checkpoints with exact resume.

A plugin for ``monitored``: installed, it gives ``MonitoredTrainingSession`` its
``checkpoint_dir`` (restore on start, a checkpoint every ``save_checkpoint_secs``
or ``save_checkpoint_steps``, one at the end and one on SIGTERM). Arrays are
stored in safetensors, everything else in a small JSON manifest; a checkpoint
appears whole or not at all, on a local disk or any fsspec filesystem.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from monitored import PrintableFilter as _PrintableFilter

from ._errors import (
    CheckpointDigestError,
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointStateError,
    CheckpointStoreTimeoutError,
    CheckpointVersionError,
    CheckpointWriteError,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    ForeignCheckpointError,
    NoValidCheckpointError,
    UnsafeCheckpointError,
    UnsupportedArrayError,
)
from ._format import FORMAT_VERSION, Manifest, read_manifest
from ._hook import CheckpointRestoreHook, CheckpointSaverHook, CheckpointSaverListener
from ._management import (
    CheckpointManager,
    checkpoint_exists,
    generate_checkpoint_state_proto,
    get_checkpoint_mtimes,
    remove_checkpoint,
    update_checkpoint_state,
)
from ._reader import list_variables, load_variable, read_checkpoint, resolve_checkpoint
from ._saver import (
    CheckpointsIterator,
    CheckpointState,
    Saver,
    checkpoint_digest,
    checkpoint_state,
    checkpoints_iterator,
    latest_checkpoint,
    restore,
    restore_latest,
    wait_for_new_checkpoint,
)

# The plugin's log lines name files and arrays read from disk: none prints a terminal sequence.
logging.getLogger("monitored.checkpoint").addFilter(_PrintableFilter())
#: TF1's name of :func:`checkpoint_state`.
get_checkpoint_state = checkpoint_state

try:
    __version__ = version("monitored-checkpoint")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "FORMAT_VERSION",
    "CheckpointDigestError",
    "CheckpointDirectoryError",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointRestoreHook",
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "CheckpointState",
    "CheckpointStateError",
    "CheckpointStoreTimeoutError",
    "CheckpointVersionError",
    "CheckpointWriteError",
    "CheckpointsIterator",
    "CorruptCheckpointError",
    "CorruptCheckpointWarning",
    "ForeignCheckpointError",
    "Manifest",
    "NoValidCheckpointError",
    "Saver",
    "UnsafeCheckpointError",
    "UnsupportedArrayError",
    "__version__",
    "checkpoint_digest",
    "checkpoint_exists",
    "checkpoint_state",
    "checkpoints_iterator",
    "generate_checkpoint_state_proto",
    "get_checkpoint_mtimes",
    "get_checkpoint_state",
    "latest_checkpoint",
    "list_variables",
    "load_variable",
    "read_checkpoint",
    "read_manifest",
    "remove_checkpoint",
    "resolve_checkpoint",
    "restore",
    "restore_latest",
    "update_checkpoint_state",
    "wait_for_new_checkpoint",
]
