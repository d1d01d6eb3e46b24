"""One run, one writer: a session's chief owns the directories it writes to.

A training run writes its checkpoints, state file, event files and plugin files
into directories that no second writer may share: two trainings on one
``checkpoint_dir`` interleave their checkpoints and lose one run's final state.
So the chief's session *claims* each directory it writes to (the ``run_directories``
hookspec) before any hook's ``begin`` (before anything is restored or written) and
releases it when it closes. A second claim — another process, another session of
this process, another host on a shared file system — is refused with
:class:`RunOwnedError`, naming the owner (host, process id, start time).

How a claim is held on a POSIX file system (local, NFS, Lustre, GPFS...): the
directory's hidden ``.monitored-owner/`` folder holds one record per claim,
``epoch-<N>.json`` (host, pid, the process's start time, when). A new claim
creates the record of the next epoch with ``link(2)`` — atomic, and it fails if
the name exists, so of two writers racing for one epoch exactly one wins, on one
host or several. The newest epoch is the owner. Its holder renews a lease by
touching its record every ``lease_secs / 4`` seconds (a daemon thread; nothing
on the step path). A claim is *stale*, and taken over with a
:class:`RunTakenOverWarning`, when its process is gone (same host: the pid is
free, or now belongs to another process — its start time differs — or the host
rebooted) or when its record was not renewed for ``lease_secs`` (another host,
or a paused or hung process). The lease is ``MONITORED_RUN_LEASE_SECS``
(default :data:`DEFAULT_LEASE_SECS`).

Fencing: a writer paused past its lease (SIGSTOP, a frozen VM, a partition) may
wake up after a takeover. Every commit of a checkpoint (a file renamed into
place, the state file, a rotation's delete) first calls :func:`check_run_owner`,
which reads the directory's records: if a newer epoch exists, or this writer's
record is gone, it raises :class:`RunOwnershipLostError` instead of committing.
The check and the commit are two system calls: a writer paused between them
can still land one file (documented in ``docs/checkpoint.md``).

``memory://`` directories (one process's memory) are claimed in this process
only; other non-local fsspec URLs (``s3://``, ``gs://``...) are not claimed, and
a :class:`RunOwnershipWarning` says so once per directory. Readers (evaluators,
the CLI) never claim.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Final, final

from ._errors import MonitoredError
from ._printable import PrintableFilter

__all__ = [
    "DEFAULT_LEASE_SECS",
    "LEASE_ENV",
    "OWNER_FOLDER",
    "RunOwnedError",
    "RunOwner",
    "RunOwnershipLostError",
    "RunOwnershipWarning",
    "RunTakenOverWarning",
    "check_run_owner",
    "claim_run",
    "claim_runs",
    "lease_secs_from_env",
    "resolve_run_directory",
]

log = logging.getLogger("monitored.ownership")
# Its lines name run directories and claims another process wrote: no terminal sequence.
log.addFilter(PrintableFilter())

#: The hidden folder of a run directory that holds the ownership records.
OWNER_FOLDER: Final = ".monitored-owner"
#: Seconds a claim stays valid without renewal (``MONITORED_RUN_LEASE_SECS``).
DEFAULT_LEASE_SECS: Final = 60.0
LEASE_ENV: Final = "MONITORED_RUN_LEASE_SECS"
#: A record is at most this big; a bigger one is not ours and reads as unknown.
_MAX_RECORD_BYTES: Final = 4096
_RECORD: Final = re.compile(r"epoch-(\d{1,18})\.json")
#: Claims racing for one epoch retry this many times before giving up.
_ATTEMPTS: Final = 8
#: Why a released claim is free (no takeover warning for it).
RELEASED: Final = "its owner released it"


class RunOwnedError(MonitoredError):
    """The run directory belongs to another writer (a live training, here or elsewhere)."""

    def __init__(self, message: str, *, directory: str, owner: str) -> None:
        super().__init__(message)
        self.directory = directory
        #: The owner, described (host, pid, since when).
        self.owner = owner


class RunOwnershipLostError(MonitoredError):
    """This writer no longer owns its run directory: another one took it over.

    Raised instead of a commit (a checkpoint renamed into place, the state file,
    a rotation's delete) by a writer that was paused or cut off past its lease.
    """

    def __init__(self, message: str, *, directory: str) -> None:
        super().__init__(message)
        self.directory = directory


class RunOwnershipWarning(UserWarning):
    """A run directory on a store where ownership cannot be held (not claimed)."""


class RunTakenOverWarning(UserWarning):
    """A stale claim (its process gone, or its lease not renewed) was taken over."""


def lease_secs_from_env() -> float:
    """The lease of ``MONITORED_RUN_LEASE_SECS``, or :data:`DEFAULT_LEASE_SECS`."""
    raw = os.environ.get(LEASE_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_SECS
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{LEASE_ENV}={raw!r}: give a positive number of seconds")
    return value


def resolve_run_directory(directory: str | os.PathLike[str]) -> str:
    """``directory`` as a session keeps it: a local path made absolute, once.

    A relative path is resolved against the working directory *now* (when the
    session starts), so an ``os.chdir`` during training changes nothing;
    ``file://`` URLs become paths; other URLs are kept as given.
    """
    text = os.fspath(directory)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text or "::" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


# -- this process -------------------------------------------------------------------------------
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read(64).strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """The start time of process ``pid`` (Linux: clock ticks since boot), ``""`` if unknown.

    With the pid it names one process: a pid reused by a later process has
    another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            raw = file.read(4096)
    except OSError:
        return ""
    fields = raw.rpartition(b")")[2].split()
    return fields[19].decode("ascii", "replace") if len(fields) > 19 else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


_HOST: Final = socket.gethostname()
_BOOT: Final = _boot_id()


# -- records --------------------------------------------------------------------------------------
@final
class _Record:
    """One claim as read from disk: whose, since when, last renewed when."""

    __slots__ = (
        "boot",
        "epoch",
        "host",
        "lease",
        "mtime",
        "pid",
        "released",
        "since",
        "started",
        "token",
    )

    def __init__(self, epoch: int, mtime: float, fields: dict[str, object]) -> None:
        self.epoch = epoch
        self.mtime = mtime
        self.host = str(fields.get("host", "?"))[:200]
        pid = fields.get("pid")
        self.pid = pid if isinstance(pid, int) and 0 < pid < 1 << 31 else None
        self.started = str(fields.get("started", ""))[:40]
        self.boot = str(fields.get("boot", ""))[:64]
        since = fields.get("since")
        self.since = float(since) if isinstance(since, int | float) else None
        self.token = str(fields.get("token", ""))[:64]
        lease = fields.get("lease")
        #: The owner's lease (it renews every quarter of it): what silence is judged by.
        self.lease = float(lease) if isinstance(lease, int | float) and lease > 0 else None
        #: Whether its owner gave it up (a session that closed): free without a wait.
        self.released = fields.get("released") is True

    def describe(self) -> str:
        since = (
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
            if self.since is not None
            else "an unknown time"
        )
        pid = self.pid if self.pid is not None else "?"
        return f"host {self.host!r}, process {pid}, since {since} (claim {self.epoch})"

    def stale_because(self, lease_secs: float, now: float) -> str | None:
        """Why this claim no longer holds, or ``None`` if its owner may still write."""
        if self.released:
            return RELEASED
        if self.host == _HOST and self.pid is not None:
            if self.boot and _BOOT and self.boot != _BOOT:
                return "this host rebooted since"
            if not _alive(self.pid):
                return f"process {self.pid} is gone"
            if self.started and _start_ticks(self.pid) not in ("", self.started):
                return f"process {self.pid} is gone (its pid now belongs to another process)"
        # The owner's own lease when it recorded one: a claimant with a shorter
        # setting does not take over an owner that renews on its longer schedule.
        lease = max(lease_secs, self.lease) if self.lease is not None else lease_secs
        silent = now - self.mtime
        if silent > lease:
            return (
                f"its lease was not renewed for {silent:.0f}s (more than {LEASE_ENV}="
                f"{lease:g}): its process is paused, hung or on a host cut off"
            )
        return None


def _read_record(folder: str, name: str, epoch: int) -> _Record | None:
    """The record ``name`` of ``folder``; ``None`` if it vanished; unknown fields if malformed."""
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return _Record(epoch, time.time(), {})
    try:
        info = os.fstat(fd)
        raw = os.read(fd, _MAX_RECORD_BYTES) if _is_regular(info.st_mode) else b""
    finally:
        os.close(fd)
    try:
        fields = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        fields = {}
    return _Record(epoch, info.st_mtime, fields if isinstance(fields, dict) else {})


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def _epochs(folder: str) -> list[tuple[int, str]]:
    """The ``(epoch, name)`` of every record in ``folder``, newest first."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _RECORD.fullmatch(name)
        if match is not None:
            found.append((int(match.group(1)), name))
    found.sort(reverse=True)
    return found


def _newest(folder: str) -> _Record | None:
    for epoch, name in _epochs(folder):
        record = _read_record(folder, name, epoch)
        if record is not None:
            return record
    return None


# -- claims ---------------------------------------------------------------------------------------
_lock = threading.Lock()
#: The claims this process holds, by directory (absolute path or URL).
_held: dict[str, RunOwner] = {}
_warned_remote: set[str] = set()


@final
class RunOwner:
    """A claim held on one run directory, from :func:`claim_run` to :meth:`release`."""

    __slots__ = (
        "_fields",
        "_folder",
        "_lost",
        "_name",
        "_renewer",
        "_stop",
        "directory",
        "epoch",
        "lease_secs",
        "what",
    )

    def __init__(
        self,
        directory: str,
        folder: str | None,
        epoch: int,
        lease_secs: float,
        what: str,
        fields: dict[str, object] | None = None,
    ) -> None:
        #: The directory owned (absolute path, or a ``memory://`` URL).
        self.directory = directory
        #: This claim's epoch: every takeover makes a higher one (the fencing token).
        self.epoch = epoch
        self.lease_secs = lease_secs
        #: Who holds it, for messages (``"a session of this process"``).
        self.what = what
        self._folder = folder
        self._fields = fields
        self._name = f"epoch-{epoch:012d}.json"
        self._stop = threading.Event()
        self._lost: str | None = None
        self._renewer: threading.Thread | None = None
        if folder is not None:
            self._renewer = threading.Thread(
                target=self._renew, name=f"monitored run lease {directory}", daemon=True
            )
            self._renewer.start()

    def check(self) -> None:
        """Raise :class:`RunOwnershipLostError` unless this claim is still the newest.

        Called before every commit (a fencing check against what is on disk now).
        """
        folder = self._folder
        if folder is None:
            return
        epochs = _epochs(folder)
        if self._lost is None and epochs and epochs[0][1] == self._name:
            return
        newer = _newest(folder)
        by = f" by {newer.describe()}" if newer is not None and newer.epoch > self.epoch else ""
        raise RunOwnershipLostError(
            f"this process no longer owns the run directory {self.directory!r}: it was taken "
            f"over{by} while this writer was paused or cut off for more than its lease "
            f"({self.lease_secs:g}s, {LEASE_ENV}); nothing more is written here. Let the "
            "new owner train, or stop it and restart this training",
            directory=self.directory,
        )

    def release(self) -> None:
        """Give the directory up: its record is marked released (not removed).

        The record stays, so the next claim's epoch is higher than this one's: a
        writer paused with an older claim can never match a newer owner's.
        """
        self._stop.set()
        with _lock:
            if _held.get(self.directory) is self:
                del _held[self.directory]
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=5.0)
        folder = self._folder
        if folder is not None and self._fields is not None:
            own = os.path.join(folder, self._name)
            epochs = _epochs(folder)
            if epochs and epochs[0][1] == self._name:
                body = json.dumps({**self._fields, "released": True}).encode("utf-8")
                temp = os.path.join(folder, f".tmp-{os.getpid()}-{secrets.token_hex(4)}")
                try:
                    _write_new(temp, body)
                    os.replace(temp, own)
                except OSError as exc:
                    log.warning("cannot release the run directory %r: %s", self.directory, exc)
                    with contextlib.suppress(OSError):
                        os.remove(temp)

    def _renew(self) -> None:
        assert self._folder is not None
        path = os.path.join(self._folder, self._name)
        interval = self.lease_secs / 4
        while not self._stop.wait(interval):
            try:
                os.utime(path)
            except FileNotFoundError:
                self._lost = "its record was removed by a new owner"
                log.warning(
                    "the claim on run directory %r was taken over; this process's next "
                    "checkpoint commit there will fail",
                    self.directory,
                )
                return
            except OSError as exc:
                log.warning("cannot renew the claim on run directory %r: %s", self.directory, exc)

    def __repr__(self) -> str:
        return f"RunOwner({self.directory!r}, epoch={self.epoch})"


def claim_run(
    directory: str | os.PathLike[str], *, lease_secs: float | None = None, what: str = ""
) -> RunOwner | None:
    """Claim ``directory`` for this process's writer; ``None`` where it cannot be held.

    Raises :class:`RunOwnedError` if a live writer owns it, and warns
    (:class:`RunTakenOverWarning`) when it takes a stale claim over. Creates the
    directory if needed; one that cannot be created (or written) is not claimed
    (``None``): the writer's own check then fails, naming it. ``what`` names the
    claimant in others' messages.
    """
    resolved = resolve_run_directory(directory)
    lease = lease_secs_from_env() if lease_secs is None else lease_secs
    who = what or "a session of this process"
    with _lock:
        held = _held.get(resolved)
        if held is not None:
            raise RunOwnedError(
                f"the run directory {resolved!r} is already owned by another session of "
                f"this process (process {os.getpid()} on {_HOST!r}): two sessions must not "
                "write one directory. Give this session its own directory, or close the "
                "other session first",
                directory=resolved,
                owner=held.what,
            )
        if "://" in resolved or "::" in resolved:
            if not resolved.startswith("memory://"):
                if resolved not in _warned_remote:
                    _warned_remote.add(resolved)
                    warnings.warn(
                        f"the run directory {resolved!r} is on a store where monitored cannot "
                        "hold ownership: nothing stops a second training from writing it. "
                        "Ownership is held on local and network POSIX file systems and "
                        "memory://; start one training per directory",
                        RunOwnershipWarning,
                        stacklevel=3,
                    )
                return None
            owner = RunOwner(resolved, None, 1, lease, who)
        else:
            try:
                os.makedirs(os.path.join(resolved, OWNER_FOLDER), exist_ok=True)
            except OSError as exc:
                # Nothing can be written there: the writer's own check of its
                # directory (at ``begin``) fails, naming it in its own terms.
                log.debug("not claiming %r, which cannot hold files: %s", resolved, exc)
                return None
            owner = _claim_local(resolved, lease, who)
        _held[resolved] = owner
        return owner


def _claim_local(directory: str, lease: float, who: str) -> RunOwner:
    folder = os.path.join(directory, OWNER_FOLDER)
    fields = {
        "host": _HOST,
        "pid": os.getpid(),
        "started": _start_ticks(os.getpid()),
        "boot": _BOOT,
        "since": time.time(),
        "token": secrets.token_hex(8),
        "lease": lease,
    }
    body = json.dumps(fields).encode("utf-8")
    for _ in range(_ATTEMPTS):
        current = _newest(folder)
        taken: tuple[_Record, str] | None = None
        if current is not None:
            why = current.stale_because(lease, time.time())
            if why is None:
                raise RunOwnedError(
                    f"the run directory {directory!r} is owned by another training: "
                    f"{current.describe()}. Only one training may write a run directory. "
                    "Wait for it to end, stop it, or give this training another directory; "
                    f"a dead owner's claim is taken over by itself once its process is gone "
                    f"(same host) or its lease lapses ({LEASE_ENV}={lease:g}s)",
                    directory=directory,
                    owner=current.describe(),
                )
            taken = (current, why)
        epoch = (current.epoch if current is not None else 0) + 1
        if not _create(folder, f"epoch-{epoch:012d}.json", body):
            continue  # another writer took this epoch first: look again
        for older, name in _epochs(folder):
            if older < epoch:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, name))
        if taken is not None and taken[1] != RELEASED:
            warnings.warn(
                f"taking over the run directory {directory!r} from {taken[0].describe()}: "
                f"{taken[1]}",
                RunTakenOverWarning,
                stacklevel=4,
            )
        return RunOwner(directory, folder, epoch, lease, who, fields)
    raise RunOwnedError(
        f"the run directory {directory!r} is being claimed by other trainings at the same "
        f"time ({_ATTEMPTS} tries lost); start one training per directory",
        directory=directory,
        owner="several claimants",
    )


def _create(folder: str, name: str, body: bytes) -> bool:
    """Create ``folder/name`` holding ``body``, whole, unless it exists: whether it was made."""
    temp = os.path.join(folder, f".tmp-{os.getpid()}-{secrets.token_hex(4)}")
    _write_new(temp, body)
    try:
        os.link(temp, os.path.join(folder, name))
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        return _create_exclusive(os.path.join(folder, name), body)
    finally:
        with contextlib.suppress(OSError):
            os.remove(temp)
    return True


def _write_new(path: str, body: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``body``, synced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_exclusive(path: str, body: bytes) -> bool:
    """Where hard links are refused (some FUSE mounts): ``O_EXCL``, then the content."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def claim_runs(directories: Iterable[str | os.PathLike[str]], *, what: str = "") -> list[RunOwner]:
    """Claim each of ``directories`` (duplicates once); all or none."""
    owners: list[RunOwner] = []
    seen: set[str] = set()
    try:
        for directory in directories:
            resolved = resolve_run_directory(directory)
            if resolved in seen:
                continue
            seen.add(resolved)
            owner = claim_run(resolved, what=what)
            if owner is not None:
                owners.append(owner)
    except BaseException:
        for owner in owners:
            owner.release()
        raise
    return owners


def check_run_owner(path: str | os.PathLike[str]) -> None:
    """Fencing before a commit to ``path`` (a directory, or a file in one).

    If this process holds a claim on ``path`` or on the directory holding it,
    raise :class:`RunOwnershipLostError` unless the claim is still the newest.
    A no-op for paths outside this process's claims (readers, a plain
    :class:`Saver` outside a session).
    """
    if not _held:
        return
    text = resolve_run_directory(path)
    owner = _held.get(text) or _held.get(text.rstrip("/").rpartition("/")[0])
    if owner is not None:
        owner.check()


# Tracebacks name the public path (monitored.RunOwnedError), not this private module,
# even where nothing looked the name up through ``monitored`` first (it is lazy there).
for _public in (RunOwnedError, RunOwnershipLostError, RunOwnershipWarning, RunTakenOverWarning):
    _public.__module__ = "monitored"
del _public
