"""The ``monitored`` command: ``monitored plugins [--json]`` lists installed plugins."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from . import __version__
from ._core._calling import CallPlan
from ._core._errors import PluginError
from ._core._options import OPTIONS_ENV
from ._core._plugins import (
    DISABLE_ENV,
    PluginManager,
    disabled_from_env,
    installed_entry_points,
    installed_plugins,
)

__all__ = ["main"]


_DESCRIPTION = (
    "List the installed monitored plugins: their distributions, versions, the hooks "
    "each implements and the options each accepts."
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


def _describe_plugins() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    disabled = disabled_from_env()
    for ep in installed_entry_points():
        if ep.name in disabled:
            dist = ep.dist
            rows.append(
                {
                    "name": ep.name,
                    "distribution": dist.metadata["Name"] if dist else None,
                    "version": dist.version if dist else None,
                    "hooks": [],
                    "options": [],
                    "chief_only": False,
                    "training_only": False,
                    "disabled": True,
                }
            )
    for info in installed_plugins(autoload=True):
        manager = PluginManager()
        manager.add(info)
        hooks = manager.hooks_of(info.plugin)
        rows.append(
            {
                "name": info.name,
                "distribution": info.distribution,
                "version": info.version,
                "hooks": hooks,
                "options": _declared_options(manager),
                "chief_only": bool(getattr(info.plugin, "chief_only", False)),
                "training_only": bool(getattr(info.plugin, "training_only", False)),
                "disabled": False,
            }
        )
    return sorted(rows, key=lambda row: str(row["name"]))


def _plugins_command(args: argparse.Namespace) -> int:
    try:
        rows = _describe_plugins()
    except PluginError as exc:
        print(f"monitored: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("No monitored plugins are installed.")
        return 0
    headers = ("plugin", "distribution", "version", "hooks")
    table = [
        (
            row["name"]
            + (" (chief only)" if row["chief_only"] else "")
            + (" (training only)" if row["training_only"] else "")
            + (f" (disabled by {DISABLE_ENV})" if row["disabled"] else ""),
            row["distribution"],
            row["version"],
            ", ".join(row["hooks"]),
        )
        for row in rows
    ]
    widths = [
        max(len(str(cell)) for cell in column) for column in zip(headers, *table, strict=False)
    ]
    for line in (headers, *table):
        print(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)
            ).rstrip()
        )
    for row in rows:
        for option in row["options"]:
            print(
                f"  {row['name']}.{option['name']} = {option['default']!r} "
                f"({option['type']}){': ' + option['help'] if option['help'] else ''}"
            )
    if any(row["options"] for row in rows):
        print(f"Set options with plugin_options={{...}} or {OPTIONS_ENV}='plugin.option=value;...'")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``monitored`` console script."""
    parser = argparse.ArgumentParser(prog="monitored", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"monitored {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    plugins = commands.add_parser(
        "plugins", help="list installed plugins with their versions, hooks and options"
    )
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugins.set_defaults(handler=_plugins_command)
    args = parser.parse_args(argv)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
