"""Options of installed plugins: declared by the plugin, set by the user, checked here.

A plugin declares its options through the ``declare_options`` hookspec (pytest's
``addoption`` is the model); users set them per session with
``plugin_options={"progress": {"every_n_steps": 10}}`` or, without touching the
script, with ``MONITORED_PLUGIN_OPTIONS="progress.every_n_steps=10;progress.show=loss,acc"``
(a ``dict`` option takes a JSON object there: ``summaries.hparams={"lr": 0.1}``).
The argument wins over the environment, the environment over the declared
default. Every value is checked against its option's type before the session
starts, and a misspelled plugin or option name is an error, not a silent no-op (in
the environment, which other environments may share, a plugin name that is not
installed is a warning with a "did you mean").

Values are bounded, since the environment may be set by someone else: at most
:data:`MAX_OPTION_TEXT` characters of text per value in the environment, and
(from either source) at most :data:`MAX_OPTION_DEPTH` levels of nesting and
:data:`MAX_OPTION_ITEMS` items in all; the depth of a JSON object is checked
before it is parsed, so a deeply nested one is this module's error, never a
``RecursionError``.
"""

from __future__ import annotations

import builtins
import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from ._errors import PluginOptionError
from ._plugins import _warn_unknown_in_env

__all__ = [
    "MAX_OPTION_DEPTH",
    "MAX_OPTION_ITEMS",
    "MAX_OPTION_TEXT",
    "OPTIONS_ENV",
    "Option",
    "options_from_env",
    "resolve_options",
]

#: ``plugin.option=value`` entries separated by ``;``: options set from the environment.
OPTIONS_ENV: Final = "MONITORED_PLUGIN_OPTIONS"

#: The deepest nesting of an option value: a ``dict`` option's mapping is level 1.
MAX_OPTION_DEPTH: Final = 32
#: The most keys, items and scalars one option value holds, all levels together.
MAX_OPTION_ITEMS: Final = 10_000
#: The longest text of one value in ``MONITORED_PLUGIN_OPTIONS`` (characters).
MAX_OPTION_TEXT: Final = 65_536

_TYPES: Final = (bool, int, float, str, list, dict)
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


@final
@dataclass(frozen=True, slots=True)
class Option:
    """One option a plugin accepts, returned from its ``declare_options`` hook.

    Args:
        name: the option's name, unique within the plugin.
        default: its value when the user sets none.
        help: one line for ``monitored plugins``.
        type: ``bool``, ``int``, ``float``, ``str``, ``list`` (of strings) or
            ``dict`` (string keys; the plugin checks the values); by default the
            type of ``default``. Values from the environment are converted to it
            (``list`` from comma-separated text, ``dict`` from a JSON object).
    """

    name: str
    default: Any = None
    help: str = ""
    type: type | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Option name must be an identifier, got {self.name!r}")
        kind = self.value_type
        if kind not in _TYPES:
            raise ValueError(
                f"Option {self.name!r}: type must be one of bool, int, float, str, list, dict; "
                f"got {kind!r} (give type= when the default is None)"
            )

    @property
    def value_type(self) -> builtins.type:
        """The type values of this option have."""
        if self.type is not None:
            return self.type
        return list if isinstance(self.default, tuple) else type(self.default)

    def check(self, value: Any, where: str) -> Any:
        """``value`` if it fits this option (a list for tuples, a float for ints), else an error."""
        kind = self.value_type
        if value is None and self.default is None:
            return None
        if isinstance(value, Mapping | list | tuple):
            _check_bounds(value, where)
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if kind is list and isinstance(value, list | tuple):
            if all(isinstance(item, str) for item in value):
                return list(value)
        elif kind is dict and isinstance(value, Mapping):
            if all(isinstance(key, str) for key in value):
                return dict(value)
        elif isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        raise PluginOptionError(
            f"{where}: expected {_describe(kind)}, got {value!r} ({type(value).__name__})"
        )

    def parse(self, text: str, where: str) -> Any:
        """Convert ``text`` (from the environment) to this option's type."""
        kind = self.value_type
        if len(text) > MAX_OPTION_TEXT:
            raise PluginOptionError(
                f"{where}: the value is {len(text)} characters long, more than the "
                f"{MAX_OPTION_TEXT} an option value may have"
            )
        if kind is dict:
            _check_json_depth(text, where)
        try:
            if kind is bool:
                if text.strip().lower() in _TRUE:
                    return True
                if text.strip().lower() in _FALSE:
                    return False
                raise ValueError(text)
            if kind is list:
                return [item.strip() for item in text.split(",") if item.strip()]
            if kind is dict:
                value = json.loads(text)
                if not isinstance(value, dict):
                    raise ValueError(text)
                return value
            return kind(text.strip()) if kind is not str else text
        except ValueError as exc:
            # json.JSONDecodeError is a ValueError; its position helps with a long object.
            detail = f" ({exc})" if isinstance(exc, json.JSONDecodeError) else ""
            shown = text if len(text) <= 200 else f"{text[:200]}..."
            raise PluginOptionError(
                f"{where}: expected {_describe(kind)}, got {shown!r}{detail}"
            ) from None


def _check_json_depth(text: str, where: str) -> None:
    """Refuse JSON text nested deeper than :data:`MAX_OPTION_DEPTH`, before parsing it.

    The parser recurses once per level: a deep enough text (``[[[[...``) would end
    in a ``RecursionError``. Brackets inside strings do not count.
    """
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_OPTION_DEPTH:
                raise PluginOptionError(
                    f"{where}: the JSON value is nested deeper than the {MAX_OPTION_DEPTH} "
                    "levels an option value may have"
                )
        elif char in "]}":
            depth -= 1


def _check_bounds(value: object, where: str) -> None:
    """Refuse a value nested deeper than :data:`MAX_OPTION_DEPTH` or holding more than
    :data:`MAX_OPTION_ITEMS` items (a value that contains itself is infinitely deep).

    Walked with a stack, not recursively, so no depth costs a ``RecursionError``.
    """
    stack: list[tuple[object, int]] = [(value, 1)]
    items = 0
    while stack:
        current, depth = stack.pop()
        if depth > MAX_OPTION_DEPTH:
            raise PluginOptionError(
                f"{where}: the value is nested deeper than the {MAX_OPTION_DEPTH} levels an "
                "option value may have"
            )
        if isinstance(current, Mapping):
            items += 2 * len(current)  # keys and values
            children: Iterable[object] = current.values()
        elif isinstance(current, list | tuple):
            items += len(current)
            children = current
        else:
            continue
        if items > MAX_OPTION_ITEMS:
            raise PluginOptionError(
                f"{where}: the value holds more than the {MAX_OPTION_ITEMS} items an option "
                "value may have"
            )
        stack.extend(
            (child, depth + 1) for child in children if isinstance(child, Mapping | list | tuple)
        )


def _describe(kind: builtins.type) -> str:
    return {
        bool: "a bool (true/false)",
        int: "an int",
        float: "a number",
        str: "a string",
        list: "a list of strings",
        dict: "a mapping with string keys (in the environment, a JSON object)",
    }[kind]


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The ``plugin.option=value`` entries of ``MONITORED_PLUGIN_OPTIONS``, as text."""
    raw = (os.environ if environ is None else environ).get(OPTIONS_ENV, "")
    found: dict[str, dict[str, str]] = {}
    for entry in raw.split(";"):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        plugin, dot, option = key.strip().partition(".")
        if not sep or not dot or not plugin or not option:
            raise PluginOptionError(
                f"{OPTIONS_ENV}: {entry.strip()!r} is not of the form plugin.option=value "
                "(for example nan_guard.lag=0)"
            )
        if (comma := _COMMA_BEFORE_OPTION.search(value)) is not None:
            wanted = f"{key.strip()}={value[: comma.start()]};{value[comma.start() + 1 :].strip()}"
            raise PluginOptionError(
                f"{OPTIONS_ENV}: {entry.strip()!r} holds another option after a ','; options "
                f"are separated by ';' ({wanted!r})"
            )
        found.setdefault(plugin, {})[option] = value
    return found


#: A ``,`` followed by ``plugin.option=``: options joined by ``,`` instead of ``;`` (a
#: list value's commas, ``progress.show=loss,accuracy``, are no such thing).
_COMMA_BEFORE_OPTION: Final = re.compile(r",\s*[A-Za-z_][\w-]*\.[A-Za-z_]\w*\s*=")


def resolve_options(
    declared: Mapping[str, Iterable[Option]],
    given: Mapping[str, Mapping[str, Any]],
    *,
    loaded: Iterable[str] = (),
    installed: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every declaring plugin's options: ``given``, else the environment, else the default.

    ``declared`` maps the plugins that declare options to them, ``loaded`` names
    every plugin of the session and ``installed`` every installed plugin, loaded
    or not: options of an installed plugin that is not loaded (disabled, or
    chief-only on a worker) are ignored. Raises :class:`PluginOptionError` for an
    option of a plugin that is not installed, an option a plugin does not
    declare, or a value of the wrong type.
    """
    specs: dict[str, dict[str, Option]] = {}
    for plugin, options in declared.items():
        specs[plugin] = {}
        for option in options:
            if not isinstance(option, Option):
                raise PluginOptionError(
                    f"plugin {plugin!r}: declare_options must return monitored.Option "
                    f"objects, got {type(option).__name__}",
                    plugin=plugin,
                    hook="declare_options",
                )
            if option.name in specs[plugin]:
                raise PluginOptionError(
                    f"plugin {plugin!r} declares option {option.name!r} twice",
                    plugin=plugin,
                    hook="declare_options",
                )
            specs[plugin][option.name] = option
    known = frozenset(loaded) | frozenset(declared)
    skipped = frozenset(installed) - known
    if not isinstance(given, Mapping):
        raise PluginOptionError(
            f"plugin_options must map plugin names to mappings of options, got "
            f"{type(given).__name__}"
        )
    from_env = options_from_env(environ)
    _warn_unknown_in_env(frozenset(from_env), set(installed) | known, OPTIONS_ENV)
    resolved = {
        plugin: {name: option.default for name, option in options.items()}
        for plugin, options in specs.items()
    }
    for source, values_by_plugin in ((OPTIONS_ENV, from_env), ("plugin_options", given)):
        for plugin, values in values_by_plugin.items():
            if plugin in skipped:
                continue
            if plugin not in specs:
                if source == OPTIONS_ENV and plugin not in known:
                    continue  # the variable may be shared by several environments
                raise PluginOptionError(
                    f"{source} sets options of plugin {plugin!r}, which "
                    + (
                        "declares no options"
                        if plugin in known
                        else "is not installed; installed plugins: "
                        f"{sorted(frozenset(installed)) or 'none'}"
                        + "".join(
                            f" (did you mean {close!r}?)"
                            for close in difflib.get_close_matches(
                                plugin, sorted(frozenset(installed) | known), n=1
                            )
                        )
                    ),
                    plugin=plugin,
                )
            if not isinstance(values, Mapping):
                raise PluginOptionError(
                    f"{source}[{plugin!r}] must be a mapping of option names to values, got "
                    f"{type(values).__name__}",
                    plugin=plugin,
                )
            for name, value in values.items():
                spec = specs[plugin].get(name)
                where = f"{source}: option {plugin}.{name}"
                if spec is None:
                    close = difflib.get_close_matches(name, specs[plugin], n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise PluginOptionError(
                        f"{source}: plugin {plugin!r} has no option {name!r}; its options are "
                        f"{sorted(specs[plugin]) or 'none'}{hint}",
                        plugin=plugin,
                    )
                try:
                    if source == OPTIONS_ENV:
                        value = spec.parse(value, where)
                    resolved[plugin][name] = spec.check(value, where)
                except PluginOptionError as exc:
                    exc.plugin = plugin
                    raise
    return resolved
