"""One owner per capability: what a plugin provides, who owns it in a session, who serves it.

A plugin declares the capabilities it provides with a ``provides`` attribute: a
set of names such as ``{"checkpoint"}``, on an installed plugin's module (or
object) and on a hook class. The names of this project's plugins are in
:data:`CAPABILITIES`; a third party may provide one of them (and so stand in for
ours) or name its own.

The declaration is used twice:

- **In a session** (:func:`split_owners`): a hook passed in ``hooks=[...]`` that
  provides a capability, or an argument that does (``cluster=`` provides
  ``"cluster"``), owns it. The installed plugin that provides the same steps
  aside: it is not registered in that session, and the session says so once. Two
  installed plugins providing one capability are an error, as two explicit hooks
  are not (the user asked for both).
- **Outside a session** (:func:`provider`): the core finds the one installed
  plugin that provides ``"checkpoint"`` or ``"summaries"`` and calls that
  plugin's capability hooks (``latest_checkpoint``, ``restore_checkpoint``, ...;
  see :mod:`monitored.hookspecs`). The core never imports a plugin package by
  name, so another provider can stand in for ours; nor does a plugin import
  another (a NaN guard's rollback asks ``monitored.provider("checkpoint",
  session=...)``, which prefers the session's own owner of the capability).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

import pluggy

from . import _plugins
from ._errors import MissingPluginError, PluginError, PluginValidationError, install_hint
from ._plugins import DISABLE_ENV, PluginInfo, PluginManager, disabled_from_env, public_class

if TYPE_CHECKING:
    from ._session import MonitoredSession

__all__ = [
    "CAPABILITIES",
    "CAPABILITY_HOOKS",
    "Provider",
    "StepAside",
    "find_provider",
    "provider",
    "provides_of",
    "split_owners",
]

#: The capabilities of this project's plugin packages: the entry-point name and the
#: distribution of our provider of each (for "install this" and "it is disabled").
CAPABILITIES: Final[Mapping[str, tuple[str, str]]] = {
    "checkpoint": ("checkpoint", "monitored-checkpoint"),
    "summaries": ("summaries", "monitored-summaries"),
    "nan_guard": ("nan_guard", "monitored-nan-guard"),
    "early_stopping": ("early_stopping", "monitored-early-stopping"),
    "progress": ("progress", "monitored-progress"),
    "cluster": ("mpi", "monitored-mpi"),
    "pruning": ("optuna", "monitored-optuna"),
    "mlflow": ("mlflow", "monitored-mlflow"),
}

#: The capability hooks (see :mod:`monitored.hookspecs`): called on a provider alone.
CAPABILITY_HOOKS: Final = frozenset(
    {
        "latest_checkpoint",
        "restore_checkpoint",
        "read_checkpoint",
        "list_checkpoints",
        "save_checkpoint",
        "checkpoints_iterator",
        "checkpoint_saver",
        "checkpoint_hooks",
        "summary_writer",
        "summary_hooks",
        "summary_session_log",
    }
)


def provides_of(info: PluginInfo) -> frozenset[str]:
    """The capabilities ``info.plugin`` declares in its ``provides`` attribute (may be none).

    A single string (``provides = "checkpoint"``, which would read as a set of
    letters) or anything but non-empty strings is a :class:`PluginValidationError`
    naming the plugin.
    """
    declared = getattr(info.plugin, "provides", None)
    if declared is None:
        return frozenset()
    names = (
        None
        if isinstance(declared, str | bytes | Mapping) or not isinstance(declared, Iterable)
        else tuple(declared)
    )
    if names is None or not all(isinstance(name, str) and name for name in names):
        raise PluginValidationError(
            f"{info.describe()}: provides must be a set of capability names such as "
            f"{{'checkpoint'}}, got {declared!r}",
            plugin=info.name,
            distribution=info.distribution,
        )
    return frozenset(names)


@final
@dataclass(frozen=True, slots=True)
class StepAside:
    """An installed plugin that does not act in a session: another owner has its capability."""

    plugin: PluginInfo
    capability: str
    #: Who took it over: a hook (``"NanTensorHook in hooks[0]"``) or an argument.
    owner: str
    #: Whether the owner is a hook of the stepping-aside plugin's own package, passed in
    #: ``hooks=[...]`` (``SummarySaverHook`` and ``monitored-summaries``): a takeover the
    #: user asked for, which is no news. Another package's hook or an argument may surprise.
    asked: bool = False

    def level(self, default: int) -> int:
        """The level to log :meth:`message` at: DEBUG for a takeover asked for, else ``default``."""
        return logging.DEBUG if self.asked else default

    def message(self) -> str:
        """The line the session logs about it (once per session, at INFO)."""
        info = self.plugin
        who = (
            info.describe()
            if info.distribution is None
            else f"plugin {info.name!r} ({info.distribution} {info.version})"
        )
        return f"{who} steps aside: {self.owner} provides {self.capability!r}"


def split_owners(
    explicit: Sequence[PluginInfo],
    installed: Sequence[PluginInfo],
    arguments: Mapping[str, str] | None = None,
) -> tuple[list[PluginInfo], list[StepAside]]:
    """Which installed plugins act in a session, and which step aside for an explicit owner.

    ``explicit`` are the session's hooks, ``arguments`` maps a capability to the
    argument that provides it (``{"cluster": "the cluster= argument"}``). Returns
    the installed plugins that stay, in order, and one :class:`StepAside` per
    plugin that does not. Two installed plugins that provide one capability are
    a :class:`PluginError` naming both.
    """
    owners: dict[str, str] = dict(arguments or {})
    owner_hooks: dict[str, object] = {}
    for position, info in enumerate(explicit):
        for capability in sorted(provides_of(info)):
            if capability not in owners:
                owners[capability] = f"{_name_of(info.plugin)} in hooks[{position}]"
                owner_hooks[capability] = info.plugin
    providers: dict[str, PluginInfo] = {}
    kept: list[PluginInfo] = []
    stepped: list[StepAside] = []
    for info in installed:
        capabilities = provides_of(info)
        for capability in sorted(capabilities):
            other = providers.setdefault(capability, info)
            if other is not info:
                raise _two_providers(capability, other, info)
        taken = sorted(capabilities & owners.keys())
        if taken:
            hook = owner_hooks.get(taken[0])
            asked = hook is not None and _package_of(hook) == _package_of(info.plugin)
            stepped.append(StepAside(info, taken[0], owners[taken[0]], asked))
        else:
            kept.append(info)
    return kept, stepped


def _package_of(obj: object) -> str:
    """The top-level package a hook or plugin object comes from (``monitored_summaries``)."""
    module = obj.__name__ if inspect.ismodule(obj) else type(obj).__module__
    return module.partition(".")[0]


def _name_of(hook: object) -> str:
    """The name a user knows a hook by: its module's, or its first public class's."""
    return hook.__name__ if inspect.ismodule(hook) else public_class(hook).__name__


def _two_providers(capability: str, first: PluginInfo, second: PluginInfo) -> PluginError:
    return PluginError(
        f"{first.describe()} and {second.describe()} both provide {capability!r}; a "
        f"capability has one owner: disable one of them (disable_plugins=[{second.name!r}] "
        f"or {DISABLE_ENV}={second.name}), or uninstall it",
        plugin=second.name,
        distribution=second.distribution,
    )


@final
class Provider:
    """The installed plugin that provides a capability, called through its hooks.

    Capability hooks are plain synchronous calls (the core makes them from
    synchronous code and worker threads); :meth:`call` calls the provider's
    implementation only, never another plugin's.
    """

    __slots__ = ("_manager", "capability", "info")

    def __init__(self, capability: str, info: PluginInfo) -> None:
        self.capability = capability
        self.info = info
        self._manager = PluginManager()
        self._manager.add(info)

    def implements(self, hook: str) -> bool:
        """Whether the provider implements capability hook ``hook``."""
        caller: pluggy.HookCaller = getattr(self._manager.hook, hook)
        return bool(caller.get_hookimpls())

    def require(self, *hooks: str) -> None:
        """Raise now the :class:`PluginError` that :meth:`call` would raise for a missing hook.

        For a feature that will need ``hooks`` later (a NaN guard's rollback),
        so that a provider lacking one fails when the session starts.
        """
        for hook in hooks:
            if not self.implements(hook):
                raise self._lacks(hook)

    def call(self, hook: str, **kwargs: Any) -> Any:
        """The result of the provider's ``hook(**kwargs)``.

        A provider that lacks the hook is a :class:`PluginError` saying so; an
        exception raised by the hook propagates with a note naming the plugin.
        """
        if not self.implements(hook):
            raise self._lacks(hook)
        try:
            result = getattr(self._manager.hook, hook)(**kwargs)
        except Exception as exc:
            exc.add_note(f"raised in hook {hook!r} of {self.info.describe()}")
            raise
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise PluginError(
                f"hook {hook!r} of {self.info.describe()} returned an awaitable; capability "
                "hooks are called synchronously: make it a plain function",
                plugin=self.info.name,
                distribution=self.info.distribution,
                hook=hook,
            )
        return result

    def _lacks(self, hook: str) -> PluginError:
        return PluginError(
            f"{self.info.describe()} provides {self.capability!r} but does not implement "
            f"the {hook!r} hook, which a {self.capability} provider needs here",
            plugin=self.info.name,
            distribution=self.info.distribution,
            hook=hook,
        )

    def __repr__(self) -> str:
        return f"<Provider of {self.capability!r}: {self.info.describe()}>"


#: ``capability -> (entry points, disabled names, provider)`` of the last lookups.
_found: dict[str, tuple[Sequence[Any], frozenset[str], Provider]] = {}


def provider(
    capability: str,
    why: str = "",
    remedy: str = "",
    *,
    session: MonitoredSession | None = None,
) -> Provider:
    """The plugin that provides ``capability``, to call its capability hooks.

    Public as ``monitored.provider``: how the core, and a plugin that needs
    another plugin's capability, find it without importing a package by name
    (``monitored.provider("checkpoint", "rollback restores checkpoints")``).

    With ``session``, the owner of ``capability`` in that session serves first:
    the first of ``session.plugins`` that provides it and implements capability
    hooks (an explicit ``CheckpointSaverHook``, or the installed plugin acting
    there). Otherwise the one installed plugin that provides it
    (``MONITORED_DISABLE_PLUGINS`` is obeyed; ``MONITORED_DISABLE_PLUGIN_AUTOLOAD``
    is not, as the feature was asked for). ``why`` says what needs it
    (``"warm_start reads checkpoints"``), ``remedy`` how to do without (``"; pass
    saver=None to ..."``). None installed is a :class:`MissingPluginError` naming
    the package to install (or saying it is disabled); two are a
    :class:`PluginError`. The installed one is kept until the installed
    distributions or the environment variable change.
    """
    if session is not None:
        for info in session.plugins:
            if capability in provides_of(info) and any(
                callable(getattr(info.plugin, hook, None)) for hook in CAPABILITY_HOOKS
            ):
                return Provider(capability, info)
    entry_points, disabled = _plugins.installed_entry_points(), disabled_from_env()
    cached = _found.get(capability)
    if cached is not None and cached[0] is entry_points and cached[1] == disabled:
        return cached[2]
    installed = _plugins.installed_plugins(autoload=True)
    found = [info for info in installed if capability in provides_of(info)]
    if len(found) > 1:
        raise _two_providers(capability, found[0], found[1])
    if not found:
        raise _missing(capability, why, remedy, disabled)
    answer = Provider(capability, found[0])
    _found[capability] = (entry_points, disabled, answer)
    return answer


def find_provider(capability: str) -> Provider | None:
    """The installed provider of ``capability``, or ``None`` where none is (nor disabled)."""
    try:
        return provider(capability, "")
    except MissingPluginError:
        return None


def _missing(
    capability: str, why: str, remedy: str, disabled: frozenset[str]
) -> MissingPluginError:
    plugin, distribution = CAPABILITIES.get(capability, (capability, None))
    if plugin in disabled:
        state = f"the {plugin!r} plugin, which provides it, is disabled ({DISABLE_ENV})"
    elif distribution is not None:
        state = f"no installed plugin provides it ({install_hint(distribution)})"
    else:
        state = "no installed plugin provides it"
    need = f"{why} with a {capability!r} plugin" if why else f"a {capability!r} plugin is needed"
    return MissingPluginError(
        f"{need}, but {state}{remedy}",
        plugin=plugin,
        distribution=distribution,
    )
