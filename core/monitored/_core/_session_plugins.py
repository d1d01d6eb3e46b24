"""Which hooks and plugins a session calls: its own hooks, installed plugins, their options.

``PluginRegistration`` is the part of :class:`~monitored.MonitoredSession` that
composes its plugins when it opens (see ``_session.py``): the explicit hooks, the
installed plugins that apply (chief-only, training-only, stepped aside for an
explicit owner of their capability), a cluster an installed plugin supplies, the
options each declares, the hooks ``MonitoredTrainingSession``'s plugins add, and the
"Loaded plugins" line. The result is the session's call plan.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ._calling import CallPlan, HookCall
from ._capabilities import CAPABILITIES, StepAside, provides_of, split_owners
from ._cluster import Cluster
from ._config import TrainingConfig
from ._errors import MissingPluginError, PluginError, install_hint
from ._options import resolve_options
from ._plugins import (
    DISABLE_AUTOLOAD_ENV,
    PluginInfo,
    PluginManager,
    autoload_enabled,
    disabled_from_env,
    installed_plugin_names,
    installed_plugins,
)
from ._session_services import _name_of

__all__ = ["PluginRegistration"]

log = logging.getLogger("monitored")

#: Features of ``MonitoredTrainingSession``: (the capability, does the config ask for
#: it, the argument). Who provides each, and what to install, is in ``CAPABILITIES``.
_FEATURES: Final = (
    ("checkpoint", "wants_checkpoints", "checkpoint_dir"),
    ("summaries", "wants_summaries", "save_summaries_steps/secs"),
)


class PluginRegistration:
    """Composes a session's hooks and installed plugins (a part of ``MonitoredSession``)."""

    _hooks: list[object]
    _cluster: Cluster
    _cluster_given: bool
    _disabled: frozenset[str]
    _training_config: TrainingConfig | None
    _plugin_options: Mapping[str, Mapping[str, Any]]
    _options: dict[str, dict[str, Any]]
    _plan: CallPlan | None
    _stepped_aside: tuple[StepAside, ...]
    _idle_suppliers: frozenset[str]
    _plugins_log_level: int
    _loads_training_only_plugins: bool

    if TYPE_CHECKING:

        @property
        def is_chief(self) -> bool: ...

        def _set_step_calls(
            self, before: tuple[HookCall, ...], after: tuple[HookCall, ...]
        ) -> None: ...

    # -- plugins -------------------------------------------------------------------------------
    async def _register_plugins(self) -> None:
        available = installed_plugins(self._disabled)
        if not self._cluster_given:
            await self._find_cluster(available)
        manager = PluginManager()
        config = self._training_config
        hooks = self._hooks
        if config is not None and not self.is_chief and config.chief_only_hooks:
            hooks = [h for h in hooks if not any(h is c for c in config.chief_only_hooks)]
        for i, hook in enumerate(hooks):
            manager.add(PluginInfo(_hook_name(hook, f"hooks[{i}]:{_name_of(hook)}"), hook))
        explicit = manager.infos
        installed, stepped_aside = split_owners(
            explicit,
            [
                info
                for info in available
                if (self.is_chief or not getattr(info.plugin, "chief_only", False))
                and (
                    self._loads_training_only_plugins
                    or not getattr(info.plugin, "training_only", False)
                )
            ],
            {"cluster": "the cluster= argument"} if self._cluster_given else None,
        )
        for info in installed:
            manager.add(info)
        declared = {
            call.info.name: list(options or ())
            for call, options in await CallPlan(manager).call_each("declare_options")
        }
        self._options = resolve_options(
            declared,
            self._plugin_options,
            loaded=[info.name for info in manager.infos],
            installed=installed_plugin_names(),
        )
        if config is not None:
            config = self._training_config = dataclasses.replace(
                config, plugin_options=self._options, is_chief=self.is_chief
            )
            self._check_features(
                config, {c for info in [*explicit, *installed] for c in provides_of(info)}
            )
            position = len(hooks)
            for call, hooks in await CallPlan(manager).call_each("training_hooks", config):
                for hook in _hook_list(hooks, call):
                    name = f"hooks[{position}]:{_name_of(hook)}<{call.info.name}>"
                    manager.add(PluginInfo(_hook_name(hook, name), hook), position)
                    position += 1
        self._plan = CallPlan(manager)
        self._set_step_calls(self._plan["before_run"], self._plan["after_run"])
        statuses = {}
        for call, status in await self._plan.call_each("plugin_status", self):
            if status is not None and not isinstance(status, str):
                raise PluginError(
                    f"hook 'plugin_status' of {call.info.describe()} returned "
                    f"{type(status).__name__}; it must return a string or None",
                    plugin=call.info.name,
                    distribution=call.info.distribution,
                    hook="plugin_status",
                )
            if status:
                statuses[call.info.name] = status
        for name in self._idle_suppliers:
            statuses.setdefault(name, "inactive: it supplied no cluster, this process trains alone")
        for step_aside in stepped_aside:
            statuses.setdefault(
                step_aside.plugin.name,
                f"stepped aside: {step_aside.owner} provides {step_aside.capability!r}",
            )
        _log_plugins(
            [*self._plan.infos, *(s.plugin for s in stepped_aside)],
            self._plugins_log_level,
            statuses,
        )
        for step_aside in stepped_aside:
            log.log(step_aside.level(self._plugins_log_level), "%s", step_aside.message())
        self._stepped_aside = tuple(stepped_aside)

    async def _find_cluster(self, available: Iterable[PluginInfo]) -> None:
        """Let an installed plugin supply the cluster (the ``cluster`` hookspec).

        Suppliers that supply none (``monitored-mpi`` in a single process) are
        kept in ``_idle_suppliers``: the "Loaded plugins" line says they are inactive.
        """
        suppliers = [info for info in available if hasattr(info.plugin, "cluster")]
        if not suppliers:
            return
        probe = PluginManager()
        for info in suppliers:
            probe.add(info)
        supplied = await CallPlan(probe).call_first("cluster", self)
        if supplied is not None:
            self._cluster = supplied
        else:
            self._idle_suppliers = frozenset(info.name for info in suppliers)

    @property
    def stepped_aside(self) -> tuple[StepAside, ...]:
        """The installed plugins that do not act in this session, because an explicit hook
        or argument provides their capability (available once entered)."""
        return self._stepped_aside

    def _check_features(self, config: TrainingConfig, provided: set[str]) -> None:
        for capability, wanted, argument in _FEATURES:
            if capability in provided or not getattr(config, wanted):
                continue
            plugin, distribution = CAPABILITIES[capability]
            if argument == "save_summaries_steps/secs" and not (
                config.explicit & {"save_summaries_steps", "save_summaries_secs"}
            ):
                log.debug("summaries left at their default, and %s is not installed", distribution)
                continue
            if plugin in self._disabled | disabled_from_env():
                why = "is disabled"
            elif not autoload_enabled():
                why = f"is not loaded: {DISABLE_AUTOLOAD_ENV} is set"
            else:
                why = f"is not installed ({install_hint(distribution)})"
            raise MissingPluginError(
                f"MonitoredTrainingSession was asked for {plugin} ({argument}), which the "
                f"{plugin!r} plugin provides, but it {why}",
                plugin=plugin,
                distribution=distribution,
            )


def _log_plugins(infos: Iterable[PluginInfo], level: int, statuses: Mapping[str, str]) -> None:
    """The "Loaded plugins" line: each installed plugin, with what it said it does."""
    installed = []
    for info in infos:
        if info.distribution:
            status = statuses.get(info.name)
            note = f"; {_one_line(status)}" if status else ""
            installed.append(f"{info.name} ({info.distribution} {info.version}{note})")
    log.log(level, "Loaded plugins: %s", ", ".join(installed) if installed else "none installed")


def _one_line(status: str) -> str:
    """A plugin's status as a short phrase: text on one line, at most 120 characters."""
    text = " ".join(status.split())
    return text if len(text) <= 120 else text[:119] + "…"


def _hook_list(returned: Any, call: HookCall) -> list[object]:
    if returned is None:
        return []
    if isinstance(returned, str | bytes | Mapping) or not isinstance(returned, Iterable):
        raise PluginError(
            f"hook 'training_hooks' of {call.info.describe()} returned "
            f"{type(returned).__name__}; it must return a list of hooks or None",
            plugin=call.info.name,
            distribution=call.info.distribution,
            hook="training_hooks",
        )
    return list(returned)


def _hook_name(hook: object, default: str) -> str:
    """A hook's ``plugin_name`` attribute, else its position-based default name.

    The name keys the hook's state in checkpoints: a stable ``plugin_name`` keeps
    that state when the list of hooks is reordered.
    """
    name = getattr(hook, "plugin_name", None)
    if name is None:
        return default
    if not isinstance(name, str) or not name:
        raise PluginError(
            f"hook {default!r}: plugin_name must be a non-empty string, got {name!r}",
            plugin=default,
        )
    return name
