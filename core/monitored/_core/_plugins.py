"""Finding, validating and ordering plugins and hooks.

pluggy does the specifications, registration and validation; entry points of the
``monitored`` group are loaded here (not through pluggy's loader) so an import
error can name the plugin and its distribution. A hook object needs no marker:
any plain function or method named after a hookspec is an implementation, except
the no-op defaults inherited from :class:`~monitored.SessionRunHook`.

Two ways of passing arguments: module plugins and pluggy-style implementations
take any subset of the spec's arguments *by name*. Hook objects passed in
``hooks=[...]`` may also be written as TF1 wrote them, which called hooks
positionally (``def after_run(self, rc, rv)``): the events of a
``SessionRunHook`` subclass, and any method of a hook object whose parameter
names are not the spec's, are called with the spec's arguments in order.
A public function whose name is close to a hook name (``after_runn``) is an
error with a "did you mean", so a misspelled hook never passes silently.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import inspect
import logging
import os
import sys
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import pluggy

from .. import hookspecs
from ._errors import PluginError, PluginLoadError, PluginValidationError
from ._foreign_callbacks import foreign_callbacks, warn_foreign_callbacks
from ._markers import PROJECT_NAME
from ._session_run_hook import SessionRunHook

__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "Impl",
    "PluginInfo",
    "PluginManager",
    "disabled_from_env",
    "installed_plugin_names",
    "installed_plugins",
    "load_entry_point",
    "public_class",
]

log = logging.getLogger("monitored")

#: The entry-point group plugin distributions register under.
ENTRY_POINT_GROUP: Final = PROJECT_NAME
#: Comma-separated plugin names not to load (``MONITORED_DISABLE_PLUGINS=progress,summaries``).
DISABLE_ENV: Final = "MONITORED_DISABLE_PLUGINS"
#: Set to ``1`` to load no installed plugin at all.
DISABLE_AUTOLOAD_ENV: Final = "MONITORED_DISABLE_PLUGIN_AUTOLOAD"

_SPEC_NAMES: Final = frozenset(
    name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "monitored_spec")
)
_SPEC_ARGS: Final = {
    name: tuple(inspect.signature(getattr(hookspecs, name)).parameters) for name in _SPEC_NAMES
}
#: TF1's ``SessionRunHook`` events: a subclass's methods for them are called positionally.
_TF1_EVENTS: Final = frozenset({"begin", "after_create_session", "before_run", "after_run", "end"})
#: How alike a name must be to a hook name (difflib's ratio) to count as a misspelling.
_MISSPELLING_CUTOFF: Final = 0.8
#: The most single-letter edits (a swap of two neighbours counts as one) a misspelling is away
#: from its hook name: ``after_step`` is as alike as ``after_save`` by ratio, but three edits
#: away, so it is a helper, not a typo.
_MISSPELLING_EDITS: Final = 2


@final
@dataclass(frozen=True, slots=True)
class Impl:
    """One hook implementation as the session calls it.

    ``argnames`` are the spec arguments it takes by name, or, when ``positional``,
    it takes the first ``len(argnames)`` spec arguments in order.
    """

    function: Callable[..., Any]
    argnames: tuple[str, ...]
    plugin_name: str
    tryfirst: bool = False
    trylast: bool = False
    positional: bool = False


@final
@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One registered plugin: a hook object from code or an installed plugin."""

    #: The name it is registered under: the entry-point name for installed plugins,
    #: ``hooks[i]:ClassName`` for hooks passed in code.
    name: str
    plugin: object
    #: The distribution that installed it (``None`` for hooks passed in code).
    distribution: str | None = None
    version: str | None = None
    #: ``"hook"`` (passed in code) or ``"entry point"`` (installed).
    source: str = "hook"

    def describe(self) -> str:
        """A phrase naming the plugin and its distribution, for error messages."""
        if self.distribution is None:
            return f"hook {self.name!r} ({_qualname(self.plugin)})"
        return f"plugin {self.name!r} (distribution {self.distribution} {self.version})"


def disabled_from_env() -> frozenset[str]:
    """The plugin names listed in ``MONITORED_DISABLE_PLUGINS``."""
    raw = os.environ.get(DISABLE_ENV, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def autoload_enabled() -> bool:
    """Whether installed plugins are loaded (``MONITORED_DISABLE_PLUGIN_AUTOLOAD`` unset)."""
    return os.environ.get(DISABLE_AUTOLOAD_ENV, "").lower() not in {"1", "true", "yes"}


def installed_plugins(
    disabled: Iterable[str] = (), *, autoload: bool | None = None
) -> list[PluginInfo]:
    """Import the plugins installed under the ``monitored`` entry-point group.

    Sorted by entry-point name; names in ``disabled`` or in
    ``MONITORED_DISABLE_PLUGINS`` are skipped before import, and nothing is loaded
    when ``MONITORED_DISABLE_PLUGIN_AUTOLOAD=1`` (unless ``autoload=True``).
    Raises :class:`PluginLoadError` naming the plugin and distribution that failed,
    and :class:`PluginError` when ``disabled`` names a plugin that is not installed
    (a typo would otherwise leave the plugin on). Unknown names in the environment
    variable are logged once as a warning and ignored, since it may be shared by
    several environments.
    """
    entry_points = installed_entry_points()
    names = sorted({ep.name for ep in entry_points})
    unknown = sorted(frozenset(disabled) - set(names))
    if unknown:
        guesses = {
            name: close[0]
            for name in unknown
            if (close := difflib.get_close_matches(name, names, n=1))
        }
        hint = (
            " (did you mean " + ", ".join(f"{g!r} for {n!r}" for n, g in guesses.items()) + "?)"
            if guesses
            else ""
        )
        raise PluginError(
            f"disable_plugins names {unknown}, which are not installed{hint}; installed "
            f"plugins: {names or 'none'}",
            plugin=unknown[0],
        )
    if not (autoload_enabled() if autoload is None else autoload):
        return []
    from_env = disabled_from_env()
    _warn_unknown_in_env(from_env, {ep.name for ep in entry_points})
    skip = frozenset(disabled) | from_env
    found: dict[str, PluginInfo] = {}
    for ep in sorted(entry_points, key=lambda ep: (ep.name, _distribution(ep))):
        if ep.name in skip:
            continue
        if ep.name in found:
            other = found[ep.name]
            raise PluginLoadError(
                f"two installed distributions register a monitored plugin named {ep.name!r}: "
                f"{other.distribution} and {_distribution(ep)[0]}; uninstall one of them",
                plugin=ep.name,
                distribution=_distribution(ep)[0],
            )
        found[ep.name] = load_entry_point(ep)
    return list(found.values())


def load_entry_point(ep: importlib.metadata.EntryPoint) -> PluginInfo:
    """Import the plugin of one entry point of the ``monitored`` group.

    Raises :class:`PluginLoadError` naming the plugin and its distribution when
    the import fails or the entry point names a class.
    """
    dist_name, version = _distribution(ep)
    try:
        plugin = ep.load()
    except Exception as exc:
        raise PluginLoadError(
            f"plugin {ep.name!r} (distribution {dist_name} {version}) failed to import "
            f"{ep.value!r}: {type(exc).__name__}: {exc}. To run without it, set "
            f"{DISABLE_ENV}={ep.name} (or pip uninstall {dist_name})",
            plugin=ep.name,
            distribution=dist_name,
        ) from exc
    if inspect.isclass(plugin):
        raise PluginLoadError(
            f"plugin {ep.name!r} (distribution {dist_name} {version}): entry point "
            f"{ep.value!r} names a class; point it at a module or an instance",
            plugin=ep.name,
            distribution=dist_name,
        )
    info = PluginInfo(ep.name, plugin, dist_name, version, "entry point")
    _check_attribute_lookup(info)
    return info


#: What the core reads from an installed plugin by name, each with a default
#: (``getattr(plugin, name, default)``): the cluster it may supply, where it runs,
#: the version of its saved state.
_PLUGIN_ATTRIBUTES: Final = ("cluster", "chief_only", "training_only", "plugin_state_version")


def _check_attribute_lookup(info: PluginInfo) -> None:
    """Refuse, naming it, an installed plugin whose attribute lookup raises.

    ``getattr`` with a default and ``hasattr`` swallow only ``AttributeError``; a
    module ``__getattr__`` or an object's ``__getattr__`` that raises anything
    else would fail the session later with a bare error from the core's own
    lookup, naming neither the plugin nor the way to run without it.
    """
    for attribute in _PLUGIN_ATTRIBUTES:
        try:
            getattr(info.plugin, attribute, None)
        except Exception as exc:
            raise PluginLoadError(
                f"{info.describe()}: looking up its attribute {attribute!r} raised "
                f"{type(exc).__name__}: {exc} (a __getattr__ must raise AttributeError for "
                f"names it does not have). To run without it, set {DISABLE_ENV}={info.name} "
                f"(or pip uninstall {info.distribution})",
                plugin=info.name,
                distribution=info.distribution,
            ) from exc


_warned_env: set[tuple[str, frozenset[str]]] = set()


def _warn_unknown_in_env(
    names: frozenset[str], installed: set[str], variable: str = DISABLE_ENV
) -> None:
    """Log once (per set of names) the plugin names in ``variable`` that are not installed.

    Not an error: ``MONITORED_DISABLE_PLUGINS`` or ``MONITORED_PLUGIN_OPTIONS`` may
    be shared by environments with other plugins. But a typo would leave the
    plugin on, or its options unset, so it is said, with a "did you mean".
    """
    unknown = names - installed
    if not unknown or (variable, unknown) in _warned_env:
        return
    _warned_env.add((variable, unknown))
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, sorted(installed), n=1)
        log.warning(
            "%s names %r, which is not installed%s; it is ignored",
            variable,
            name,
            f" (did you mean {close[0]!r}?)" if close else "",
        )


def installed_plugin_names() -> frozenset[str]:
    """The names of every installed plugin, loaded or not (nothing is imported)."""
    return frozenset(ep.name for ep in installed_entry_points())


def installed_entry_points() -> Sequence[importlib.metadata.EntryPoint]:
    """The entry points of the ``monitored`` group, without importing them.

    Read again only when ``sys.path`` or the modification time of one of its
    directories changed (installing a distribution adds a ``.dist-info`` folder):
    reading them scans every installed distribution, several milliseconds that a
    session per evaluation would otherwise pay each time.
    """
    global _entry_points
    key = tuple((path, _mtime(path)) for path in sys.path)
    cached = _entry_points
    if cached is not None and cached[0] == key:
        return cached[1]
    found = tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    _entry_points = (key, found)
    return found


#: ``(sys.path with modification times, entry points)`` of the last read.
_entry_points: tuple[tuple[tuple[str, int | None], ...], tuple[Any, ...]] | None = None


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return None


def _distribution(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    """``(name, version)`` of the distribution that registers ``ep``.

    Reading them parses the distribution's metadata file (milliseconds per
    session with a few plugins), so each entry point object's answer is kept;
    the cache holds the object itself, so a recycled ``id`` never matches.
    """
    cached = _distributions.get(id(ep))
    if cached is not None and cached[0] is ep:
        return cached[1]
    dist = ep.dist
    if dist is None:  # pragma: no cover - entry points always come from a distribution
        found = ("<unknown>", "?")
    else:
        found = (dist.metadata["Name"] or dist.name, dist.version)
    if len(_distributions) > 4096:  # entry points read again and again: start over
        _distributions.clear()
    _distributions[id(ep)] = (ep, found)
    return found


#: ``id(entry point) -> (entry point, (distribution name, version))``.
_distributions: dict[int, tuple[importlib.metadata.EntryPoint, tuple[str, str]]] = {}


#: The positional implementations of each hook class (``_positional_impls``) as
#: ``{hook: (argnames, tryfirst, trylast)}``: the same for every object of the class
#: that holds no hook name in its own ``__dict__``, for as long as the class's methods
#: are the same (the first item, see ``_methods_of``); forgotten with the class.
_POSITIONAL: weakref.WeakKeyDictionary[
    type, tuple[tuple[int, ...], dict[str, tuple[tuple[str, ...], bool, bool]]]
] = weakref.WeakKeyDictionary()
#: The hook names in a fixed order (for ``_methods_of``).
_SPEC_ORDER: Final = tuple(sorted(_SPEC_NAMES))


def _methods_of(cls: type) -> tuple[int, ...]:
    """Which functions ``cls`` has under the hook names, as identities.

    Identities, not the functions: a method using ``super()`` refers to its class,
    which a cache keyed weakly by the class must not keep alive. A method replaced
    (a test's monkeypatch) changes it.
    """
    found = []
    for hook in _SPEC_ORDER:
        attr = getattr(cls, hook, None)
        found.append(id(getattr(attr, "__func__", attr)))
    return tuple(found)


def _methods_from_class(plugin: object) -> bool:
    """Whether ``plugin``'s hook methods all come from its class (none in its own ``__dict__``).

    Then what its class's methods are called with is the same for every object of it.
    A module or a class passed as a hook is looked up on itself: never.
    """
    if isinstance(plugin, types.ModuleType | type):
        return False
    try:
        own = object.__getattribute__(plugin, "__dict__")
    except AttributeError:
        return True
    return isinstance(own, dict) and _SPEC_NAMES.isdisjoint(own)


#: ``parse_hookspec_opts`` of each name of ``hookspecs``, computed once.
_SPEC_OPTS: dict[str, Any] = {}
#: The parsed hook implementation options of each plugin module and hook class,
#: by name (see ``PluginManager.parse_hookimpl_opts``); forgotten with them.
_IMPL_OPTS: weakref.WeakKeyDictionary[object, dict[str, Any]] = weakref.WeakKeyDictionary()


@final
class PluginManager(pluggy.PluginManager):
    """pluggy's manager with ``monitored``'s specs, marker-free hooks and clear errors."""

    def __init__(self) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}
        self._order: list[str] = []
        #: Implementations called positionally (TF1 style), by hook name; pluggy
        #: does not see them, as it would refuse their parameter names.
        self._positional: dict[str, list[Impl]] = {}
        #: Hook names of the plugin being registered that are positional.
        self._skip: frozenset[str] = frozenset()

    @property
    def infos(self) -> list[PluginInfo]:
        """The registered plugins in call order."""
        return [self._infos[name] for name in self._order]

    def parse_hookspec_opts(self, module_or_class: Any, name: str) -> Any:
        # The contract does not change while the process runs: parse each of its
        # names once, not once per manager (one per session, one per evaluation).
        if module_or_class is not hookspecs:
            return super().parse_hookspec_opts(module_or_class, name)
        try:
            return _SPEC_OPTS[name]
        except KeyError:
            opts = _SPEC_OPTS[name] = super().parse_hookspec_opts(module_or_class, name)
            return opts

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        # Dunders are never hooks: skipping them spares pluggy's static lookup of
        # each (most of an object's dir()), which a session per evaluation repeats.
        if name in self._skip or name.startswith("__"):
            return None
        # An installed plugin's module, and hook objects of the same class, are
        # registered again by every session: pluggy's static lookup of each of
        # their names, once per module or class (what an instance holds in its
        # own ``__dict__`` is looked up each time).
        if isinstance(plugin, types.ModuleType):
            key: object = plugin
        elif name in (own := getattr(plugin, "__dict__", ())):
            if type(own) is dict and not isinstance(
                own[name], types.FunctionType | types.MethodType
            ):
                return None  # an attribute (pluggy binds only functions and methods)
            return self._parse_impl(plugin, name)
        else:
            key = type(plugin)
        try:
            parsed = _IMPL_OPTS.get(key)
        except TypeError:  # not weakly referenceable
            return self._parse_impl(plugin, name)
        if parsed is None:
            parsed = _IMPL_OPTS[key] = {}
        if name not in parsed:
            parsed[name] = self._parse_impl(plugin, name)
        opts = parsed[name]
        return None if opts is None else dict(opts)

    def _parse_impl(self, plugin: object, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is not None or name not in _SPEC_NAMES:
            return opts
        attr = inspect.getattr_static(plugin, name, None)
        if isinstance(attr, staticmethod | classmethod):
            attr = attr.__func__
        if not (inspect.isfunction(attr) or inspect.ismethod(attr)):
            return None
        if isinstance(plugin, SessionRunHook) and attr is getattr(SessionRunHook, name, None):
            return None  # the base class's no-op default: not an implementation
        return {}

    def add(self, info: PluginInfo, position: int | None = None) -> None:
        """Register ``info.plugin`` at ``position`` in the call order (default: last).

        A bad hook raises :class:`PluginValidationError`.
        """
        if info.name in self._infos:
            hint = (
                "; give each input pipeline its own name (prefetch(..., name=...))"
                if info.name.startswith("input:")
                else ""
            )
            raise PluginValidationError(
                f"{info.describe()}: a plugin named {info.name!r} is already registered{hint}",
                plugin=info.name,
                distribution=info.distribution,
            )
        if any(other.plugin is info.plugin for other in self._infos.values()):
            raise PluginValidationError(
                f"{info.describe()} is passed twice; each hook object may be registered once",
                plugin=info.name,
                distribution=info.distribution,
            )
        hooks = self._check_hook_names(info)
        own = _own_functions(info.plugin)
        _check_misspellings(info, own)
        positional = self._positional_impls(info) if info.source == "hook" else {}
        self._skip = frozenset(positional)
        try:
            self.register(info.plugin, name=info.name)
        except pluggy.PluginValidationError as exc:
            hook = _hook_named_in(str(exc))
            raise PluginValidationError(
                f"{info.describe()} implements hook {hook!r} with a signature the "
                f"hookspec does not allow: {_last_line(str(exc))}; hookspec is "
                f"{hook}{_signature(hook)}",
                plugin=info.name,
                distribution=info.distribution,
                hook=hook,
            ) from exc
        finally:
            self._skip = frozenset()
        impls = self._impls_of(info.plugin, hooks)
        for impl in impls:
            if impl.wrapper or impl.hookwrapper:
                self.unregister(info.plugin)
                hook = impl.function.__name__
                raise PluginValidationError(
                    f"{info.describe()}: hook {hook!r} is marked as a wrapper; monitored "
                    "calls hooks itself (sync or async) and does not support pluggy wrappers",
                    plugin=info.name,
                    distribution=info.distribution,
                    hook=hook,
                )
        if info.source == "hook" and not impls and not positional:
            self.unregister(info.plugin)
            foreign = foreign_callbacks(own)
            raise PluginValidationError(
                f"{info.describe()} implements none of the hooks "
                f"({', '.join(sorted(_SPEC_NAMES))})"
                + "".join(f"; {n!r} is another framework's, use {h!r}" for n, h in foreign.items()),
                plugin=info.name,
            )
        if info.source == "hook":
            warn_foreign_callbacks(info.describe(), own)
        for hook, positional_impl in positional.items():
            self._positional.setdefault(hook, []).append(positional_impl)
        self._infos[info.name] = info
        self._order.insert(len(self._order) if position is None else position, info.name)

    def _positional_impls(self, info: PluginInfo) -> dict[str, Impl]:
        """The methods of hook object ``info.plugin`` to call positionally, as TF1 did.

        Those are the TF1 events of a ``SessionRunHook`` subclass, and any hook
        method whose parameter names are not all the spec's (``def after_run(self,
        rc, rv)``). Their arity is checked here: at most the spec's arguments.
        """
        plugin = info.plugin
        cls = type(plugin)
        cacheable = _methods_from_class(plugin)
        if cacheable:
            fingerprint = _methods_of(cls)
            try:
                known = _POSITIONAL.get(cls)
            except TypeError:  # a class that is not weakly referenceable
                known, cacheable = None, False
            if known is not None and known[0] == fingerprint:
                return {
                    hook: Impl(getattr(plugin, hook), args, info.name, first, last, True)
                    for hook, (args, first, last) in known[1].items()
                }
        found = self._find_positional(info)
        if cacheable:
            _POSITIONAL[cls] = (
                fingerprint,
                {hook: (i.argnames, i.tryfirst, i.trylast) for hook, i in found.items()},
            )
        return found

    def _find_positional(self, info: PluginInfo) -> dict[str, Impl]:
        """What :meth:`_positional_impls` returns, worked out from the object's methods."""
        plugin, found = info.plugin, {}
        for hook in _SPEC_NAMES:
            attr = inspect.getattr_static(plugin, hook, None)
            if isinstance(attr, staticmethod | classmethod):
                attr = attr.__func__
            if not inspect.isfunction(attr):
                continue
            if isinstance(plugin, SessionRunHook) and attr is getattr(SessionRunHook, hook, None):
                continue
            method = getattr(plugin, hook)
            spec_args = _SPEC_ARGS[hook]
            params, varargs = _positional_params(method)
            tf1_event = isinstance(plugin, SessionRunHook) and hook in _TF1_EVENTS
            if not (tf1_event or varargs) and {p.name for p in params} <= set(spec_args):
                continue  # names the spec's arguments: called by name
            count = len(spec_args) if varargs else min(len(params), len(spec_args))
            required = [p for p in params if p.default is inspect.Parameter.empty]
            if len(required) > len(spec_args):
                raise PluginValidationError(
                    f"{info.describe()} implements hook {hook!r} as {hook}"
                    f"{inspect.signature(method)}, which needs {len(required)} arguments; "
                    f"the hook passes {len(spec_args)}: {hook}({', '.join(spec_args)})",
                    plugin=info.name,
                    distribution=info.distribution,
                    hook=hook,
                )
            opts: Mapping[str, Any] = (
                pluggy.PluginManager.parse_hookimpl_opts(self, plugin, hook) or {}
            )
            found[hook] = Impl(
                method,
                spec_args[:count],
                info.name,
                tryfirst=bool(opts.get("tryfirst")),
                trylast=bool(opts.get("trylast")),
                positional=True,
            )
        return found

    def hooks_of(self, plugin: object) -> list[str]:
        """The names of the hooks ``plugin`` implements, sorted."""
        by_name = {caller.name for caller in self.get_hookcallers(plugin) or ()}
        positional = {
            hook
            for hook, impls in self._positional.items()
            for impl in impls
            if self._infos[impl.plugin_name].plugin is plugin
        }
        return sorted(by_name | positional)

    def _check_hook_names(self, info: PluginInfo) -> set[str]:
        """Refuse a marked name that is no hook; the names of the hooks ``info`` implements."""
        # Through parse_hookimpl_opts, which reads each name of a module or class once
        # per process: a marked name comes back with its marker's options, an unmarked
        # one that is not a hook name as None.
        hooks = set()
        for attr_name in dir(info.plugin):
            if attr_name.startswith("__"):
                continue
            opts = self.parse_hookimpl_opts(info.plugin, attr_name)
            if opts is None:
                continue
            hook = opts.get("specname") or attr_name
            hooks.add(hook)
            if hook not in _SPEC_NAMES:
                raise PluginValidationError(
                    f"{info.describe()} marks {attr_name!r} with @monitored.hookimpl, "
                    f"but there is no hook named {hook!r}; the hooks are "
                    f"{', '.join(sorted(_SPEC_NAMES))}",
                    plugin=info.name,
                    distribution=info.distribution,
                    hook=hook,
                )
        return hooks

    def _impls_of(self, plugin: object, hooks: Iterable[str]) -> list[pluggy.HookImpl]:
        """``plugin``'s registered implementations, among those of ``hooks``."""
        found: list[pluggy.HookImpl] = []
        for hook in hooks:
            caller: pluggy.HookCaller | None = getattr(self.hook, hook, None)
            if caller is not None:
                found.extend(impl for impl in caller.get_hookimpls() if impl.plugin is plugin)
        return found

    def ordered_impls(self, hook: str) -> list[tuple[Impl, PluginInfo]]:
        """The implementations of ``hook`` in call order.

        ``tryfirst`` ones, then the rest in registration order, then ``trylast``.
        """
        order = {name: i for i, name in enumerate(self._order)}
        impls = [
            Impl(i.function, tuple(i.argnames), i.plugin_name, i.tryfirst, i.trylast)
            for i in getattr(self.hook, hook).get_hookimpls()
        ]
        impls.extend(self._positional.get(hook, ()))

        def key(impl: Impl) -> tuple[int, int]:
            group = 0 if impl.tryfirst else 2 if impl.trylast else 1
            return group, order[impl.plugin_name]

        return [(impl, self._infos[impl.plugin_name]) for impl in sorted(impls, key=key)]


def _positional_params(method: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    """A bound method's positional parameters, and whether it takes ``*args``."""
    params = list(inspect.signature(method).parameters.values())
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in params if p.kind in positional], varargs


def _own_functions(plugin: object) -> list[str]:
    """Public function names ``plugin`` itself defines (not inherited from the hook base)."""
    if inspect.ismodule(plugin):
        return [
            name
            for name, value in vars(plugin).items()
            if not name.startswith("_")
            and inspect.isfunction(value)
            and value.__module__ == plugin.__name__
        ]
    names: set[str] = set()
    for cls in type(plugin).__mro__:
        if cls in (SessionRunHook, object):
            continue
        for name, value in vars(cls).items():
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if not name.startswith("_") and inspect.isfunction(value):
                names.add(name)
    return sorted(names)


@functools.lru_cache(maxsize=4096)
def _misspelled(name: str) -> str | None:
    """The hook ``name`` probably meant, if it is a near miss of one."""
    if name in _SPEC_NAMES:
        return None
    if name.removesuffix("_hook") in _SPEC_NAMES:
        return name.removesuffix("_hook")
    for match in difflib.get_close_matches(name, _SPEC_NAMES, n=3, cutoff=_MISSPELLING_CUTOFF):
        if _edit_distance(name, match) <= _MISSPELLING_EDITS:
            return match
    return None


def _edit_distance(a: str, b: str) -> int:
    """The fewest insertions, deletions, substitutions and neighbour swaps turning ``a`` into ``b``.

    (The optimal string alignment distance: ``begni`` is one edit from ``begin``.)
    """
    previous: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        before, previous, row = previous, row, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], before[j - 2] + 1)
    return row[len(b)]


def _near_misses(plugin: object, own: Iterable[str] | None = None) -> str:
    names = _own_functions(plugin) if own is None else own
    guesses = {n: g for n in names if (g := _misspelled(n)) is not None}
    if not guesses:
        return ""
    return "; did you mean " + ", ".join(f"{g!r} for {n!r}" for n, g in guesses.items()) + "?"


def _check_misspellings(info: PluginInfo, own: Iterable[str] | None = None) -> None:
    """Refuse a plugin whose public functions (``own``, if known) look like misspelled hooks."""
    near = _near_misses(info.plugin, own)
    if near:
        raise PluginValidationError(
            f"{info.describe()} defines functions that are not hooks but look like "
            f"misspelled hook names{near} (a helper needs a name unlike any hook, or a "
            "leading underscore)",
            plugin=info.name,
            distribution=info.distribution,
        )


def _qualname(obj: object) -> str:
    if inspect.ismodule(obj):
        return obj.__name__
    cls = public_class(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def public_class(obj: object) -> type:
    """The first class in ``type(obj)``'s MRO whose name is public, for messages.

    A constructor may return a private subclass (``SummarySaverHook(...)`` is a
    ``_FetchingSummarySaverHook``); the user wrote, and should read, the public name.
    """
    return next((cls for cls in type(obj).__mro__ if not cls.__name__.startswith("_")), type(obj))


def _hook_named_in(message: str) -> str:
    for name in _SPEC_NAMES:
        if f"hook {name!r}" in message:
            return name
    return "?"  # pragma: no cover - pluggy always names the hook


def _last_line(message: str) -> str:
    return message.strip().splitlines()[-1]


def _signature(hook: str) -> str:
    spec = getattr(hookspecs, hook, None)
    params = inspect.signature(spec).parameters if spec else ()
    return f"({', '.join(params)})"
