"""Looking inside checkpoints: listing a directory, array statistics, comparing, verifying.

What ``monitored checkpoint ls/show/diff/verify`` do, as functions. Everything
is read through the plugin's own reader, exactly as a restore reads it (plain
names inside the directory, regular files only, manifests bounded in size,
every size and checksum checked before memory is allocated), so a directory
from someone else can at worst be refused with a :class:`CheckpointError`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, final

import numpy as np

from ._entries import entry_kind, entry_names, local_directory
from ._errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ._format import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    Manifest,
    check_step_name,
    read_manifest,
    step_of,
    verify_arrays,
)
from ._reader import locate_checkpoint, read_checkpoint
from ._saver import (
    MAX_STATE_FILE_BYTES,
    STATE_FILENAME,
    CheckpointState,
    _is_our_manifest,
    _parse_state,
)
from ._store import Store, is_plain_name, open_store

__all__ = [
    "ArrayStats",
    "CheckpointDiff",
    "CheckpointRow",
    "DirectoryListing",
    "PickedCheckpoint",
    "VerifyReport",
    "array_stats",
    "diff_checkpoints",
    "inspect_directory",
    "is_incomplete",
    "list_checkpoints",
    "pick_checkpoint",
    "verify",
    "verify_report",
]

#: Elements compared per chunk, so a diff of large arrays needs little extra memory.
_CHUNK: Final = 1 << 20


# -- ls -------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One checkpoint of a directory, as ``monitored checkpoint ls`` lists it."""

    name: str
    path: str
    step: int
    #: When it was written (seconds since the epoch), ``None`` when it is damaged.
    created: float | None
    #: Bytes on disk (data file and manifest), ``None`` when they cannot be read.
    size: int | None
    arrays: int | None
    #: Whether it is the newest: the state file's latest, else the highest step.
    newest: bool
    #: Whether it is on disk but no longer in the state file's kept list, so no
    #: rotation deletes it (``keep_checkpoint_every_n_hours``, or ``max_to_keep=None``);
    #: ``None`` when there is no state file of ours to tell.
    kept_forever: bool | None
    #: What is wrong with it, ``None`` when its manifest reads well and its data
    #: files have the sizes it records.
    problem: str | None = None
    #: Whether a restore would use it: the first in a restore's order (the state
    #: file's checkpoints newest first, then the others by step) with no ``problem``.
    #: Usually the newest; another when the newest is damaged, the restore then
    #: skipping it. Only the manifest and the files' sizes are read, not the bytes:
    #: ``verify`` checks their CRC-32 too.
    restored: bool = False


def list_checkpoints(directory: str | os.PathLike[str]) -> list[CheckpointRow]:
    """Every checkpoint of ``directory``, oldest step first (:func:`inspect_directory`'s rows)."""
    return inspect_directory(directory).rows


@final
@dataclass(frozen=True, slots=True)
class DirectoryListing:
    """What ``monitored checkpoint ls`` finds in a directory."""

    #: The checkpoints and the odd entries named like one, oldest step first.
    rows: list[CheckpointRow]
    #: What is wrong with the state file ``checkpoint``, ``None`` when it is absent or reads.
    state_problem: str | None
    #: Its subdirectories that hold checkpoints, when it holds none itself (``runs/``).
    holders: list[str]


def inspect_directory(directory: str | os.PathLike[str]) -> DirectoryListing:
    """The checkpoints of ``directory``, oldest step first, and what else is wrong there.

    A checkpoint is listed when its manifest or its data file is there, whatever
    kind of entry it is: one that is not a regular file (a FIFO, a directory, a
    link to ``/dev/zero``), a manifest that does not read, a data file without
    its manifest or of the wrong size is listed with its ``problem`` (nothing is
    opened but regular files, nothing read but manifests, data files are sized).
    So is an entry named like a checkpoint itself (``model.ckpt-6000``, of a
    series of the directory). Other files are not checkpoints and not listed.
    The one a restore would use is marked ``restored``. A directory that does
    not exist or is not one is a :class:`CheckpointNotFoundError`.
    """
    store = open_store(directory)
    if not store.is_directory():
        raise CheckpointNotFoundError(_not_a_directory(store))
    scan = _scan(store)
    newest = scan.newest()
    rows = {name: _row(scan, name, name == newest) for name in scan.checkpoints}
    restored = next((n for n in scan.restore_order() if rows[n].problem is None), None)
    if restored is not None:
        rows[restored] = replace(rows[restored], restored=True)
    # An odd entry after the checkpoint of its name, if there is one.
    ordered = [(row.step, 0, row) for row in rows.values()]
    ordered += [(row.step, 1, row) for row in map(partial(_odd_row, scan), scan.odd)]
    listed = [row for _, _, row in sorted(ordered, key=lambda item: item[:2])]
    return DirectoryListing(listed, scan.state_problem, [] if listed else _holders(store))


def _not_a_directory(store: Store) -> str:
    local = local_directory(store)
    if local is not None and not os.path.lexists(local):
        return f"{store.url} does not exist"
    if local is None or os.path.exists(local):
        return f"{store.url} is not a directory of checkpoints"
    return f"{store.url} is a symbolic link to nowhere"


@final
@dataclass(slots=True)
class _Scan:
    """A directory's entries sorted out: checkpoints, odd entries, the state file.

    Decided from the listing, the state file and (for a series of names not
    otherwise known) a manifest or two; nothing else is read.
    """

    store: Store
    #: Checkpoint names with a manifest entry (of any kind), and with a data file entry.
    manifests: set[str]
    data: set[str]
    #: Every checkpoint name (a manifest or a data file entry), oldest step first.
    checkpoints: list[str]
    #: Entries named like a checkpoint itself (``model.ckpt-6000``), of a known series.
    odd: list[str]
    state: CheckpointState | None
    state_problem: str | None

    def newest(self) -> str | None:
        """``latest_checkpoint``'s answer, entries of any kind counting as listed."""
        complete = [n for n in self.checkpoints if n in self.manifests and n in self.data]
        if self.state is not None and self.state.ours and self.state.names:
            newest = os.path.basename(self.state.model_checkpoint_path.rstrip("/"))
            for name in (newest, self.state.names[-1]):
                if name in complete:
                    return name
        return complete[-1] if complete else None

    def restore_order(self) -> list[str]:
        """The order a restore tries checkpoints in: the state file's (when ours),
        newest first, then every other by step, highest first."""
        listed = [n for n in reversed(self.checkpoints) if n in self.manifests]
        ours = self.state.names if self.state is not None and self.state.ours else ()
        order = [n for n in reversed(ours) if n in self.manifests]
        return order + [n for n in listed if n not in order]

    def kept_forever(self, name: str) -> bool | None:
        """Whether ``name`` is past the state file's kept list: older than all it keeps."""
        if self.state is None or not self.state.ours:
            return None
        steps = [step for n in self.state.names if (step := step_of(n)) is not None]
        step = step_of(name)
        return name not in self.state.names and step is not None and step < min(steps, default=0)


def _scan(store: Store) -> _Scan:
    entries = [e for e in entry_names(store) if is_plain_name(e) and not e.startswith(".")]
    state, state_problem = _state(store, entries)
    manifests = _stems(entries, MANIFEST_SUFFIX)
    data = _stems(entries, DATA_SUFFIX)
    series = {_series(n) for n in data} | {DEFAULT_SERIES}
    if state is not None:
        series |= {_series(n) for n in state.names}
    series |= _series_of_ours(store, [n for n in manifests if _series(n) not in series])
    manifests = {n for n in manifests if _series(n) in series}
    names = manifests | data
    odd = [e for e in entries if step_of(e) is not None and _series(e) in series]
    return _Scan(
        store,
        manifests,
        data,
        sorted(names, key=lambda n: (step_of(n), n)),
        sorted(odd, key=lambda n: (step_of(n), n)),
        state,
        state_problem,
    )


#: The series of names a checkpoint hook writes by default (``checkpoint_basename``).
DEFAULT_SERIES: Final = "model.ckpt"


def _stems(entries: list[str], suffix: str) -> set[str]:
    """The checkpoint names (``<series>-<step>``) of the entries ending with ``suffix``."""
    return {
        stem
        for entry in entries
        if entry.endswith(suffix) and step_of(stem := entry[: -len(suffix)]) is not None
    }


def _series(name: str) -> str:
    """``model.ckpt`` of ``model.ckpt-5``."""
    return name.rpartition("-")[0]


def _series_of_ours(store: Store, names: list[str]) -> set[str]:
    """The series of ``names`` (manifests of series the listing does not tell) of which
    a manifest is ours, the newest few of each read.

    So ``timeline-100.json`` beside the checkpoints (a profiler's) is not taken
    for a damaged manifest, while a series whose data files are all gone is.
    """
    by_series: dict[str, list[str]] = {}
    for name in sorted(names, key=lambda n: step_of(n) or 0, reverse=True):
        by_series.setdefault(_series(name), []).append(name)
    # A flood of series of one file each costs a bounded number of reads, not one per file.
    return {
        series
        for series in sorted(by_series)[:_READ_SERIES]
        if any(
            _is_our_manifest(store, n + MANIFEST_SUFFIX)
            for n in by_series[series][:_READ_PER_SERIES]
        )
    }


#: How many manifests of a series of unknown names are read to tell whether it is ours,
#: and of how many such series at most.
_READ_PER_SERIES: Final = 3
_READ_SERIES: Final = 20


def _state(store: Store, entries: list[str]) -> tuple[CheckpointState | None, str | None]:
    """The state file, or what is wrong with it (any kind of entry named ``checkpoint``)."""
    if STATE_FILENAME not in entries:
        return None, None
    try:
        raw = store.read_bytes(STATE_FILENAME, MAX_STATE_FILE_BYTES)
    except FileNotFoundError:
        return None, None
    except CheckpointError as exc:
        return None, str(exc)
    try:
        return _parse_state(store, raw), None
    except (ValueError, UnicodeDecodeError) as exc:
        where = store.path(STATE_FILENAME)
        return None, f"{where}: the state file cannot be parsed: {exc}"


def _row(scan: _Scan, name: str, newest: bool) -> CheckpointRow:
    store = scan.store
    path = store.path(name)
    step = step_of(name) or 0  # every checkpoint name ends with its step
    if name not in scan.manifests:
        return CheckpointRow(name, path, step, None, None, None, newest, None, _no_manifest(name))
    try:
        manifest = read_manifest(store, name)
        check_step_name(manifest)
    except CheckpointError as exc:
        return CheckpointRow(name, path, step, None, None, None, newest, None, str(exc))
    problem = _data_problem(store, manifest)
    return CheckpointRow(
        name,
        path,
        manifest.step,
        manifest.created,
        _size_on_disk(store, name),
        len(manifest.arrays),
        newest,
        None if problem is not None else scan.kept_forever(name),
        problem,
    )


def _no_manifest(name: str) -> str:
    return (
        f"its data file {name}{DATA_SUFFIX} has no manifest {name}{MANIFEST_SUFFIX}: an "
        "incomplete checkpoint (a save or a copy that did not finish, or a deletion half "
        "done); a restore ignores it"
    )


def _odd_row(scan: _Scan, entry: str) -> CheckpointRow:
    path = scan.store.path(entry)
    problem = (
        f"{entry_kind(scan.store, entry)} named like a checkpoint, which is two files "
        f"({entry}{MANIFEST_SUFFIX} and {entry}{DATA_SUFFIX}); a restore ignores it"
    )
    return CheckpointRow(entry, path, step_of(entry) or 0, None, None, None, False, None, problem)


def _holders(store: Store, limit: int = 5) -> list[str]:
    """Up to ``limit`` subdirectories of ``store`` that hold a checkpoint (by listing only)."""
    directory = local_directory(store)
    if directory is None:
        return []
    found = []
    for entry in entry_names(store):
        sub = os.path.join(directory, entry)
        try:
            if entry.startswith(".") or not os.path.isdir(sub):
                continue
            with os.scandir(sub) as inner:
                names = {e.name for e in inner}
        except OSError:
            continue
        if _stems(list(names), MANIFEST_SUFFIX) & _stems(list(names), DATA_SUFFIX):
            found.append(store.path(entry))
            if len(found) == limit:
                break
    return found


def _data_problem(store: Store, manifest: Manifest) -> str | None:
    """Why a restore would refuse ``manifest``'s data files by their size alone, if it would."""
    for file, info in sorted(manifest.files.items()):
        try:
            size = store.size(file)
        except FileNotFoundError:
            return f"the data file {file} is missing"
        except (OSError, CheckpointError) as exc:
            return f"the data file {file} cannot be read: {exc}"
        if size != info.size:
            return (
                f"the data file {file} has {size} bytes, the manifest says {info.size}; "
                "it is truncated or was replaced"
            )
    return None


def _size_on_disk(store: Store, name: str) -> int | None:
    try:
        return store.size(name + DATA_SUFFIX) + store.size(name + MANIFEST_SUFFIX)
    except (OSError, CheckpointError):
        return None


# -- show --stats ---------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class ArrayStats:
    """Minimum, maximum and mean of an array's values (NaNs left out), and its NaN count.

    ``None`` where there is no value to take them of (an empty or all-NaN array).
    Complex arrays are described by their magnitudes.
    """

    min: float | int | None
    max: float | int | None
    mean: float | None
    nan: int


def array_stats(array: np.ndarray[Any, Any]) -> ArrayStats:
    """The :class:`ArrayStats` of ``array`` (bfloat16 and float8 through float32)."""
    values = _numeric(array)
    nan = int(np.count_nonzero(np.isnan(values))) if values.dtype.kind == "f" else 0
    if values.size == nan:
        return ArrayStats(None, None, None, nan)
    with np.errstate(all="ignore"):
        if nan:
            low, high = np.nanmin(values), np.nanmax(values)
            mean = np.nanmean(values, dtype=np.float64)
        else:
            low, high = values.min(), values.max()
            mean = values.mean(dtype=np.float64)
    return ArrayStats(low.item(), high.item(), float(mean), nan)


def _numeric(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` as NumPy numbers that ``min``/``max``/``isnan`` take."""
    kind = array.dtype.kind
    if kind == "b":
        return array.astype(np.uint8)
    if kind == "c":
        magnitudes: np.ndarray[Any, Any] = np.abs(array)
        return magnitudes
    if kind in "iuf":
        return array
    return array.astype(np.float32)  # bfloat16, float8: ml_dtypes' own kinds


# -- diff -----------------------------------------------------------------------------------------
@final
@dataclass(slots=True)
class CheckpointDiff:
    """How two checkpoints differ in everything a restore puts back."""

    a: Manifest
    b: Manifest
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    #: ``name -> ("float32 (8, 3)", "float64 (8, 3)")`` for arrays of another dtype or shape.
    mismatched: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: ``name -> (max |a - b|, bit-for-bit equal)`` for arrays of the same dtype and shape;
    #: a NaN on one side only counts as an infinite difference.
    compared: dict[str, tuple[float, bool]] = field(default_factory=dict)
    #: Plugins whose saved state differs (or is in one checkpoint only).
    plugins: list[str] = field(default_factory=list)

    @property
    def same_step(self) -> bool:
        """Whether both are of the same global step."""
        return self.a.step == self.b.step

    @property
    def same_rng(self) -> bool:
        """Whether both hold the same RNG state."""
        return self.a.rng == self.b.rng

    @property
    def equal(self) -> bool:
        """Whether restoring either gives the same state: arrays bit for bit, step, RNG, plugins."""
        return (
            not (self.only_a or self.only_b or self.mismatched or self.plugins)
            and all(equal for _, equal in self.compared.values())
            and self.same_step
            and self.same_rng
        )


def diff_checkpoints(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> CheckpointDiff:
    """Compare two checkpoints (or directories' newest), both read and verified whole."""
    manifest_a, arrays_a = read_checkpoint(a)
    manifest_b, arrays_b = read_checkpoint(b)
    diff = CheckpointDiff(manifest_a, manifest_b)
    diff.only_a = sorted(set(arrays_a) - set(arrays_b))
    diff.only_b = sorted(set(arrays_b) - set(arrays_a))
    for name in sorted(set(arrays_a) & set(arrays_b)):
        x, y = arrays_a[name], arrays_b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            diff.mismatched[name] = (f"{x.dtype} {x.shape}", f"{y.dtype} {y.shape}")
            continue
        diff.compared[name] = (_max_abs_difference(x, y), _same_bits(x, y))
    plugins = set(manifest_a.plugins) | set(manifest_b.plugins)
    diff.plugins = sorted(
        p for p in plugins if manifest_a.plugins.get(p) != manifest_b.plugins.get(p)
    )
    return diff


def _chunks(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> Iterator[tuple[Any, Any]]:
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for start in range(0, flat_x.size, _CHUNK):
        yield flat_x[start : start + _CHUNK], flat_y[start : start + _CHUNK]


def _same_bits(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> bool:
    return all(
        np.array_equal(cx.view(np.uint8), cy.view(np.uint8))
        for cx, cy in _chunks(np.ascontiguousarray(x), np.ascontiguousarray(y))
    )


def _max_abs_difference(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> float:
    widest = np.complex128 if x.dtype.kind == "c" else np.float64
    largest = 0.0
    with np.errstate(all="ignore"):
        for cx, cy in _chunks(x, y):
            fx, fy = cx.astype(widest), cy.astype(widest)
            same = (fx == fy) | (np.isnan(fx) & np.isnan(fy))
            gap = np.where(same, 0.0, np.abs(fx - fy))
            if gap.size:
                largest = max(largest, float(np.nan_to_num(gap, nan=math.inf).max()))
    return largest


# -- verify ---------------------------------------------------------------------------------------
def verify(path: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """Check a directory's checkpoints (or one checkpoint): ``(checked paths, problems)``.

    :func:`verify_report`'s checked paths and problems (its notes left out).
    """
    report = verify_report(path)
    return report.checked, report.problems


@final
@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``monitored checkpoint verify`` finds (:func:`verify_report`)."""

    #: The checkpoints checked (paths), oldest step first.
    checked: list[str]
    #: What is wrong: a damaged checkpoint, state file or entry; each names its file.
    problems: list[str]
    #: What a restore ignores and is no damage: a data file without its manifest (a
    #: save interrupted, or in progress beside a live writer).
    notes: list[str]
    #: The checkpoint a restore uses (the first of the restore order that verified).
    restorable: str | None
    #: Whether a directory was checked (not one checkpoint named by its path).
    directory: bool


def verify_report(path: str | os.PathLike[str]) -> VerifyReport:
    """Check a directory's checkpoints (or one checkpoint), telling damage from leftovers.

    Every checkpoint's manifest (fields, its own checksum, its step against its
    name) and data file (size, header against the manifest, CRC-32), the
    directory's state file (parses, written by this package, lists only
    checkpoints that exist), and every entry named like a checkpoint file that
    is not a good one: a FIFO, a directory or a link out of the directory. Each
    problem names the file and what is wrong. A data file without its manifest
    is a note, not a problem: a restore ignores it.
    """
    given = os.fspath(path)
    store = open_store(given)
    problems: list[str] = []
    notes: list[str] = []
    good: set[str] = set()
    order: list[str]
    directory = store.is_directory() and not _names_a_file(given.rstrip("/"))
    if directory:
        scan = _scan(store)
        problems += _state_file_problems(scan)
        checkpoints = scan.checkpoints
        if not checkpoints and not scan.odd:
            problems.append(
                f"{store.url} holds no checkpoint (no manifest *{MANIFEST_SUFFIX})"
                + _holders_hint(_holders(store))
            )
        manifests = scan.manifests
        order = scan.restore_order()
    else:
        store, name = locate_checkpoint(given.rstrip("/"))
        checkpoints, manifests, scan, order = [name], {name}, None, [name]
    for name in checkpoints:
        if name not in manifests:
            notes.append(f"{store.path(name)}: {_no_manifest(name)}")
            continue
        try:
            manifest = read_manifest(store, name)
            check_step_name(manifest)
            verify_arrays(store, manifest)
        except CheckpointError as exc:
            problems.append(str(exc))
        else:
            good.add(name)
    if scan is not None:
        problems += [f"{row.path}: {row.problem}" for row in map(partial(_odd_row, scan), scan.odd)]
    restorable = next((store.path(n) for n in order if n in good), None)
    return VerifyReport(
        [store.path(name) for name in checkpoints if name in manifests],
        problems,
        notes,
        restorable,
        directory,
    )


def is_incomplete(row: CheckpointRow) -> bool:
    """Whether ``row`` is a data file without its manifest: ignored by a restore, no damage."""
    return row.arrays is None and row.problem == _no_manifest(row.name)


def _names_a_file(path: str) -> bool:
    """Whether ``path`` ends with the name of a checkpoint's manifest or data file
    (``model.ckpt-5.json``): a directory so named is taken for that file, refused
    as what it is, not for a directory of checkpoints."""
    name = path.rpartition("/")[2]
    return any(
        name.endswith(suffix) and step_of(name[: -len(suffix)]) is not None
        for suffix in (MANIFEST_SUFFIX, DATA_SUFFIX)
    )


def _holders_hint(holders: list[str]) -> str:
    """``"; its subdirectories a, b hold some"`` when there are such."""
    if not holders:
        return ""
    return f"; these subdirectories of it hold some: {', '.join(holders)}"


def _state_file_problems(scan: _Scan) -> list[str]:
    if scan.state_problem is not None:
        return [scan.state_problem]
    state = scan.state
    if state is None:
        return []
    where = scan.store.path(STATE_FILENAME)
    if not state.ours:
        return [f"{where} was not written by monitored-checkpoint"]
    return [
        f"{where} lists {name}, which has no manifest {name}{MANIFEST_SUFFIX}"
        for name in state.names
        if name not in scan.manifests
    ]


# -- show, diff: which checkpoint ---------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class PickedCheckpoint:
    """The checkpoint ``show`` or ``diff`` reads for a path (:func:`pick_checkpoint`)."""

    path: str
    #: Why it is not the directory's newest, ``None`` when it is (or a checkpoint was named).
    note: str | None = None
    #: Its manifest, when picking it read it (so it need not be read again).
    manifest: Manifest | None = None


def pick_checkpoint(path: str | os.PathLike[str]) -> PickedCheckpoint:
    """The checkpoint that ``show`` and ``diff`` read for ``path``.

    A checkpoint path (or its manifest's or data file's) names itself. A directory
    names its newest checkpoint (:func:`latest_checkpoint`'s, entries of any kind
    counting) unless that one is damaged (by its manifest or its data file's size,
    as ``ls`` tells); then the one a restore uses, and the note says which one is
    skipped and why. :class:`CheckpointNotFoundError` when there is no checkpoint,
    :class:`CorruptCheckpointError` when none can be restored.
    """
    given = os.fspath(path)
    trimmed = given.rstrip("/") or given
    store = open_store(trimmed)
    if not store.is_directory() or _names_a_file(trimmed):
        store, name = locate_checkpoint(trimmed)
        return PickedCheckpoint(store.path(name))
    scan = _scan(store)
    newest = scan.newest()
    if newest is not None:  # the usual case: its manifest alone is read
        try:
            manifest = read_manifest(store, newest)
            check_step_name(manifest)
        except CheckpointError:
            pass
        else:
            if _data_problem(store, manifest) is None:
                return PickedCheckpoint(manifest.path, manifest=manifest)
    rows = inspect_directory(trimmed).rows
    restored = next((row for row in rows if row.restored), None)
    latest = next((row for row in rows if row.newest), None)
    if restored is None or latest is None:
        if not rows:
            raise CheckpointNotFoundError(
                f"{given} is a directory without a checkpoint (no checkpoint manifest "
                f"*{MANIFEST_SUFFIX} in it)" + _holders_hint(_holders(store))
            )
        damaged = latest or rows[-1]
        raise CorruptCheckpointError(
            f"no checkpoint of {store.url} can be restored: each is damaged (monitored "
            f"checkpoint verify {store.url} names every problem); {damaged.path}: "
            f"{damaged.problem}"
        )
    return PickedCheckpoint(
        restored.path,
        f"using {restored.path} (step {restored.step}), the checkpoint a restore of "
        f"{store.url} uses: the newest, {latest.name}, is skipped as damaged: {latest.problem}",
    )
