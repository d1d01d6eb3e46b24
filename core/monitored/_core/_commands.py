"""The commands installed plugins add to ``monitored``: the ``register_commands`` hook.

Each plugin adds its own top-level commands (``monitored checkpoint ...``) through
a :class:`Commands` object of its own, as datasette's and pytest's plugins grow
their command lines. The command line stays argparse, the standard library's
parser: a plugin gets an :class:`argparse.ArgumentParser` per command and
builds it as it likes (arguments, subcommands).

Plugins are loaded and asked one at a time: one that fails to import, to
validate or to register loses its commands, with an error naming it, and the
others' commands work. What it registered before failing is dropped with it,
so a half-built command never appears.
"""

from __future__ import annotations

import argparse
import inspect
import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from ._errors import PluginError
from ._plugins import (
    PluginInfo,
    PluginManager,
    _distribution,
    disabled_from_env,
    installed_entry_points,
    load_entry_point,
)
from ._suggest import SuggestingParser

__all__ = ["HOOK", "Commands", "PluginCommand", "plugin_commands"]

#: The hook plugins implement to add commands.
HOOK: Final = "register_commands"
#: A command name: lowercase ASCII letters, digits and dashes, starting with a letter.
_NAME: Final = re.compile(r"[a-z][a-z0-9-]{0,39}\Z", re.ASCII)


@final
@dataclass(frozen=True, slots=True)
class PluginCommand:
    """One top-level command a plugin added: ``monitored <name> ...``."""

    name: str
    #: The line ``monitored --help`` shows for it.
    help: str
    #: The command's own parser (``prog`` is ``monitored <name>``).
    parser: argparse.ArgumentParser
    #: The plugin that added it.
    plugin: PluginInfo


@final
class Commands:
    """What a plugin's ``register_commands(commands)`` receives: the ``monitored`` command line.

    :meth:`add_parser` adds one top-level command and returns its parser. Each
    plugin gets its own object; a name the core or another plugin already uses
    is refused, naming who has it.
    """

    __slots__ = ("_added", "_plugin", "_taken")

    def __init__(self, plugin: PluginInfo, taken: Mapping[str, str]) -> None:
        self._plugin = plugin
        #: Command name -> who has it (a phrase for the error message).
        self._taken = taken
        self._added: dict[str, PluginCommand] = {}

    def add_parser(self, name: str, *, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add the command ``monitored <name>`` and return its ``argparse`` parser.

        ``help`` is the line ``monitored --help`` lists for it (with the plugin
        that adds it); other keyword arguments go to
        :class:`argparse.ArgumentParser` (``description``, ``epilog``,
        ``formatter_class``, ...). Add the command's arguments to the parser, or
        subcommands with ``add_subparsers()``, and set what runs with
        ``parser.set_defaults(handler=fn)``: ``fn(args)`` returns the exit
        status (``None`` means 0) and may be an ``async def``.

        A name that is not lowercase letters, digits and dashes (starting with a
        letter), or that ``monitored`` or another plugin already has, is a
        :class:`~monitored.PluginError`.
        """
        owner = self._taken.get(name) or (self._plugin.describe() if name in self._added else None)
        problem = (
            f"command name {name!r} is not lowercase letters, digits and dashes"
            if not isinstance(name, str) or not _NAME.match(name)
            else f"command {name!r} is already added by {owner}"
            if owner is not None
            else f"command {name!r} has no help line (add_parser({name!r}, help='...'))"
            if not isinstance(help, str) or not help.strip()
            else None
        )
        if problem is not None:
            raise PluginError(
                f"{self._plugin.describe()}, hook {HOOK!r}: {problem}",
                plugin=self._plugin.name,
                distribution=self._plugin.distribution,
                hook=HOOK,
            )
        parser = SuggestingParser(prog=f"monitored {name}", **kwargs)
        parser.set_defaults(handler=None)
        self._added[name] = PluginCommand(name, help.strip(), parser, self._plugin)
        return parser

    def added(self) -> list[PluginCommand]:
        """The commands added through this object, in order."""
        return list(self._added.values())


def plugin_commands(
    reserved: Mapping[str, str], wanted: str | None = None
) -> tuple[list[PluginCommand], list[PluginError]]:
    """The commands of every installed plugin, and the errors of those that failed.

    ``reserved`` maps the core's own command names to a phrase naming their owner.
    With ``wanted`` (the command about to run), plugins after the one that adds
    it are not imported: a name belongs to the first plugin that adds it, so
    they could not change what runs, and the command starts sooner.
    Plugins are taken in entry-point order; those listed in
    ``MONITORED_DISABLE_PLUGINS`` are not imported (the autoload switch, which is
    about sessions, does not apply: a command is asked for by name). A plugin
    that fails to import, fails validation, or raises in (or returns an
    awaitable from) ``register_commands`` contributes no command and one
    :class:`~monitored.PluginError` naming it.
    """
    disabled = disabled_from_env()
    taken = dict(reserved)
    commands: list[PluginCommand] = []
    errors: list[PluginError] = []
    seen: dict[str, str] = {}
    for ep in sorted(installed_entry_points(), key=lambda ep: (ep.name, _distribution(ep))):
        if ep.name in disabled:
            continue
        distribution = _distribution(ep)[0]
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
            info = load_entry_point(ep)
            manager = PluginManager()
            manager.add(info)
            added = _register(manager, info, taken)
        except PluginError as exc:
            errors.append(exc)
            continue
        for command in added:
            taken[command.name] = info.describe()
            commands.append(command)
        if wanted is not None and wanted in taken:
            break
    return commands, errors


def _register(
    manager: PluginManager, info: PluginInfo, taken: Mapping[str, str]
) -> list[PluginCommand]:
    """Call ``info``'s ``register_commands`` (if it has one); the commands it added."""
    commands = Commands(info, taken)
    for impl, _ in manager.ordered_impls(HOOK):
        try:
            result = impl.function(**dict.fromkeys(impl.argnames, commands))
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(
                f"{info.describe()}: hook {HOOK!r} raised {type(exc).__name__}: {exc}"
                f"{_where(exc)}; its commands are left out",
                plugin=info.name,
                distribution=info.distribution,
                hook=HOOK,
            ) from exc
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise PluginError(
                f"{info.describe()}: hook {HOOK!r} returned an awaitable; it is called "
                "synchronously while the command line is built: make it a plain function",
                plugin=info.name,
                distribution=info.distribution,
                hook=HOOK,
            )
    return commands.added()


def _where(exc: BaseException) -> str:
    """`` (at file:line)`` of the innermost frame of ``exc``'s traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
