"""The exception classes of ``monitored-checkpoint``: one class per kind of failure.

Every message names what is at fault: the directory or file, the step, the array.
All derive from :class:`CheckpointError`, itself a :class:`monitored.MonitoredError`.
"""

from __future__ import annotations

from monitored import DamagedCheckpointError, MonitoredError, printable

__all__ = [
    "CheckpointDigestError",
    "CheckpointDirectoryError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointStateError",
    "CheckpointStoreTimeoutError",
    "CheckpointVersionError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "CorruptCheckpointWarning",
    "ForeignCheckpointError",
    "NoValidCheckpointError",
    "UnsafeCheckpointError",
    "UnsupportedArrayError",
]


class CheckpointError(MonitoredError):
    """Base class of every error raised by ``monitored-checkpoint``.

    Its message names files and arrays read from disk: every character a terminal
    would act on is escaped in it (``\\x1b``), wherever it is printed, and a name's
    line break too (``\\x0a``), so it is one line; a class whose messages list
    several things, one a line, keeps its line breaks (``_lines``).
    """

    _lines = False

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (printable(args[0], lines=self._lines), *args[1:])
        super().__init__(*args)


class CheckpointDirectoryError(CheckpointError):
    """The checkpoint directory is missing and cannot be created, or is not writable."""


class ForeignCheckpointError(CheckpointError):
    """The directory holds checkpoint files that ``monitored-checkpoint`` did not write.

    Raised instead of starting afresh (and overwriting the other project's
    ``checkpoint`` file) when no checkpoint of ours can be restored there.
    """


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint asked for by path does not exist (its manifest is missing)."""


class CorruptCheckpointError(CheckpointError, DamagedCheckpointError):
    """One checkpoint is unreadable: bad JSON, a missing or truncated file, a checksum mismatch."""


class CheckpointStateError(CorruptCheckpointError, ValueError):
    """The ``checkpoint`` state file cannot be parsed (empty, incomplete, a bad line).

    Also a :class:`ValueError`, which TF1's ``get_checkpoint_state`` raises for
    it, so ``except ValueError`` written for TF1 still catches it.
    """


class UnsafeCheckpointError(CorruptCheckpointError):
    """A checkpoint directory holds something a checkpoint of ours never is.

    A name that is not a plain file name of the directory (absolute, with ``..``
    or a separator, a NUL byte, too long), a symbolic link that leads out of the
    directory, a FIFO or device where a file should be, or a file larger than the
    limit for its kind. Like any damage, the checkpoint is skipped with a warning
    and an older one is restored; nothing outside the directory is read or written.
    """


class CheckpointDigestError(CorruptCheckpointError):
    """A checkpoint is not the one its writer published: its SHA-256 digest differs.

    Raised by ``restore(state, path, sha256=...)``; the state is left unchanged.
    """


class NoValidCheckpointError(CorruptCheckpointError):
    """The directory has checkpoints but none of them can be restored.

    Raised rather than silently starting afresh over someone's work; the message
    lists each checkpoint and why it was rejected, one a line.
    """

    _lines = True


class CheckpointVersionError(CheckpointError):
    """The checkpoint was written by a newer format version than this package reads."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint's arrays do not match the state's names, shapes or dtypes (or its RNG)."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed; the message names the path, the step and the cause."""


class CheckpointStoreTimeoutError(CheckpointError):
    """A remote checkpoint store did not answer within its bound.

    The message names the store, what was being done and the setting that
    bounds it (``docs/checkpoint.md``, "Remote stores"). Not an ``OSError``: a
    store that stopped answering says nothing about the checkpoints in it, so
    a restore never takes it for a damaged checkpoint and skips to an older one.
    """


class UnsupportedArrayError(CheckpointError, TypeError):
    """A state entry has a dtype that safetensors cannot store (object, complex128, ...)."""


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint was skipped on restore because it is unreadable; an older one is used."""

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):  # names from disk, escaped as in errors
            args = (printable(args[0]), *args[1:])
        super().__init__(*args)
