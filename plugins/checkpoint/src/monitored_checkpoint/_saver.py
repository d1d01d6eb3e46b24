"""``Saver``: checkpoints in a directory, the ``checkpoint`` state file, and restore.

TF1's ``tf.train.Saver`` and its module functions for ``monitored``: a checkpoint
is named ``<basename>-<step>`` in its directory; the ``checkpoint`` state file (in
TF1's text format) names the newest and every kept one and is written after
the checkpoint itself, so it never names a checkpoint that is not complete. The
saver keeps the ``max_to_keep`` newest checkpoints and, past those, one every
``keep_checkpoint_every_n_hours``.

:func:`restore_latest` restores the newest *valid* checkpoint: a damaged one is
skipped with a :class:`CorruptCheckpointWarning` naming the file and the reason;
a directory whose checkpoints are all damaged, or that holds another project's
checkpoints, is an error rather than a silent fresh start.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, final

import anyio
import anyio.to_thread
import numpy as np

from monitored import TrainState, is_device_array, printable

from ._errors import (
    CheckpointDigestError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointStateError,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    ForeignCheckpointError,
    NoValidCheckpointError,
)
from ._format import (
    DATA_SUFFIX,
    FORMAT_NAME,
    MANIFEST_SUFFIX,
    MAX_MANIFEST_BYTES,
    Manifest,
    Snapshot,
    check_session_plugin_states,
    check_step_name,
    dtype_name,
    load_json,
    looks_like_our_data_file,
    parse_manifest,
    read_arrays,
    read_manifest,
    read_manifest_bytes,
    step_of,
    take_snapshot,
    verify_arrays,
    write_checkpoint_files,
)
from ._store import TEMP_MARKER, Store, is_plain_name, open_store, write_all

__all__ = [
    "MAX_STATE_FILE_BYTES",
    "STATE_FILENAME",
    "CheckpointState",
    "CheckpointsIterator",
    "Saver",
    "check_basename",
    "checkpoint_digest",
    "checkpoint_mtimes",
    "checkpoint_state",
    "checkpoints_iterator",
    "latest_checkpoint",
    "restore",
    "restore_latest",
    "split_save_path",
    "wait_for_new_checkpoint",
]

log = logging.getLogger("monitored.checkpoint")

#: The state file's name, as in TF1.
STATE_FILENAME: Final = "checkpoint"
_MARKER: Final = f"# {FORMAT_NAME} state file"
#: The largest state file read, in bytes: about 10000 kept checkpoints' worth.
MAX_STATE_FILE_BYTES: Final = 4 << 20
#: TF1 checkpoint files: ``model.ckpt-5.index``, ``.meta``, ``.data-00000-of-00001``.
_TF_FILE: Final = re.compile(r"\.(index|meta|data-\d+-of-\d+)$")


def check_basename(basename: str, where: str) -> str:
    """``basename`` if checkpoints can be named after it, else ``ValueError``.

    A character that :func:`monitored.printable` escapes (a control or format
    character, a line break, a byte that is not UTF-8) makes a name that
    ``latest_checkpoint`` never finds or that prints as something else, so a
    resumed run would silently start afresh: refused before anything is written.
    """
    if printable(basename) != basename:
        raise ValueError(
            f"{where}: checkpoint basename {printable(repr(basename))} holds a character "
            "that is not printable (a control or format character, a line break or a byte "
            "that is not UTF-8); its checkpoints could never be found again"
        )
    return basename


def split_save_path(save_path: str | os.PathLike[str]) -> tuple[Store, str]:
    """``"dir/model.ckpt"`` -> (the store of ``dir``, ``"model.ckpt"``).

    Also splits a checkpoint path: ``"dir/model.ckpt-5"`` -> (store, ``"model.ckpt-5"``).
    """
    path = os.fspath(save_path)
    if "://" in path:
        directory, _, basename = path.rstrip("/").rpartition("/")
    else:
        directory, basename = os.path.split(path)
        directory = directory or "."
    if not basename:
        raise ValueError(f"save path {path!r} names no checkpoint basename (e.g. 'dir/model.ckpt')")
    return open_store(directory), basename


# -- the state file -----------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class CheckpointState:
    """The ``checkpoint`` state file: TF1's ``CheckpointState``.

    Paths are full paths (or URLs) of checkpoints: ``dir/model.ckpt-10``.
    """

    model_checkpoint_path: str
    all_model_checkpoint_paths: tuple[str, ...]
    all_model_checkpoint_timestamps: tuple[float, ...] = ()
    last_preserved_timestamp: float = 0.0
    #: Whether ``monitored-checkpoint`` wrote the file (TF1 writes the same format).
    ours: bool = True
    #: The names as written in the file, relative to its directory.
    names: tuple[str, ...] = field(default=(), repr=False)


def _format_state(names: Sequence[str], stamps: Sequence[float], last_preserved: float) -> bytes:
    lines = [
        f"{_MARKER} (format 1): the newest checkpoint and every kept one, oldest first.",
        f"model_checkpoint_path: {json.dumps(names[-1])}",
    ]
    lines += [f"all_model_checkpoint_paths: {json.dumps(n)}" for n in names]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in stamps]
    lines.append(f"last_preserved_timestamp: {last_preserved!r}")
    return ("\n".join(lines) + "\n").encode()


def _parse_state(store: Store, raw: bytes) -> CheckpointState:
    """Parse a state file; ``ValueError`` says what is wrong with it.

    Every checkpoint it names must be a plain file name of the directory: a
    state file naming ``/elsewhere/model.ckpt-5`` or ``../x`` is damaged, so
    nothing outside the directory is ever restored, adopted or deleted.
    """
    text = raw.decode("utf-8")
    ours = text.startswith(_MARKER)
    newest: str | None = None
    names: list[str] = []
    stamps: list[float] = []
    preserved = 0.0
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        value = value.strip()
        if not sep:
            raise ValueError(f"line {number} is not 'key: value'")
        if key == "model_checkpoint_path":
            newest = _string(value, number)
        elif key == "all_model_checkpoint_paths":
            names.append(_string(value, number))
        elif key == "all_model_checkpoint_timestamps":
            stamps.append(float(value))
        elif key == "last_preserved_timestamp":
            preserved = float(value)
        else:
            raise ValueError(f"line {number} has the unknown key {key!r}")
    if newest is None:
        raise ValueError("it names no model_checkpoint_path")
    if newest not in names:
        names.append(newest)
    return CheckpointState(
        model_checkpoint_path=_full(store, newest),
        all_model_checkpoint_paths=tuple(_full(store, n) for n in names),
        all_model_checkpoint_timestamps=tuple(stamps),
        last_preserved_timestamp=preserved,
        ours=ours,
        names=tuple(names),
    )


def _string(value: str, number: int) -> str:
    if not (value.startswith('"') and value.endswith('"')) or len(value) < 2:
        raise ValueError(f"line {number}: {value[:80]!r} is not a quoted string")
    try:
        decoded = load_json(value.encode(), f"line {number}", "the name")
    except CorruptCheckpointError:
        decoded = value[1:-1]
    if not is_plain_name(decoded):
        raise ValueError(
            f"line {number}: {str(decoded)[:80]!r} is not a plain file name of the directory"
        )
    return str(decoded)


def _full(store: Store, name: str) -> str:
    """A (plain) name from the state file as a full path."""
    return store.path(name)


def _relative(store: Store, path: str) -> str:
    prefix = store.path("")
    return path[len(prefix) :] if path.startswith(prefix) else path


def _read_state(store: Store, names: Sequence[str]) -> CheckpointState | None:
    """The state file, or ``None`` if absent; ``ValueError`` if it cannot be parsed.

    Read only if it is a regular file of at most :data:`MAX_STATE_FILE_BYTES`.
    """
    if STATE_FILENAME not in names:
        return None
    try:
        raw = store.read_bytes(STATE_FILENAME, MAX_STATE_FILE_BYTES)
    except FileNotFoundError:
        return None
    except CorruptCheckpointError as exc:
        raise ValueError(str(exc)) from None
    return _parse_state(store, raw)


def _state_file_is_foreign(store: Store, names: Sequence[str]) -> bool:
    """Whether a ``checkpoint`` file is there that this package did not write.

    Ours start with a marker comment; an empty one is a write torn on a store
    without rename, and ours too. Only its first bytes are read. Callers decide
    with :func:`_holds_our_checkpoints` whether that makes the directory foreign.
    """
    if STATE_FILENAME not in names:
        return False
    try:
        with store.open_file(STATE_FILENAME) as (file, _):
            head = file.read(4096)
    except (OSError, CorruptCheckpointError):
        return False  # unreadable: damaged, not evidence of another project
    return bool(head.strip()) and not head.startswith(_MARKER.encode())


def _holds_our_checkpoints(store: Store, names: Sequence[str]) -> bool:
    """Whether the directory holds a manifest this package wrote.

    Read newest first, complete checkpoints before incomplete ones, up to the first of ours.
    """
    listing = _Listing(names, ())
    return any(
        _is_our_manifest(store, name + MANIFEST_SUFFIX)
        for name in [*listing.complete, *(entry.name for entry in listing.incomplete())]
    )


def checkpoint_state(checkpoint_dir: str | os.PathLike[str]) -> CheckpointState | None:
    """The state file of ``checkpoint_dir`` (TF1's ``get_checkpoint_state``).

    ``None`` when there is none; :class:`CheckpointStateError` (a
    :class:`CorruptCheckpointError` and a ``ValueError``) when it cannot be parsed.
    """
    store = open_store(checkpoint_dir)
    try:
        return _read_state(store, store.list())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointStateError(
            f"{store.path(STATE_FILENAME)}: the state file cannot be parsed: {exc}"
        ) from None


def _manifest_names(store: Store, names: Sequence[str]) -> list[str]:
    """Checkpoint names with a manifest in the listing, newest step first."""
    present = set(names)
    found = []
    for file in names:
        if not file.endswith(MANIFEST_SUFFIX) or file.startswith("."):
            continue
        name = file[: -len(MANIFEST_SUFFIX)]
        step = step_of(name)
        if step is not None and (name + DATA_SUFFIX in present or _is_our_manifest(store, file)):
            found.append((step, name))
    return [name for _, name in sorted(found, reverse=True)]


def _is_our_manifest(store: Store, file: str) -> bool:
    try:
        document = load_json(store.read_bytes(file, MAX_MANIFEST_BYTES), file, "the manifest")
    except (OSError, CorruptCheckpointError):
        return False
    return isinstance(document, dict) and document.get("format") == FORMAT_NAME


def _complete_names(store: Store, names: Sequence[str]) -> list[str]:
    """Checkpoints whose manifest and data file are both listed, the newest first.

    Decided from the listing alone, nothing read: the state file's newest (when
    this package wrote it) first, then every other one by step, highest first.
    A manifest whose data file is not there (yet) is left out: a copy that
    brings the manifest first (``rsync`` copies in name order), a deletion half
    done, or a stray file. So a directory flooded with junk manifests costs one
    listing, not one read per file.
    """
    manifests = {
        file[: -len(MANIFEST_SUFFIX)]
        for file in names
        if file.endswith(MANIFEST_SUFFIX) and not file.startswith(".")
    }
    data = {file[: -len(DATA_SUFFIX)] for file in names if file.endswith(DATA_SUFFIX)}
    steps = ((step_of(name), name) for name in manifests & data)
    complete = sorted(((step, name) for step, name in steps if step is not None), reverse=True)
    ordered = [name for _, name in complete]
    try:
        state = _read_state(store, names)
    except (ValueError, UnicodeDecodeError):
        state = None
    if state is not None and state.ours and state.names:
        named = [_relative(store, state.model_checkpoint_path), state.names[-1]]
        first = [name for name in dict.fromkeys(named) if name in ordered]
        ordered = first + [name for name in ordered if name not in first]
    return ordered


def latest_checkpoint(
    checkpoint_dir: str | os.PathLike[str], latest_filename: str | None = None
) -> str | None:
    """The path of the newest checkpoint in ``checkpoint_dir``, or ``None``.

    The one the state file names, when its manifest and data file are both in
    the directory; else the newest checkpoint that has both. A manifest
    without its data file (a copy still arriving, a checkpoint half deleted) is
    not a checkpoint yet. Nothing is read but the listing and the state file:
    restoring verifies the checkpoint itself.
    """
    if latest_filename not in (None, STATE_FILENAME):
        raise ValueError(f"latest_filename must be {STATE_FILENAME!r}, got {latest_filename!r}")
    store = open_store(checkpoint_dir)
    complete = _complete_names(store, store.list())
    return store.path(complete[0]) if complete else None


# -- restoring ----------------------------------------------------------------------------------
def _check_match(state: TrainState, manifest: Manifest) -> None:
    """Raise :class:`CheckpointMismatchError` naming every entry that does not fit."""
    problems: list[str] = []
    missing = sorted(set(state) - set(manifest.arrays))
    if missing:
        extra = sorted(set(manifest.arrays) - set(state))
        problems.append(
            f"it lacks the state entries {missing}"
            + (f" (it holds {extra} instead)" if extra else "")
        )
    if state.finalized:
        extra = sorted(set(manifest.arrays) - set(state))
        if extra:
            problems.append(f"it holds entries {extra} that the (created) state does not have")
    for name in sorted(set(state) & set(manifest.arrays)):
        info, array = manifest.arrays[name], state[name]
        if tuple(array.shape) != info.shape:
            problems.append(
                f"entry {name!r} has shape {info.shape} in the checkpoint and "
                f"{tuple(array.shape)} in the state"
            )
        if dtype_name(np.dtype(array.dtype)) != info.dtype:
            problems.append(
                f"entry {name!r} has dtype {info.dtype} in the checkpoint and "
                f"{np.dtype(array.dtype).name} in the state"
            )
    generator = manifest.rng.get("bit_generator")
    mine = type(state.rng.bit_generator).__name__
    if generator != mine:
        problems.append(f"its RNG state is for {generator!r}, the state's RNG is {mine!r}")
    if problems:
        raise CheckpointMismatchError(
            f"checkpoint {manifest.path} (step {manifest.step}) does not match the state: "
            + "; ".join(problems)
        )


@final
class _Digest:
    """A provenance check of one restore: the SHA-256 of the bytes read, against the expected."""

    __slots__ = ("expected", "hasher", "path")

    def __init__(self, path: str, manifest_bytes: bytes, expected: str) -> None:
        self.path = path
        self.hasher = hashlib.sha256(manifest_bytes)
        self.expected = expected.lower()

    def check(self) -> None:
        found = self.hasher.hexdigest()
        if found != self.expected:
            raise CheckpointDigestError(
                f"checkpoint {self.path} has the SHA-256 digest {found}, not the "
                f"{self.expected} it was to have: it is not the checkpoint that was published"
            )


def _apply(
    state: TrainState, manifest: Manifest, store: Store, digest: _Digest | None = None
) -> None:
    """Read the arrays of ``manifest`` into ``state`` and set its step and RNG.

    All or nothing: every check (sizes, header, CRC-32, RNG state, digest)
    passes before the state is touched. Arrays the state does not have yet are
    read into new memory; arrays it has (NumPy, contiguous) are filled in place,
    without a second copy of the state in memory, after a first pass has
    verified the whole file through small buffers. Only if the file changes
    between the two passes can a failure leave them partly overwritten, and
    the error then says so.
    """
    _check_match(state, manifest)
    hasher = digest.hasher if digest is not None else None
    in_place = {
        n: a
        for n, a in state.items()
        if isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable
    }
    if in_place:
        verify_arrays(store, manifest, digest=hasher)
        hasher = None
        if digest is not None:
            digest.check()
    try:
        arrays = read_arrays(store, manifest, into=in_place, digest=hasher)
    except CorruptCheckpointError as exc:
        if not in_place:
            raise
        raise CorruptCheckpointError(
            f"{exc}; the file changed while it was being restored, after it had been "
            f"verified, and the state's arrays {sorted(in_place)[:5]} were partly overwritten: "
            "the state is no longer usable"
        ) from None
    if digest is not None and hasher is not None:
        digest.check()
    rng_state = manifest.rng_state  # checked when the manifest was parsed
    for name, host in arrays.items():
        existing = state.get(name)
        if existing is None:
            state[name] = _to_module(host, manifest.arrays[name].module, name, manifest)
        elif is_device_array(existing):
            _upload(existing, host)
        elif host is not existing:
            np.copyto(existing, host, casting="equiv")
    state.global_step = manifest.step
    state.rng_state = rng_state


def _to_module(host: np.ndarray[Any, Any], module: str, name: str, manifest: Manifest) -> Any:
    if module != "cupy":
        return host
    try:
        import cupy
    except ImportError:
        log.info(
            "%s: entry %r was saved from CuPy, which is not installed; restored as NumPy",
            manifest.path,
            name,
        )
        return host
    return cupy.asarray(host)


def _upload(device: Any, host: np.ndarray[Any, Any]) -> None:
    if device.flags.c_contiguous:
        device.set(host)
    else:  # ``set`` refuses a target that is not contiguous
        import cupy

        device[...] = cupy.asarray(host)


def restore(
    state: TrainState, path: str | os.PathLike[str], *, sha256: str | None = None
) -> Manifest:
    """Restore ``state`` (arrays, global step, RNG) from the checkpoint at ``path``.

    ``path`` is a checkpoint path as :func:`latest_checkpoint` returns it. The
    plugin states are in the returned manifest's ``plugins``. With ``sha256``
    (what :func:`checkpoint_digest` gave its writer), the checkpoint must be
    exactly that one, checked on the bytes actually read, or
    :class:`CheckpointDigestError` is raised and the state is left unchanged.
    """
    store, name = split_save_path(path)
    if sha256 is None:
        manifest = read_manifest(store, name)
        check_step_name(manifest)
        _apply(state, manifest, store)
        return manifest
    raw = read_manifest_bytes(store, name)
    where = store.path(name + MANIFEST_SUFFIX)
    manifest = parse_manifest(load_json(raw, where, "the manifest"), store, name)
    check_step_name(manifest)
    _apply(state, manifest, store, _Digest(store.path(name), raw, sha256))
    return manifest


def checkpoint_digest(path: str | os.PathLike[str]) -> str:
    """The SHA-256 digest of the checkpoint at ``path``, for its writer to publish.

    The hex digest of the manifest's bytes followed by the data file's bytes. A
    reader who got the digest from a source they trust passes it to
    :func:`restore` (``sha256=``), which checks it on the bytes it restores:
    the way to know a checkpoint you did not write is the one its author meant.
    """
    store, name = split_save_path(path)
    hasher = hashlib.sha256(read_manifest_bytes(store, name))
    try:
        with store.open_file(name + DATA_SUFFIX) as (file, _):
            while chunk := file.read(8 << 20):
                hasher.update(chunk)
    except FileNotFoundError:
        raise CorruptCheckpointError(
            f"{store.path(name + DATA_SUFFIX)}: the data file is missing"
        ) from None
    return hasher.hexdigest()


def restore_latest(
    state: TrainState,
    checkpoint_dir: str | os.PathLike[str],
    *,
    session_plugin_states: bool = False,
) -> Manifest | None:
    """Restore the newest valid checkpoint of ``checkpoint_dir`` into ``state``.

    Returns its manifest, or ``None`` when the directory holds no checkpoint (a
    fresh start). Damaged checkpoints are skipped with a
    :class:`CorruptCheckpointWarning`. Raises :class:`NoValidCheckpointError`
    when there are checkpoints but none is valid, :class:`ForeignCheckpointError`
    when the directory holds checkpoints that this package did not write,
    :class:`CheckpointMismatchError` when the newest valid checkpoint does not
    fit the state and :class:`CheckpointVersionError` when a newer format wrote it.

    With ``session_plugin_states``, each plugin state must have the layout the
    session's ``load_plugin_states`` takes; a checkpoint where one does not is
    damaged (the plugin named) and skipped like any other.

    What it reads is what it needs: the listing, the state file, and the
    checkpoints it tries, newest first, until one restores. Only checkpoints
    whose manifest and data file are both listed are tried; the others (a
    manifest whose data file is missing, a name in the state file without a
    manifest) are named from the listing, unread: a directory flooded with
    manifests, or a state file naming thousands of checkpoints, costs no read
    per file. Those newer than the checkpoint restored are named in one
    warning; a manifest is read only when nothing restores, to tell a directory
    of ours whose checkpoints are all incomplete (an error) from stray files (a
    fresh start), and only up to the first one of ours.

    A state file this package did not write makes the directory foreign only
    when it holds no checkpoint of ours; otherwise it is damage, reported and
    ignored, and the directory's own listing decides.
    """
    manifest, skipped = restore_latest_quietly(
        state, checkpoint_dir, session_plugin_states=session_plugin_states
    )
    for message in skipped:
        warnings.warn(message, CorruptCheckpointWarning, stacklevel=2)
    return manifest


def restore_latest_quietly(
    state: TrainState,
    checkpoint_dir: str | os.PathLike[str],
    *,
    session_plugin_states: bool = False,
) -> tuple[Manifest | None, list[str]]:
    """:func:`restore_latest`, returning its warnings' messages instead of warning.

    For a caller that restores in a worker thread: a warning issued there would
    be attributed to the thread's frames; the caller warns on its own thread,
    at the user's line.
    """
    store = open_store(checkpoint_dir)
    names = store.list()
    if not names:
        return None, []
    failures: list[tuple[str, str]] = []
    skipped: list[str] = []
    saved: CheckpointState | None = None
    if _state_file_is_foreign(store, names):
        if not _holds_our_checkpoints(store, names):
            raise ForeignCheckpointError(_foreign_message(store, [STATE_FILENAME], names))
        failures.append(
            (store.path(STATE_FILENAME), "the state file was not written by monitored-checkpoint")
        )
    else:
        try:
            saved = _read_state(store, names)
        except (ValueError, UnicodeDecodeError) as exc:
            failures.append(
                (store.path(STATE_FILENAME), f"the state file cannot be parsed ({exc})")
            )
    # Only checkpoints whose two files are listed are read, the state file's
    # newest first: the incomplete ones are named from the listing, unread, so a
    # directory flooded with manifests (or a state file naming thousands) costs
    # the listing and the checkpoint restored.
    saved_names = saved.names if saved is not None else ()
    listing = _Listing(names, saved_names)
    complete = listing.complete
    listed = set(complete)
    candidates = [n for n in reversed(saved_names) if n in listed]
    candidates += [n for n in complete if n not in candidates]
    for name in candidates:
        try:
            manifest = read_manifest(store, name)
            check_step_name(manifest)
            if session_plugin_states:
                check_session_plugin_states(manifest)
            _apply(state, manifest, store)
        except (CorruptCheckpointError, CheckpointNotFoundError) as exc:
            failures.append((store.path(name), str(exc)))
            continue
        instead = f"restoring the older {manifest.path} (step {manifest.step}) instead"
        for where, why in failures:
            skipped.append(f"skipping checkpoint {where}: {why}; {instead}")
        newer, count = listing.newer(_prefix(name), manifest.step)
        if newer:
            skipped.append(f"skipping {_describe(store, newer, count)}; {instead}")
        return manifest, skipped
    # Which series of names are checkpoints: those tried, those of the state file,
    # else that of the newest incomplete manifest that is ours (read up to it).
    incomplete = listing.incomplete()
    series = {_prefix(name) for name in [*candidates, *saved_names]}
    if not series:
        ours = next(
            (
                entry
                for entry in incomplete
                if entry.has_manifest and _is_our_manifest(store, entry.name + MANIFEST_SUFFIX)
            ),
            None,
        )
        series = set() if ours is None else {_prefix(ours.name)}
    if series:
        lines = "".join(f"\n  {where}: {why}" for where, why in failures)
        shown = [entry for entry in incomplete if _prefix(entry.name) in series]
        if shown:
            lines += f"\n  {_describe(store, shown[:_NAMED_INCOMPLETE], len(shown))}"
        raise NoValidCheckpointError(
            f"checkpoint directory {store.url} holds checkpoints, but none can be restored; "
            f"refusing to start afresh over them:{lines}"
        )
    foreign = _foreign_files(store, names)
    if foreign:
        raise ForeignCheckpointError(_foreign_message(store, foreign, names))
    return None, [f"ignoring {where}: {why}" for where, why in failures]


#: How many incomplete checkpoints a warning or an error names one by one.
_NAMED_INCOMPLETE: Final = 10
#: The most digits of a step in a checkpoint name (as ``step_of`` reads them).
_MAX_STEP_DIGITS: Final = 20


class _Incomplete(NamedTuple):
    """A checkpoint of the listing or the state file that lacks one of its two files.

    A tuple (step first), so that thousands of them sort fast, newest first.
    """

    step: int
    name: str
    has_manifest: bool

    def why(self) -> str:
        if self.has_manifest:
            data = self.name + DATA_SUFFIX
            return f"is incomplete: the data file is missing ({data} is not listed)"
        return f"does not exist: no manifest {self.name}{MANIFEST_SUFFIX} is listed"


@final
class _Listing:
    """The checkpoints of a listing: complete (both files listed) or incomplete.

    Decided from the listing (and the names in the state file) alone: nothing
    is read. Steps are parsed only of the names asked about, so that the
    incomplete ones of a series cost a string test each.
    """

    __slots__ = ("_data_less", "_unlisted", "complete")

    def __init__(self, names: Sequence[str], saved_names: Sequence[str]) -> None:
        manifests = {
            file[: -len(MANIFEST_SUFFIX)]
            for file in names
            if file.endswith(MANIFEST_SUFFIX) and not file.startswith(".")
        }
        data = {file[: -len(DATA_SUFFIX)] for file in names if file.endswith(DATA_SUFFIX)}
        steps = ((step_of(name), name) for name in manifests & data)
        #: The complete checkpoints, newest first.
        self.complete = [name for step, name in sorted(steps, reverse=True) if step is not None]
        self._data_less = manifests - data
        self._unlisted = {
            name for name in saved_names if name not in manifests and is_plain_name(name)
        }

    def incomplete(self) -> list[_Incomplete]:
        """Every incomplete checkpoint, newest first."""
        found = [
            _Incomplete(step, name, has_manifest)
            for names, has_manifest in ((self._data_less, True), (self._unlisted, False))
            for name in names
            if (step := step_of(name)) is not None
        ]
        return sorted(found, reverse=True)

    def newer(self, series: str, step: int) -> tuple[list[_Incomplete], int]:
        """The newest few incomplete checkpoints of ``series`` after ``step``, and their count.

        A string test per name: a flood of thousands costs little more than its listing.
        """
        start = len(series) + 1
        found: list[tuple[int, str, bool]] = []
        for names, has_manifest in ((self._data_less, True), (self._unlisted, False)):
            for name in names:
                digits = name[start:]
                if (
                    name.startswith(series)
                    and name[start - 1 : start] == "-"
                    and digits.isdigit()
                    and digits.isascii()
                    and len(digits) <= _MAX_STEP_DIGITS
                    and int(digits) > step
                ):
                    found.append((int(digits), name, has_manifest))
        newest = heapq.nlargest(_NAMED_INCOMPLETE, found)
        return [_Incomplete(*entry) for entry in newest], len(found)


def _prefix(name: str) -> str:
    """The series of a checkpoint name: ``model.ckpt`` of ``model.ckpt-5``."""
    return name.rpartition("-")[0]


def _describe(store: Store, shown: Sequence[_Incomplete], count: int) -> str:
    """``count`` incomplete checkpoints for a warning or an error, the newest ``shown`` named."""
    if count == 1:
        return f"checkpoint {store.path(shown[0].name)} {shown[0].why()}"
    more = count - len(shown)
    return (
        f"{count} incomplete checkpoints in {store.url} ("
        + "; ".join(f"{entry.name} {entry.why()}" for entry in shown)
        + (f"; and {more} more" if more else "")
        + ")"
    )


def _foreign_files(store: Store, names: Sequence[str]) -> list[str]:
    """Checkpoint-like files in the directory that this package did not write."""
    foreign = []
    for name in names:
        if name.startswith(".") and TEMP_MARKER in name:
            continue  # our leftovers from a killed save
        ours = not name.endswith(DATA_SUFFIX) or looks_like_our_data_file(store, name)
        if _TF_FILE.search(name) or not ours:
            foreign.append(name)
    return foreign


def _foreign_message(store: Store, foreign: Sequence[str], names: Sequence[str]) -> str:
    kind = (
        "TensorFlow checkpoints"
        if any(_TF_FILE.search(n) for n in names)
        else "checkpoint files that monitored-checkpoint did not write"
    )
    shown = ", ".join(sorted(foreign)[:5]) + (", ..." if len(foreign) > 5 else "")
    return (
        f"checkpoint directory {store.url} holds {kind} ({shown}); monitored-checkpoint "
        "neither restores them nor overwrites them: use a directory of its own"
    )


# -- saving -------------------------------------------------------------------------------------
@final
class _Directory:
    """What a :class:`Saver` knows of one directory: the kept checkpoints, oldest first."""

    __slots__ = ("kept", "last_preserved", "store", "written")

    def __init__(self, store: Store, kept: list[tuple[str, float]], last_preserved: float) -> None:
        self.store = store
        self.kept = kept
        self.last_preserved = last_preserved
        #: The checkpoints this saver wrote there: ours without reading them back.
        self.written: set[str] = set()


@final
class Saver:
    """Saves and restores checkpoints; keeps the newest ``max_to_keep`` of them.

    ``save`` writes synchronously; ``CheckpointSaverHook`` splits a save into a
    snapshot on the step loop and :meth:`write` in a worker thread. Thread-safe.

    Args:
        max_to_keep: how many recent checkpoints to keep (``None`` or 0: all; the
            state file then names only the newest, as in TF1).
        keep_checkpoint_every_n_hours: past ``max_to_keep``, keep one checkpoint
            per this many hours instead of deleting it.
    """

    __slots__ = ("_created", "_dirs", "_lock", "keep_checkpoint_every_n_hours", "max_to_keep")

    def __init__(
        self, max_to_keep: int | None = 5, keep_checkpoint_every_n_hours: float = 10000.0
    ) -> None:
        if max_to_keep is not None and max_to_keep < 0:
            raise ValueError(f"max_to_keep must be >= 0 or None, got {max_to_keep}")
        if keep_checkpoint_every_n_hours <= 0:
            raise ValueError(
                f"keep_checkpoint_every_n_hours must be positive, got "
                f"{keep_checkpoint_every_n_hours}"
            )
        self.max_to_keep = max_to_keep
        self.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self._lock = threading.Lock()
        self._dirs: dict[str, _Directory] = {}
        #: When the saver was made: ``keep_checkpoint_every_n_hours`` counts from here (TF1).
        self._created = time.time()

    # -- TF1's API ---------------------------------------------------------------------------
    def save(
        self,
        state: TrainState,
        save_path: str | os.PathLike[str],
        global_step: int | None = None,
        *,
        plugin_states: Mapping[str, Any] | None = None,
    ) -> str:
        """Write a checkpoint of ``state`` as ``<save_path>-<step>``; return its path.

        ``global_step`` defaults to ``state.global_step``. Blocks until the
        checkpoint and the state file are on disk. ``state`` may also be a session
        (TF1's ``saver.save(sess, path, global_step=sv.global_step)``): its state is
        saved (arrays, global step, RNG; the plugins' states only when given as
        ``plugin_states``, which the checkpoint service does).
        """
        state = _state_of(state, "Saver.save")
        snapshot = take_snapshot(state, plugin_states, copy=False)
        if global_step is not None:
            snapshot.step = int(global_step)
        return self.write(snapshot, save_path)

    def restore(self, state: TrainState, save_path: str | os.PathLike[str]) -> Manifest:
        """Restore ``state`` from the checkpoint at ``save_path`` (see :func:`restore`).

        ``state`` may be a session (TF1's ``saver.restore(sess, path)``): its state
        is restored.
        """
        return restore(_state_of(state, "Saver.restore"), save_path)

    @property
    def last_checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints of the last directory saved to, oldest first.

        Empty with ``max_to_keep`` ``None`` or 0: such a saver keeps every
        checkpoint and tracks none, as in TF1.
        """
        with self._lock:
            if not self._dirs or not self.max_to_keep:
                return []
            directory = list(self._dirs.values())[-1]
            return [directory.store.path(name) for name, _ in directory.kept]

    def recover_last_checkpoints(self, checkpoint_paths: Sequence[str]) -> None:
        """Track ``checkpoint_paths`` (oldest first) as the kept ones, so they are rotated.

        As TF1's: the paths replace what the saver tracked in their directory,
        each stamped with its modification time, and one no longer on disk is
        left out (a checkpoint deleted since is not tracked, nor listed again).
        """
        pairs: list[tuple[str, float]] = []
        for path in checkpoint_paths:
            mtimes = checkpoint_mtimes([path])
            if mtimes:
                pairs.append((path, mtimes[0]))
        self.set_last_checkpoints_with_time(pairs)

    def set_last_checkpoints(self, last_checkpoints: Sequence[str]) -> None:
        """Track ``last_checkpoints`` (oldest first) as the kept ones, stamped now (TF1's)."""
        now = time.time()
        self.set_last_checkpoints_with_time([(path, now) for path in last_checkpoints])

    def set_last_checkpoints_with_time(
        self, last_checkpoints_with_time: Sequence[tuple[str, float]]
    ) -> None:
        """Track ``(path, timestamp)`` pairs (oldest first) as the kept ones (TF1's).

        They replace what the saver tracked in their directories; each path must
        name a checkpoint of a directory (``dir/model.ckpt-5``).
        """
        grouped: dict[str, tuple[Store, list[tuple[str, float]]]] = {}
        for path, stamp in last_checkpoints_with_time:
            store, name = split_save_path(path)
            if not is_plain_name(name) or step_of(name) is None:
                raise ValueError(f"{path!r} is not the path of a checkpoint (dir/model.ckpt-5)")
            grouped.setdefault(store.url, (store, []))[1].append((name, float(stamp)))
        with self._lock:
            for store, pairs in grouped.values():
                directory = self._directory(store)
                directory.kept = list({name: (name, t) for name, t in pairs}.values())
                # The last directory touched is the one ``last_checkpoints`` reports.
                self._dirs[store.url] = self._dirs.pop(store.url)

    def prepare(self, save_path: str | os.PathLike[str]) -> None:
        """Check that checkpoints can be written as ``<save_path>-<step>``, before any save.

        Creates the directory, proves it writable, refuses another project's
        ``checkpoint`` file, removes temporary files of interrupted saves and
        adopts the checkpoints its state file lists. Raises
        :class:`~monitored_checkpoint.CheckpointDirectoryError` or
        :class:`ForeignCheckpointError`.
        """
        store, basename = split_save_path(save_path)
        check_basename(basename, "Saver")
        store.check_writable()
        with self._lock:
            self._directory(store)

    def has_checkpoint(self, save_path: str | os.PathLike[str], step: int) -> bool:
        """Whether a checkpoint ``<save_path>-<step>`` exists.

        Kept in the state file, or only on disk (the state file was lost): either
        way it is not written again, so a save never rewrites a checkpoint in place.
        """
        store, basename = split_save_path(save_path)
        name = f"{basename}-{step}"
        with self._lock:
            directory = self._directory(store)
            if any(kept == name for kept, _ in directory.kept):
                return True
        return f"{name}{MANIFEST_SUFFIX}" in store.list()

    # -- the two halves of a save ---------------------------------------------------------------
    def write(self, snapshot: Snapshot, save_path: str | os.PathLike[str]) -> str:
        """Write ``snapshot`` as ``<save_path>-<step>``, update the state file, rotate.

        Blocking and thread-safe: the background writer calls it. Raises
        :class:`ForeignCheckpointError` rather than overwriting another project's
        state file.
        """
        store, basename = split_save_path(save_path)
        check_basename(basename, "Saver")
        store.begin_save()  # a remote store: the whole save is bounded (_remote)
        name = f"{basename}-{snapshot.step}"
        with self._lock:
            directory = self._directory(store)
        # The state file's write syncs the directory: the manifest's rename is
        # durable when this returns (see Store.write).
        write_checkpoint_files(store, name, snapshot)
        with self._lock:
            directory.written.add(name)
            kept = [(n, t) for n, t in directory.kept if n != name]
            kept.append((name, snapshot.created))
            kept, deleted = self._rotate(directory, kept)
            directory.kept = kept
            # A saver that keeps all tracks none: its state file names the newest
            # without a timestamp, so no saver or manager ever rotates it away (TF1).
            stamps = [t for _, t in kept] if self.max_to_keep else []
            text = _format_state([n for n, _ in kept], stamps, directory.last_preserved)
            store.write(STATE_FILENAME, lambda f: write_all(f, text))
        for old in deleted:
            _delete_checkpoint(store, old, ours=old in directory.written)
            directory.written.discard(old)
        return store.path(name)

    def _directory(self, store: Store) -> _Directory:
        """The bookkeeping of ``store``, read from its state file on first use."""
        directory = self._dirs.get(store.url)
        if directory is not None:
            return directory
        store.ensure_directory()
        names = store.list()
        saved: CheckpointState | None = None
        if _state_file_is_foreign(store, names):
            if not _holds_our_checkpoints(store, names):
                raise ForeignCheckpointError(_foreign_message(store, [STATE_FILENAME], names))
            log.warning(
                "%s was not written by monitored-checkpoint, but the directory holds checkpoints "
                "of ours; it will be rewritten",
                store.path(STATE_FILENAME),
            )
        else:
            try:
                saved = _read_state(store, names)
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning(
                    "%s cannot be parsed (%s); it will be rewritten",
                    store.path(STATE_FILENAME),
                    exc,
                )
        kept, last_preserved = _adopted(store, saved, self._created)
        for leftover in names:
            if leftover.startswith(".") and TEMP_MARKER in leftover:
                if _writer_alive(leftover):
                    continue  # another save, of this or another live process, is writing it
                log.info("removing %s, left by an interrupted save", store.path(leftover))
                store.remove(leftover)
        directory = _Directory(store, kept, last_preserved)
        self._dirs[store.url] = directory
        return directory

    def _rotate(
        self, directory: _Directory, kept: list[tuple[str, float]]
    ) -> tuple[list[tuple[str, float]], list[str]]:
        """Split ``kept`` into what stays listed and what to delete (TF1's rule)."""
        if not self.max_to_keep:
            return kept[-1:], []
        deleted: list[str] = []
        period = self.keep_checkpoint_every_n_hours * 3600
        while len(kept) > self.max_to_keep:
            name, stamp = kept.pop(0)
            if stamp - directory.last_preserved >= period:
                directory.last_preserved = stamp
                log.info("preserving %s (one every %g hours)", name, period / 3600)
                continue
            deleted.append(name)
        return kept, deleted


def _adopted(
    store: Store, saved: CheckpointState | None, created: float
) -> tuple[list[tuple[str, float]], float]:
    """The checkpoints a saver takes over from a state file, and its preserved timestamp.

    TF1's ``CheckpointManager`` rule: only checkpoints stamped after the last
    preserved one are tracked (and so ever deleted). One listed without a
    timestamp (written by a saver that keeps all, by ``update_checkpoint_state``,
    by another program) was not written by a rotating saver and is never
    deleted. With no state file, ``keep_checkpoint_every_n_hours`` counts from
    ``created``, the saver's creation. A wall clock now behind the last preserved
    timestamp (set back) is warned about, that timestamp is reset to now and
    nothing is taken over: what is on disk is kept rather than guessed about.
    """
    now = time.time()
    if saved is None:
        return [], created
    preserved = saved.last_preserved_timestamp or created
    if now < preserved:
        log.warning(
            "%s: time.time() returned a value %g seconds behind the last preserved checkpoint "
            "timestamp; the checkpoints it lists will not be deleted",
            store.path(STATE_FILENAME),
            preserved - now,
        )
        return [], now
    stamps = list(saved.all_model_checkpoint_timestamps)
    if len(stamps) != len(saved.names):
        stamps = [preserved] * len(saved.names)
    kept = [
        (name, min(stamp, now))
        for name, stamp in zip(saved.names, stamps, strict=True)
        if stamp > preserved
    ]
    return kept, preserved


def checkpoint_mtimes(checkpoint_prefixes: Sequence[str]) -> list[float]:
    """The modification times of the checkpoints that exist, in order (TF1: get_checkpoint_mtimes).

    A checkpoint's time is its manifest's, the file written last; a prefix with
    no checkpoint is left out, as in TF1.
    """
    found: list[float] = []
    for prefix in checkpoint_prefixes:
        store, name = split_save_path(prefix)
        mtime = _mtime(store.path(name + MANIFEST_SUFFIX))
        if mtime is not None:
            found.append(mtime)
    return found


def _mtime(path: str) -> float | None:
    """The modification time of ``path`` (a local path or an fsspec URL); ``None`` if absent."""
    try:
        if "://" not in path:
            return os.stat(path).st_mtime
        import fsspec.core  # type: ignore[import-untyped]

        fs, inner = fsspec.core.url_to_fs(path)
        modified = fs.modified(inner)
    except (OSError, NotImplementedError, ValueError):
        return None
    return float(modified.timestamp())


def _delete_checkpoint(store: Store, name: str, *, ours: bool = False) -> None:
    """Delete checkpoint ``name`` of ``store``: only files shown to be ours.

    The kept list comes from a state file someone else may have written, so a
    file is deleted only if its content shows it is part of a checkpoint of
    ours: a manifest with our format, a data file with our header; or if this
    saver wrote it itself (``ours``), which needs no reading back. The manifest
    goes first: a checkpoint whose deletion is interrupted then has no manifest
    and is not mistaken for a damaged one.
    """
    if not is_plain_name(name) or step_of(name) is None:
        log.warning("not deleting %r: it is not the name of a checkpoint", name)
        return
    manifest, data = name + MANIFEST_SUFFIX, name + DATA_SUFFIX
    if ours:
        store.check_owner()  # once for the checkpoint's two files
        for file in (manifest, data):
            with contextlib.suppress(FileNotFoundError):
                store.remove(file, fenced=False)
        return
    names = set(store.list())
    for file in (manifest, data):
        if file not in names:
            continue
        if (
            _is_our_manifest(store, file)
            if file == manifest
            else looks_like_our_data_file(store, file, strict=True)
        ):
            store.remove(file)
        else:
            log.warning("not deleting %s: it is not a checkpoint file of ours", store.path(file))


# -- following a training job -------------------------------------------------------------------
def wait_for_new_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    last_checkpoint: str | None = None,
    seconds_to_sleep: float = 1,
    timeout: float | None = None,
) -> str | None:
    """Wait until ``checkpoint_dir`` has a checkpoint other than ``last_checkpoint``.

    Returns its path, or ``None`` after ``timeout`` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        path = latest_checkpoint(checkpoint_dir)
        if path is not None and path != last_checkpoint:
            return path
        if deadline is not None and time.monotonic() + seconds_to_sleep > deadline:
            return None
        time.sleep(seconds_to_sleep)


@final
class CheckpointsIterator:
    """Yields each new checkpoint of a directory as it appears; sync or async.

    ``for path in checkpoints_iterator(d)`` or ``async for path in
    checkpoints_iterator(d)``. Stops after ``timeout`` seconds without a new
    checkpoint, unless ``timeout_fn`` (sync or async) returns ``False``.

    Made to follow a directory that a trainer (or a copier) is writing: a
    checkpoint is yielded only once its manifest and data file are both there
    and its manifest reads and checks; one that is incomplete, damaged or
    deleted meanwhile is "not (yet) there", skipped with one warning naming it
    and why. A caller that cannot restore a yielded checkpoint hands it back
    with :meth:`reject`. A skipped checkpoint is looked at again only once its
    files change (a copy completing), so each poll costs one listing, the
    state file, a ``stat`` of each checkpoint newer than the last one yielded
    and a read of each manifest new or changed since the last poll.
    """

    __slots__ = (
        "_dir",
        "_last",
        "_last_yield",
        "_previous",
        "_rejected",
        "_store",
        "_warned",
        "min_interval_secs",
        "poll_secs",
        "timeout",
        "timeout_fn",
    )

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        min_interval_secs: float = 0,
        timeout: float | None = None,
        timeout_fn: Callable[[], bool | Awaitable[bool]] | None = None,
        *,
        poll_secs: float = 1.0,
    ) -> None:
        self._dir = checkpoint_dir
        self._store = open_store(checkpoint_dir)
        self.min_interval_secs = min_interval_secs
        self.timeout = timeout
        self.timeout_fn = timeout_fn
        self.poll_secs = poll_secs
        self._last: str | None = None
        self._previous: str | None = None
        self._last_yield: float | None = None
        #: Checkpoints found unusable, by name: the stamps of their files then.
        self._rejected: dict[str, tuple[object, ...]] = {}
        #: Checkpoints already warned about, so each is named once.
        self._warned: set[str] = set()

    def reject(self, path: str, reason: str) -> None:
        """Hand back ``path``, which could not be used: it is skipped, with one warning.

        For a checkpoint this iterator yielded that then failed to restore
        (deleted, incomplete or damaged). It counts as never yielded: an older
        checkpoint newer than the one before it may come next, and it is
        yielded again only if its files change (a copy that completes).
        ``reason`` goes in the warning.
        """
        store, name = split_save_path(path)
        if store.url != self._store.url or step_of(name) is None:
            raise ValueError(
                f"{path!r} is not a checkpoint of {self._store.url}; reject() takes a path "
                "this iterator yielded"
            )
        self._skip(name, self._stamp(name), reason)
        if path == self._last:
            self._last = self._previous

    def _stamp(self, name: str) -> tuple[object, ...]:
        return (self._store.stamp(name + MANIFEST_SUFFIX), self._store.stamp(name + DATA_SUFFIX))

    def _skip(self, name: str, stamp: tuple[object, ...], reason: str) -> None:
        self._rejected[name] = stamp
        if name in self._warned:
            log.info("skipping checkpoint %s again: %s", self._store.path(name), reason)
            return
        self._warned.add(name)
        log.warning("skipping checkpoint %s: %s", self._store.path(name), reason)

    def _poll(self) -> str | None:
        """The checkpoint to yield now, or ``None`` if nothing new is usable.

        The newest usable checkpoint when it is not the last one yielded; past
        the newest (unusable), only checkpoints of a later step than the last
        one yielded, so nothing is evaluated twice.
        """
        store = self._store
        names = store.list()
        present = set(names)
        for gone in [n for n in self._rejected if n + MANIFEST_SUFFIX not in present]:
            del self._rejected[gone]
        self._warned = {n for n in self._warned if n + MANIFEST_SUFFIX in present}
        last_step = step_of(_relative(store, self._last)) if self._last is not None else None
        for index, name in enumerate(_complete_names(store, names)):
            path = store.path(name)
            if path == self._last:
                return None
            step = step_of(name)
            assert step is not None
            if index and last_step is not None and step <= last_step:
                return None
            stamp = self._stamp(name)
            if None in stamp or self._rejected.get(name) == stamp:
                continue
            try:
                check_step_name(read_manifest(store, name))
            except CheckpointNotFoundError:
                continue  # deleted since the listing: a newer one is there
            except CorruptCheckpointError as exc:
                self._skip(name, stamp, str(exc))
                continue
            return path
        return None

    def _rest(self) -> float:
        if self._last_yield is None:
            return 0.0
        return max(0.0, self._last_yield + self.min_interval_secs - time.monotonic())

    def _found(self, path: str) -> str:
        self._previous, self._last = self._last, path
        self._last_yield = time.monotonic()
        return path

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        time.sleep(self._rest())
        while True:
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            while True:
                path = self._poll()
                if path is not None:
                    return self._found(path)
                if deadline is not None and time.monotonic() + self.poll_secs > deadline:
                    break
                time.sleep(self.poll_secs)
            if self.timeout_fn is None:
                raise StopIteration
            done = self.timeout_fn()
            if not isinstance(done, bool):
                raise TypeError("an async timeout_fn needs `async for`")
            if done:
                raise StopIteration

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        await anyio.sleep(self._rest())
        while True:
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            while True:
                path = await anyio.to_thread.run_sync(self._poll)
                if path is not None:
                    return self._found(path)
                if deadline is not None and time.monotonic() + self.poll_secs > deadline:
                    break
                await anyio.sleep(self.poll_secs)
            if self.timeout_fn is None:
                raise StopAsyncIteration
            done = self.timeout_fn()
            if not isinstance(done, bool):
                done = await done
            if done:
                raise StopAsyncIteration


def checkpoints_iterator(
    checkpoint_dir: str | os.PathLike[str],
    min_interval_secs: float = 0,
    timeout: float | None = None,
    timeout_fn: Callable[[], bool | Awaitable[bool]] | None = None,
    *,
    poll_secs: float = 1.0,
) -> CheckpointsIterator:
    """Iterate over new checkpoints of ``checkpoint_dir``, for evaluation jobs.

    TF1's ``checkpoints_iterator``: yields the newest checkpoint each time a new
    one appears, at most once per ``min_interval_secs``, checking every
    ``poll_secs``; ends after ``timeout`` seconds without one unless
    ``timeout_fn()`` returns ``False``. Works with ``for`` and ``async for``.
    Only complete checkpoints with a valid manifest are yielded; see
    :class:`CheckpointsIterator` for what is skipped and :meth:`~CheckpointsIterator.reject`.
    """
    return CheckpointsIterator(
        checkpoint_dir, min_interval_secs, timeout, timeout_fn, poll_secs=poll_secs
    )


def _writer_alive(temp_name: str) -> bool:
    """Whether the process that named this temporary file (``...tmp-<pid>-...``) runs.

    Seen from this host only: on a filesystem shared between hosts a pid says
    nothing, and a temporary file of a live writer elsewhere may still be removed.
    """
    pid_text = temp_name.split(TEMP_MARKER, 1)[1].split("-", 1)[0]
    if not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _state_of(given: object, where: str) -> TrainState:
    """The ``TrainState`` of ``given``: itself, or a session's (TF1 passed ``sess``)."""
    if isinstance(given, TrainState):
        return given
    state = getattr(given, "state", None)
    if isinstance(state, TrainState):
        return state
    raise TypeError(
        f"{where}: the first argument is the monitored.TrainState to checkpoint, or the "
        f"session that trains it (sv.saver.save(sess, path, global_step=sv.global_step)); "
        f"got {type(given).__name__}"
    )
