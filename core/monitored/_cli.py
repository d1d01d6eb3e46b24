"""The ``monitored`` command: ``monitored plugins [--verbose] [--json]`` lists installed plugins.

Also ``python -m monitored``. The table fits :data:`WIDTH` columns: each plugin's
hooks (a long list) are shown with ``--verbose``, wrapped. Installed plugins add
their own commands (``monitored checkpoint ...``) through the ``register_commands``
hook; ``monitored --help`` lists them with the plugin that adds each.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, Final

import anyio

from . import __version__
from ._core import _plugins
from ._core._calling import CallPlan
from ._core._capabilities import provides_of
from ._core._commands import PluginCommand, plugin_commands
from ._core._errors import PluginError
from ._core._options import OPTIONS_ENV
from ._core._plugins import (
    DISABLE_ENV,
    PluginInfo,
    PluginManager,
    _distribution,
    disabled_from_env,
    load_entry_point,
)
from ._core._printable import printable
from ._core._suggest import SuggestingParser

__all__ = ["WIDTH", "main"]

#: The width the output is wrapped to.
WIDTH: Final = 100


_MAIN_DESCRIPTION = (
    "List the installed monitored plugins (monitored plugins) and run the commands they add."
)
#: The commands this project's plugin packages add, for the hint when one is asked for
#: and missing. Names in a message only: the core imports no plugin package.
_PACKAGE_COMMANDS: Final = {"checkpoint": "monitored-checkpoint"}
_INSTALL_HINT: Final = (
    "Plugins are packages of their own, installed beside monitored: pip install "
    "monitored-checkpoint adds 'monitored checkpoint' (ls, show, diff, verify); in a clone "
    "of the monitored repository, 'uv run --all-packages monitored ...' installs every "
    "plugin of the workspace."
)
_DESCRIPTION = (
    "List the installed monitored plugins: their distributions, versions, the capability "
    "each provides, the options each accepts and (--verbose) the hooks each implements."
)


def _declared_options(manager: PluginManager) -> list[dict[str, Any]]:
    calls = anyio.run(CallPlan(manager).call_each, "declare_options")
    return [
        {
            "name": option.name,
            "default": option.default,
            "type": option.value_type.__name__,
            "help": option.help,
        }
        for _, options in calls
        for option in options or ()
    ]


def _describe_plugins() -> tuple[list[dict[str, Any]], list[PluginError]]:
    """A row per installed plugin, and the errors of those that cannot be loaded.

    One plugin that fails to import or to validate leaves the others listed.
    """
    rows: list[dict[str, Any]] = []
    errors: list[PluginError] = []
    disabled = disabled_from_env()
    seen: dict[str, str] = {}
    entry_points = _plugins.installed_entry_points()  # looked up here: tests replace it
    for ep in sorted(entry_points, key=lambda ep: (ep.name, _distribution(ep))):
        distribution, version = _distribution(ep)
        if ep.name in disabled:
            rows.append(
                {
                    "name": ep.name,
                    "distribution": distribution,
                    "version": version,
                    "provides": [],
                    "hooks": [],
                    "options": [],
                    "chief_only": False,
                    "training_only": False,
                    "disabled": True,
                }
            )
            continue
        if ep.name in seen:
            errors.append(
                PluginError(
                    f"two installed distributions register a monitored plugin named "
                    f"{ep.name!r}: {seen[ep.name]} and {distribution}; uninstall one of them",
                    plugin=ep.name,
                    distribution=distribution,
                )
            )
            continue
        seen[ep.name] = distribution
        try:
            rows.append(_describe(load_entry_point(ep)))
        except PluginError as exc:
            errors.append(exc)
    return sorted(rows, key=lambda row: str(row["name"])), errors


def _describe(info: PluginInfo) -> dict[str, Any]:
    manager = PluginManager()
    manager.add(info)
    return {
        "name": info.name,
        "distribution": info.distribution,
        "version": info.version,
        "provides": sorted(provides_of(info)),
        "hooks": manager.hooks_of(info.plugin),
        "options": _declared_options(manager),
        "chief_only": bool(getattr(info.plugin, "chief_only", False)),
        "training_only": bool(getattr(info.plugin, "training_only", False)),
        "disabled": False,
    }


def _plugins_command(args: argparse.Namespace) -> int:
    rows, errors = _describe_plugins()
    listed = {str(error) for error in errors}
    for error in args.command_errors:  # a plugin that loads but whose commands are refused
        if str(error) not in listed:
            print(_wrapped(f"monitored: warning: {error}", "", "  "), file=sys.stderr)
    status = _list_plugins(args, rows)
    for error in errors:  # each once, after the plugins that load
        print(_wrapped(f"monitored: error: {error}", "", "  "), file=sys.stderr)
    return 1 if errors else status


def _list_plugins(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("No monitored plugins are installed.")
        print(_wrapped(_INSTALL_HINT, "", ""))
        return 0
    headers = ("plugin", "distribution", "version", "provides", "notes")
    table = [
        (
            row["name"],
            row["distribution"],
            row["version"],
            ", ".join(row["provides"]) or "-",
            _notes(row),
        )
        for row in rows
    ]
    # Names and versions read from installed packages' metadata: printed escaped.
    shown = [tuple(printable(cell) for cell in row) for row in table]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *shown, strict=False)]
    for line, row in zip((headers, *shown), (None, *rows), strict=True):
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
        if args.verbose and row is not None and row["hooks"]:
            print(_wrapped(f"hooks: {', '.join(row['hooks'])}", "  ", "         "))
    for row in rows:
        for option in row["options"]:
            print(
                _wrapped(
                    f"{row['name']}.{option['name']} = {option['default']!r} "
                    f"({option['type']}){': ' + option['help'] if option['help'] else ''}",
                    "  ",
                    "      ",
                )
            )
    if any(row["options"] for row in rows):
        print(f"Set options with plugin_options={{...}} or {OPTIONS_ENV}='plugin.option=value;...'")
    if not args.verbose:
        print("Hooks each plugin implements: monitored plugins --verbose")
    return 0


def _notes(row: dict[str, Any]) -> str:
    """Where a plugin is loaded, or that it is disabled."""
    if row["disabled"]:
        return f"disabled by {DISABLE_ENV}"
    notes = [
        note
        for note, flag in (("chief only", "chief_only"), ("training only", "training_only"))
        if row[flag]
    ]
    return ", ".join(notes)


def _wrapped(text: str, indent: str, subsequent: str) -> str:
    return textwrap.fill(
        printable(text, lines=True),  # names from installed metadata and plugin errors
        WIDTH,
        initial_indent=indent,
        subsequent_indent=subsequent,
        break_on_hyphens=False,
        break_long_words=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``monitored`` console script.

    A reader that goes away early (``monitored plugins --json | head -1``) ends
    the command quietly with exit status 1, not a ``BrokenPipeError`` traceback. A
    character the output's encoding lacks (a name read from disk, under
    ``PYTHONIOENCODING=ascii`` or a legacy console) is printed as an escape
    (``\\xff``, ``\\u00e9``), never an error that loses the rest of the output.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        status = _main(argv)
        sys.stdout.flush()  # a write that fails here would fail, noisily, at exit
    except BrokenPipeError:
        # Python's own recipe: point stdout at devnull, so the flush at interpreter
        # exit has nowhere to fail, and exit quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    core = {"plugins": "monitored itself"}
    wanted = argv[0] if argv and argv[0] not in core and not argv[0].startswith("-") else None
    found, errors = plugin_commands(core, wanted)
    if argv[:1] != ["plugins"]:  # which says each failure once, itself
        for error in errors:
            print(_wrapped(f"monitored: warning: {error}", "", "  "), file=sys.stderr)
    if wanted is not None and wanted not in {command.name for command in found}:
        missing = _missing_command(wanted, errors)
        if missing is not None:
            print(_wrapped(f"monitored: error: {missing}", "", "  "), file=sys.stderr)
            return 2
    parser = SuggestingParser(
        prog="monitored",
        description=_MAIN_DESCRIPTION,
        epilog=_unavailable(errors) if errors or found else _INSTALL_HINT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"monitored {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, title="commands", metavar="COMMAND"
    )
    plugins = commands.add_parser(
        "plugins",
        help="list installed plugins with their versions, hooks and options",
        description=_DESCRIPTION,
    )
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugins.add_argument(
        "-v", "--verbose", action="store_true", help="also list the hooks each plugin implements"
    )
    plugins.set_defaults(handler=_plugins_command, command_errors=errors)
    for command in found:
        info = command.plugin
        # Everything after the name goes to the plugin's own parser, options included.
        entry = commands.add_parser(
            command.name,
            help=f"{command.help} [plugin {info.name!r}, {info.distribution} {info.version}]",
            add_help=False,
            prefix_chars="\0",
        )
        entry.add_argument("arguments", nargs=argparse.REMAINDER)
        entry.set_defaults(handler=_plugin_handler(command))
    args = parser.parse_args(argv)
    return _run(args.handler, args)


def _plugin_handler(command: PluginCommand) -> Any:
    def handle(args: argparse.Namespace) -> int:
        own = command.parser.parse_args(args.arguments)
        if own.handler is None:  # a group called without one of its subcommands
            command.parser.print_help(sys.stderr)
            return 2
        return _run(own.handler, own)

    return handle


def _run(handler: Any, args: argparse.Namespace) -> int:
    """Call ``handler(args)``; an awaitable result is awaited under ``anyio.run``."""
    result = handler(args)
    if inspect.isawaitable(result):
        result = anyio.run(_wait, result)
    return 0 if result is None else int(result)


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _missing_command(name: str, errors: Sequence[PluginError]) -> str | None:
    """Why the command ``name`` of one of this project's plugin packages is not there,
    and how to get it; ``None`` for another name (argparse's own error lists the choices)."""
    if name not in _PACKAGE_COMMANDS:
        return None
    if any(error.plugin == name for error in errors):
        return f"the command {name!r} is unavailable: its plugin fails to load (see above)"
    if name in disabled_from_env():
        return (
            f"the command {name!r} comes with the plugin {name!r}, disabled by "
            f"{DISABLE_ENV}; remove it from there to use the command"
        )
    return (
        f"no installed plugin adds the command {name!r}: the package "
        f"{_PACKAGE_COMMANDS[name]} does. {_INSTALL_HINT}"
    )


def _unavailable(errors: Sequence[PluginError]) -> str | None:
    """The help's note on plugins whose commands are missing, and why."""
    if not errors:
        return None
    lines = ["unavailable (these plugins' commands are left out):"]
    lines += [_wrapped(str(error), "  ", "    ") for error in errors]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
