"""Where event files live: a local directory, or a directory on any fsspec filesystem.

A path or a ``file://`` URL is a local directory, written in place. Any other URL
(``memory://``, ``s3://``, ``gs://``, ... whatever fsspec has a filesystem for) is
remote. Object stores cannot append to an object, and tensorboardX's own remote
writers cover only S3 and GCS (through boto3 and google-cloud-storage, set up by
environment variables), so a remote writer keeps its event file in a local staging
file and uploads it whole, under the same name, at each flush: TF1's S3 and GCS
filesystems do the same. A reader of the remote directory (TensorBoard) sees the
file grow by whole flushes; the price is one upload of the file per flush (every
``flush_secs``, 120 s by default, and at ``flush``/``close``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from typing import Any, BinaryIO, final

from ._errors import SummaryDirectoryError

__all__ = ["LogDir", "open_logdir", "url_to_fs"]

_UPLOADS = itertools.count()


def url_to_fs(url: str, what: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url``; ``what`` names it in the error."""
    import fsspec  # type: ignore[import-untyped]

    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise SummaryDirectoryError(
            f"{what} {url!r}: no filesystem for this URL ({exc}); install the fsspec "
            "backend for its protocol"
        ) from exc
    return fs, str(root)


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local filesystem (``file://`` URLs)."""
    protocol = fs.protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))


@final
class LogDir:
    """A log directory: ``local`` is its path on this machine, or ``None`` if it is remote."""

    __slots__ = ("_fs", "_root", "key", "local", "url")

    def __init__(self, url: str, *, local: str | None, fs: Any = None, root: str = "") -> None:
        #: The directory as the user named it.
        self.url = url
        self.local = local
        #: What ``FileWriterCache`` keys writers by: one key per directory.
        self.key = os.path.abspath(local) if local is not None else url.rstrip("/")
        self._fs = fs
        self._root = root.rstrip("/")

    def join(self, name: str) -> str:
        """The path (local) or URL (remote) of the file ``name`` of this directory."""
        if self.local is not None:
            return os.path.join(self.local, name)
        return f"{self.url.rstrip('/')}/{name}"

    def check(self) -> None:
        """Create the directory if needed; fail now, naming it, if it cannot hold files."""
        if self.local is not None:
            _check_local(self.url, self.local)
            return
        try:
            if self._fs.isfile(self._root):
                raise SummaryDirectoryError(
                    f"summary log directory {self.url!r} is a file, not a directory"
                )
            self._fs.makedirs(self._root, exist_ok=True)
        except SummaryDirectoryError:
            raise
        except (OSError, ValueError) as exc:
            raise SummaryDirectoryError(
                f"cannot create summary log directory {self.url!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def names(self) -> list[str]:
        """The names of the files in this directory (none if it cannot be listed)."""
        try:
            if self.local is not None:
                return os.listdir(self.local)
            return [
                str(p).rstrip("/").rsplit("/", 1)[-1] for p in self._fs.ls(self._root, detail=False)
            ]
        except (OSError, ValueError):
            return []

    def upload(self, source: BinaryIO, name: str) -> None:
        """Replace the remote file ``name`` with the whole content of ``source``.

        Written under a temporary name first and then moved over ``name``: on a
        filesystem that truncates on open (sftp, smb, ...) a crash during the
        upload keeps the previous, complete copy. The temporary name holds no
        ``tfevents``, so TensorBoard never reads a partial upload.
        """
        assert self.local is None
        source.seek(0)
        target = f"{self._root}/{name}"
        partial = f"{self._root}/.monitored-upload-{os.getpid()}-{next(_UPLOADS)}"
        try:
            with self._fs.open(partial, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            self._fs.mv(partial, target)
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm(partial)
            raise

    def __repr__(self) -> str:
        return f"LogDir({self.url!r})"


def open_logdir(logdir: str | os.PathLike[str]) -> LogDir:
    """The :class:`LogDir` of ``logdir``: a path, a ``file://`` URL or any fsspec URL."""
    url = os.fspath(logdir)
    if not url:
        raise SummaryDirectoryError("the summary log directory is empty; name a directory")
    if "://" not in url:
        return LogDir(url, local=url)
    fs, root = url_to_fs(url, "summary log directory")
    if is_local(fs):
        return LogDir(url, local=root)
    return LogDir(url, local=None, fs=fs, root=root)


def _check_local(name: str, path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise SummaryDirectoryError(f"summary log directory {name!r} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise SummaryDirectoryError(
            f"cannot create summary log directory {name!r}: {exc.strerror or exc}"
        ) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise SummaryDirectoryError(f"summary log directory {name!r} is not writable")
