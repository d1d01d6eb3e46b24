"""``monitored checkpoint ls|show|diff|verify``: the plugin's commands.

Registered through the ``register_commands`` hook (see ``_plugin``). Exit
statuses: 0 when all is well (``diff``: the checkpoints are equal), 1 when
something was found (``diff``: they differ; ``verify`` and ``ls``: a problem),
2 when the command could not do what was asked (a path that is not a
checkpoint, a refused file). Errors are one line on stderr naming the file and
what is wrong, never a traceback: everything is read through the plugin's own
hardened reader (see ``_inspect``). Notes (which checkpoint of a directory is
shown when its newest is damaged) go to stderr too, so ``--json`` stays JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TextIO, TypeVar

import numpy as np

from monitored import printable

from ._errors import CheckpointError
from ._format import (
    _ITEMSIZE,
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    Manifest,
    check_step_name,
    read_manifest,
)
from ._inspect import (
    ArrayStats,
    CheckpointDiff,
    CheckpointRow,
    PickedCheckpoint,
    VerifyReport,
    array_stats,
    diff_checkpoints,
    inspect_directory,
    is_incomplete,
    pick_checkpoint,
    verify_report,
)
from ._reader import load_variable, read_checkpoint
from ._saver import split_save_path
from ._settle import Settled, settle
from ._store import open_store

if TYPE_CHECKING:
    from monitored import Commands

__all__ = ["register"]

#: Exit statuses (``verify`` of a directory: 1 a damaged checkpoint or state file, a
#: restore still finds a good one; 3 it holds checkpoints and none verifies).
OK: Final = 0
FOUND: Final = 1
ERROR: Final = 2
NOTHING: Final = 3

_Command = Callable[[argparse.Namespace], int]
_T = TypeVar("_T")


def register(commands: Commands) -> None:
    """Add ``monitored checkpoint`` and its subcommands to the command line."""
    group = commands.add_parser(
        "checkpoint",
        help="look inside checkpoints: ls, show, diff, verify",
        description="Look inside monitored-checkpoint checkpoints and directories of them. "
        "Exit status: 0 all well, 1 something found (a difference, a problem), 2 an error.",
    )
    sub = group.add_subparsers(title="commands", metavar="COMMAND", dest="subcommand")
    ls = sub.add_parser(
        "ls",
        help="the checkpoints of a directory",
        description="The checkpoints of DIR, oldest first: step, when written, size on disk, "
        "number of arrays, which is newest, which a restore uses (the newest unless it is "
        "damaged, then the next that is not) and which are kept forever (past max_to_keep, "
        "never rotated away). Reads the manifests and the data files' sizes only.",
    )
    ls.add_argument("directory", metavar="DIR")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(handler=_guarded(_ls))
    show = sub.add_parser(
        "show",
        help="the arrays of a checkpoint (TF1's list_variables, load_variable)",
        description="Every array of a checkpoint (PATH, or a directory's newest): name, dtype, "
        "shape and bytes, from its manifest alone, and the plugin states it holds. --stats "
        "and --array read and verify the whole checkpoint.",
    )
    show.add_argument("path", metavar="PATH")
    show.add_argument(
        "--stats", action="store_true", help="also min, max, mean and NaN count of each array"
    )
    show.add_argument(
        "name", metavar="NAME", nargs="?", help="print the values of array NAME (as --array)"
    )
    show.add_argument("--array", metavar="NAME", help="print the values of array NAME")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=_guarded(_show))
    diff = sub.add_parser(
        "diff",
        help="compare two checkpoints (exit 0 when equal)",
        description="Compare checkpoints A and B (or directories' newest): arrays only in one, "
        "dtypes or shapes that differ, the largest absolute difference of each array, and the "
        "step, RNG and plugin states. Exit status 0 when restoring either gives the same "
        "state bit for bit, 1 when they differ, 2 on an error.",
    )
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    diff.set_defaults(handler=_guarded(_diff))
    check = sub.add_parser(
        "verify",
        help="check checksums and manifests (exit 1 on any problem)",
        description="Check every checkpoint of DIR (or one checkpoint): each manifest and "
        "its checksum, each data file's size, header and CRC-32, and the state file. Every "
        "problem is named; exit status 1 on any.",
    )
    check.add_argument("directory", metavar="DIR")
    check.set_defaults(handler=_guarded(_verify))


def _guarded(command: _Command) -> _Command:
    """``command`` with the plugin's errors as one line on stderr and exit status 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except BrokenPipeError:
            raise  # the reader went away (| head): the ``monitored`` command ends quietly
        except (CheckpointError, OSError, ValueError) as exc:
            _error(args, str(exc) if isinstance(exc, CheckpointError) else _describe(exc))
            return ERROR

    return run


def _error(args: argparse.Namespace, message: str) -> None:
    _say(f"monitored checkpoint {args.subcommand}: error: {message}", file=sys.stderr)


def _note(args: argparse.Namespace, message: str | None) -> None:
    """Say on stderr (stdout may be JSON) what the user should know about the answer."""
    if message is not None:
        _say(f"monitored checkpoint {args.subcommand}: note: {message}", file=sys.stderr)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- ls -----------------------------------------------------------------------------------------
def _ls(args: argparse.Namespace) -> int:
    if _is_local_checkpoint(args.directory):  # ls runs/demo/model.ckpt-1300
        parent = os.path.dirname(args.directory) or "."
        _error(
            args,
            f"{args.directory} is a checkpoint, not a directory of them: 'monitored checkpoint "
            f"show {args.directory}' lists its arrays, 'monitored checkpoint ls {parent}' the "
            "checkpoints beside it",
        )
        return ERROR
    listing, settled = _settled(
        args.directory,
        lambda: inspect_directory(args.directory),
        lambda listing: (
            [p for row in listing.rows if (p := _damage(row)) is not None]
            + ([listing.state_problem] if listing.state_problem is not None else [])
        ),
    )
    rows = listing.rows
    damaged = [
        row
        for row in rows
        if (problem := _damage(row)) is not None and not _being_written(args, settled, problem)
    ]
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in rows], indent=2))  # ASCII, escaped
    elif not rows:
        _say(f"No checkpoints in {args.directory}.")
        if listing.holders:
            more = " (and maybe more)" if len(listing.holders) == 5 else ""
            _say(f"These subdirectories of it hold checkpoints{more}:")
            for holder in listing.holders:
                _say(f"  {holder}")
            _say(f"List one: monitored checkpoint ls {listing.holders[0]}")
    else:
        table = [
            (
                str(row.step),
                _when(row.created),
                "?" if row.size is None else _human(row.size),
                "?" if row.arrays is None else str(row.arrays),
                _notes(row),
                row.name,
            )
            for row in rows
        ]
        _table(("step", "written", "size", "arrays", "notes", "name"), table, right={0, 2, 3})
        _restored_instead(rows)
    state_problem = listing.state_problem
    if state_problem is not None and _being_written(args, settled, state_problem):
        state_problem = None
    if state_problem is not None:
        _error(args, state_problem)
    for row in rows:
        if is_incomplete(row):
            _note(args, f"{row.path}: {row.problem}")
    for row in damaged:
        assert row.problem is not None
        # Most problems name the file at fault, which starts with the checkpoint's path.
        _error(
            args, row.problem if row.problem.startswith(row.path) else f"{row.path}: {row.problem}"
        )
    return FOUND if damaged or state_problem is not None else OK


def _damage(row: CheckpointRow) -> str | None:
    """What is wrong with ``row``, with its path; ``None`` for a good or incomplete one."""
    if row.problem is None or is_incomplete(row):
        return None
    return row.problem if row.problem.startswith(row.path) else f"{row.path}: {row.problem}"


def _settled(
    path: str, read: Callable[[], _T], problems: Callable[[_T], Sequence[str]]
) -> tuple[_T, Settled | None]:
    """``read()``, retried while a live writer changes the directory (``_settle``)."""
    store = open_store(path)
    if not store.is_directory():
        return read(), None
    return settle(store, read, problems)


def _retried(path: str, read: Callable[[], _T]) -> _T:
    """``read()`` of a directory's newest checkpoint, again if a live writer rotated it
    away (or replaced it) while it was read (``_settle``); its error otherwise."""
    store = open_store(path)
    if not store.is_directory():
        return read()
    failure: list[CheckpointError] = []

    def attempt() -> _T | None:
        failure.clear()
        try:
            return read()
        except CheckpointError as exc:
            failure.append(exc)
            return None

    result, _ = settle(store, attempt, lambda _: [str(e) for e in failure])
    if failure:
        raise failure[0]
    assert result is not None
    return result


def _being_written(args: argparse.Namespace, settled: Settled | None, problem: str) -> bool:
    """Whether ``problem`` is about files a live writer changed during the read (a note)."""
    if settled is None or not settled.in_flux(problem):
        return False
    _note(args, f"being written (changed while read, not damage): {problem}")
    return True


def _notes(row: CheckpointRow) -> str:
    """``damaged``, ``newest`` (or, damaged, skipped), ``restored`` (when the newest is
    not), ``kept forever``."""
    if is_incomplete(row):
        return "incomplete (no manifest), ignored by a restore"
    notes = ["damaged"] if row.problem is not None else []
    if row.newest:
        notes.append("newest, skipped by a restore" if row.problem is not None else "newest")
    elif row.restored:
        notes.append("restored")
    if row.kept_forever:
        notes.append("kept forever")
    return ", ".join(notes) or "-"


def _restored_instead(rows: Sequence[CheckpointRow]) -> None:
    """Which checkpoint a restore uses, when it is not the newest, or that none can be."""
    restored = next((row for row in rows if row.restored), None)
    newest = next((row for row in rows if row.newest), None)
    if restored is None:
        _say("no checkpoint here can be restored: each one is damaged")
    elif newest is not None and newest.problem is not None:
        _say(
            f"the newest checkpoint, {newest.name}, is damaged: a restore skips it and uses "
            f"{restored.name} (step {restored.step})"
        )
    elif newest is not restored:
        _say(f"a restore uses {restored.name} (step {restored.step})")


def _is_local_checkpoint(path: str) -> bool:
    """Whether ``path`` names a checkpoint on the local disk (its manifest is beside it)."""
    if "://" in path or os.path.isdir(path):
        return False
    for suffix in (MANIFEST_SUFFIX, DATA_SUFFIX):  # its manifest's or data file's path
        path = path.removesuffix(suffix)
    return os.path.isfile(path + MANIFEST_SUFFIX)


# -- show ---------------------------------------------------------------------------------------
def _show(args: argparse.Namespace) -> int:
    if args.name is not None:  # show PATH NAME: the array NAME, as --array NAME
        if args.array is not None and args.array != args.name:
            _error(args, f"two arrays asked for: {args.name} and --array {args.array}; give one")
            return ERROR
        args.array = args.name
    if args.array is not None:
        if args.json or args.stats:
            _error(args, "--array prints one array's values; it takes neither --json nor --stats")
            return ERROR
        picked = pick_checkpoint(args.path)
        _note(args, picked.note)
        array = load_variable(picked.path, args.array)
        _say(f"{args.array}: {array.dtype} {tuple(array.shape)}")
        for line in np.array2string(array, separator=", ").splitlines():
            _say(line)
        return OK

    def read() -> tuple[PickedCheckpoint, Manifest, dict[str, ArrayStats]]:
        picked = pick_checkpoint(args.path)
        if args.stats:
            manifest, arrays = read_checkpoint(picked.path)
            return picked, manifest, {n: array_stats(a) for n, a in arrays.items()}
        if picked.manifest is not None:
            return picked, picked.manifest, {}
        store, name = split_save_path(picked.path)
        manifest = read_manifest(store, name)
        check_step_name(manifest)
        return picked, manifest, {}

    picked, manifest, stats = _retried(args.path, read)
    _note(args, picked.note)
    entries = []
    for name, info in sorted(manifest.arrays.items()):
        entry: dict[str, Any] = {
            "name": name,
            "dtype": info.dtype,
            "shape": list(info.shape),
            "bytes": math.prod(info.shape) * _ITEMSIZE[info.dtype],
        }
        if name in stats:
            entry.update(dataclasses.asdict(stats[name]))
        entries.append(entry)
    total = sum(entry["bytes"] for entry in entries)
    if args.json:
        document = {
            "path": manifest.path,
            "step": manifest.step,
            "created": manifest.created,
            "format_version": manifest.format_version,
            "arrays": entries,
            "plugins": manifest.plugins,
        }
        print(json.dumps(document, indent=2))  # ASCII, every control character escaped
        return OK
    _say(
        f"checkpoint {manifest.path}: step {manifest.step}, written {_when(manifest.created)}, "
        f"format version {manifest.format_version}"
    )
    headers = ("name", "dtype", "shape", "bytes") + (("min", "max", "mean", "NaN") if stats else ())
    rows = [
        (e["name"], e["dtype"], str(tuple(e["shape"])), str(e["bytes"]))
        + (
            (_number(e["min"]), _number(e["max"]), _number(e["mean"]), str(e["nan"]))
            if stats
            else ()
        )
        for e in entries
    ]
    _table(headers, rows, right={3, 4, 5, 6, 7})
    _say(f"{len(entries)} arrays, {total} bytes" + (f" ({_human(total)})" if total >= 1024 else ""))
    for plugin, saved in sorted(manifest.plugins.items()):
        _say(f"plugin {plugin}: {json.dumps(saved, sort_keys=True)}")
    return OK


# -- diff ---------------------------------------------------------------------------------------
def _diff(args: argparse.Namespace) -> int:
    a, b = pick_checkpoint(args.a), pick_checkpoint(args.b)
    _note(args, a.note and f"a: {a.note}")
    _note(args, b.note and f"b: {b.note}")
    diff = diff_checkpoints(a.path, b.path)
    _say(f"a: {diff.a.path} (step {diff.a.step})")
    _say(f"b: {diff.b.path} (step {diff.b.step})")
    for name in diff.only_a:
        _say(f"only in a: {name}")
    for name in diff.only_b:
        _say(f"only in b: {name}")
    for name, (in_a, in_b) in diff.mismatched.items():
        _say(f"differs in dtype or shape: {name}: {in_a} in a, {in_b} in b")
    if diff.compared:
        _table(
            ("array", "max |a-b|", ""),
            [
                (name, _number(gap), "" if same else "(bits differ)" if gap == 0 else "differs")
                for name, (gap, same) in diff.compared.items()
            ],
            right={1},
        )
    if not diff.same_step:
        _say(f"the global step differs: {diff.a.step} in a, {diff.b.step} in b")
    if not diff.same_rng:
        _say("the RNG state differs")
    for plugin in diff.plugins:
        _say(_plugin_difference(diff, plugin))
    _say("equal" if diff.equal else "different")
    return OK if diff.equal else FOUND


def _plugin_difference(diff: CheckpointDiff, plugin: str) -> str:
    if plugin not in diff.b.plugins:
        return f"plugin {plugin!r} has a state in a only"
    if plugin not in diff.a.plugins:
        return f"plugin {plugin!r} has a state in b only"
    return f"the state of plugin {plugin!r} differs"


# -- verify -------------------------------------------------------------------------------------
def _verify(args: argparse.Namespace) -> int:
    report, settled = _settled(args.directory, lambda: verify_report(args.directory), _problems)
    problems = [p for p in report.problems if not _being_written(args, settled, p)]
    for problem in problems:
        _say(f"problem: {problem}")
    for note in report.notes:
        _say(f"note: {note}")
    checked = report.checked
    nothing = report.directory and bool(checked) and report.restorable is None
    if nothing:
        _say("nothing restorable: no checkpoint of this directory verifies")
    count = len(problems)
    verdict = f"{count} problem{'s' * (count != 1)}" if problems else "all verified"
    _say(f"{len(checked)} checkpoint{'s' * (len(checked) != 1)} checked: {verdict}")
    return NOTHING if nothing else FOUND if problems else OK


def _problems(report: VerifyReport) -> list[str]:
    return report.problems


# -- output -------------------------------------------------------------------------------------
def _say(text: str, file: TextIO | None = None) -> None:
    """Print one line, every name in it (read from disk, maybe hostile) made printable.

    Its characters the output's encoding lacks are printed as escapes, never an error
    (see ``monitored._cli``). ``--json`` documents are printed as they are: ``json.dumps``
    writes ASCII with every control character escaped, and a newline of its own.
    """
    print(printable(text), file=sys.stdout if file is None else file)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> None:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(c) for c in column) for column in zip(headers, *rows, strict=True)]
    for line in (headers, *rows):
        cells = (
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        _say("  ".join(cells).rstrip())


def _when(created: float | None) -> str:
    if created is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _number(value: float | int | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.6g}"
