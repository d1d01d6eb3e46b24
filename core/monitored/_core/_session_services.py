"""What a session offers its hooks and plugins: calling hooks, values, options, scheduling.

``PluginServices`` is the plugin-facing side of :class:`~monitored.MonitoredSession`
(one of the collaborators it is made of; see ``_session.py``): calling plugins' own
events (``call_hook``), the last step's values (``fetch``), summaries and evaluation
reports, options, plugin state for checkpoints, deferred callbacks
(``call_after_hooks``), and which hooks the step loop calls (delegated, skipped),
which the hot path reads from ``_before_run``/``_after_run``/``_wake_at``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ._calling import CallPlan, HookCall, invoke
from ._cluster import Cluster
from ._errors import PluginError
from ._fetch import Fetcher, fetch_many
from ._plugins import public_class
from ._state import TrainState

if TYPE_CHECKING:
    from ..metrics import Metric

__all__ = ["PluginServices"]

log = logging.getLogger("monitored")

#: A global step no run reaches: nothing is skipped.
_NEVER: Final = 2**63


class PluginServices:
    """The services a session offers its hooks and plugins (a part of ``MonitoredSession``)."""

    _state: TrainState
    _cluster: Cluster
    _plan: CallPlan | None
    _options: dict[str, dict[str, Any]]
    _outputs: Mapping[str, Any]
    _fetcher: Fetcher
    _busy: bool
    _deferred: list[Callable[[], Any]]
    _created_once: bool
    _before_run: tuple[HookCall, ...]
    _after_run: tuple[HookCall, ...]
    _step_calls: tuple[tuple[HookCall, ...], tuple[HookCall, ...]]
    _skipping: dict[int, int]
    _wake_at: int

    def call_after_hooks(self, callback: Callable[[], Any]) -> Any:
        """Run ``callback()`` once every hook has handled the current event.

        For work that must see what all hooks did in this step (or in this
        ``after_create_session``): a checkpoint saver defers its save here, so the
        checkpoint of step *k* holds every plugin's state as it is after all of
        step *k*'s ``after_run`` calls, whatever the order of hooks. Callbacks run in
        the order they were deferred, before the step's stop decision, and may be
        ``async``. Deferred while hooks handle ``after_create_session``,
        ``before_run`` and ``after_run``; ``None`` is returned then.

        Outside those events (a hook's method called directly, as TF1 users' own
        hook tests call ``hook.after_create_session(session, coord)``, or from
        ``begin``) no other hook is to be waited for: ``callback()`` runs at once
        and its result is returned. For an ``async`` callback that is an
        awaitable, which the caller awaits, or returns from its own hook method
        for the session to await.
        """
        if not self._busy:
            return callback()
        self._deferred.append(callback)
        return None

    async def _run_deferred(self) -> None:
        deferred = self._deferred
        while deferred:  # a callback may defer another one
            callback = deferred.pop(0)
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                exc.add_note(
                    f"raised in {_name_of(callback)}, deferred with call_after_hooks at step "
                    f"{self._state.global_step}"
                )
                raise

    # -- services for hooks and plugins -----------------------------------------------------
    async def call_hook(self, hook: str, *args: Any) -> list[Any]:
        """Call every implementation of ``hook`` in order (for plugins' own events).

        ``args`` are the hookspec's arguments in order; returns their results.
        """
        return await self._require_plan().call(hook, *args, step=self._state.global_step)

    async def call_first(self, hook: str, *args: Any) -> Any:
        """Call implementations of ``hook`` until one returns something other than ``None``."""
        return await self._require_plan().call_first(hook, *args, step=self._state.global_step)

    def fetch(self, fetches: Any) -> Any:
        """Host values for a fetch structure, from the last step's outputs and the state."""
        [answer] = fetch_many([(fetches, lambda: "session.fetch")], self._outputs, self._state)
        return answer

    async def write_summaries(self, step: int, summaries: Mapping[str, Any]) -> None:
        """Hand ``summaries`` for ``step`` to every summary sink (``write_summaries``)."""
        await self.call_hook("write_summaries", self, step, summaries)

    async def report_evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        """Tell every hook and plugin that an evaluation finished (``after_evaluate``).

        ``step`` is the global step evaluated, ``metrics`` the results by name.
        Call it from a hook that evaluates inside training, so early stopping,
        progress and summaries plugins see the results.
        """
        await self.call_hook("after_evaluate", self, step, dict(metrics))

    def merge_metrics(self, metrics: Iterable[Metric]) -> None:
        """Merge ``metrics`` with the same metrics of the cluster's other processes.

        Through the session's :class:`~monitored.Cluster`: alone, nothing
        changes; under ``mpiexec`` (``monitored-mpi``) every rank then holds the
        totals over all ranks. For a sharded evaluation (``evaluate_once(...,
        sharded=True)`` calls it before reading the results); every process must
        call it, with the same metrics in the same order.
        """
        self._cluster.merge_metrics(list(metrics))

    def options_for(self, plugin: str) -> Mapping[str, Any]:
        """The resolved options of ``plugin`` (declared with ``declare_options``).

        Its defaults, overridden by ``MONITORED_PLUGIN_OPTIONS`` and then by the
        session's ``plugin_options`` argument. Available once entered.
        """
        self._require_plan()
        try:
            return self._options[plugin]
        except KeyError:
            raise PluginError(
                f"plugin {plugin!r} declares no options in this session (plugins that do: "
                f"{sorted(self._options) or 'none'})",
                plugin=plugin,
            ) from None

    def delegate_step_hooks(self, plugin: str, hook: object | None) -> None:
        """Call ``hook.before_run`` and ``hook.after_run`` in place of installed ``plugin``'s.

        For an installed plugin (a module, shared by every session) that keeps one hook
        object per session: its module functions would look that object up and call it
        at every step, two calls where one does. Called from the plugin's ``begin``,
        this makes the session call the object's methods directly, at the plugin's
        place in the call order, for the rest of the session. ``None`` says the plugin
        has nothing to do at any step of this session (early stopping without a
        ``monitor``): it then costs nothing per step. The plugin's other hooks are
        called as before; an event the plugin does not implement stays uncalled.
        """
        plan = self._require_plan()
        if not any(info.name == plugin for info in plan.infos):
            raise PluginError(
                f"delegate_step_hooks: no plugin {plugin!r} in this session (plugins: "
                f"{', '.join(info.name for info in plan.infos) or 'none'})",
                plugin=plugin,
            )
        before, after = self._step_calls
        self._set_step_calls(_delegate(before, plugin, hook, 1), _delegate(after, plugin, hook, 2))

    def skip_step_hooks(self, hook: object, until_step: int | None) -> None:
        """Call ``hook``'s ``before_run`` and ``after_run`` again only from step ``until_step``.

        For a hook that acts every ``N`` steps: on the steps in between the session
        calls nothing of it, so they cost it nothing (a hook's call costs the loop
        about 0.5 us, even one that returns at once). ``until_step`` is a global
        step: the next ``before_run`` is that of the step that starts at global
        step ``until_step - 1`` (the step that makes it ``until_step``), or of the
        first step that starts past it. Call it from the hook's ``after_run`` with
        the next step it is due at (``(step // N + 1) * N``); a step schedule only,
        as a time schedule needs a call to read the clock. ``None`` skips them
        for as long as the session is not created again (a hook with nothing to
        do in this session).

        ``hook`` is a hook object of this session (passed in ``hooks=``, or one
        an installed plugin handed its step hooks to with
        :meth:`delegate_step_hooks`) or an installed plugin's name. Its other
        hooks (``end``, ``after_evaluate``...) are called as before, and values it
        asked for with ``lag=1`` are still delivered to its ``after_run``. The skip
        ends when the session is created again or restored (the global step may
        go back), and a later call replaces an earlier one.
        """
        if until_step is not None and (
            isinstance(until_step, bool) or not isinstance(until_step, int)
        ):
            raise TypeError(
                f"skip_step_hooks: until_step must be a global step (int) or None, "
                f"got {until_step!r}"
            )
        index = self._plugin_index_of(hook, "skip_step_hooks")
        self._skipping[index] = _NEVER if until_step is None else until_step - 1
        self._wake_at = -1  # the next step's start applies it

    def _plugin_index_of(self, hook: object, what: str) -> int:
        """The plugin index of ``hook`` (an object or an installed plugin's name)."""
        plan = self._require_plan()
        for index, info in enumerate(plan.infos):
            if info.plugin is hook or (isinstance(hook, str) and info.name == hook):
                return index
        for call in (*self._step_calls[0], *self._step_calls[1]):
            if getattr(call.call, "__self__", None) is hook:
                return call.plugin_index
        raise PluginError(
            f"{what}: {hook!r} is not a hook of this session (its hooks and plugins: "
            f"{', '.join(info.name for info in plan.infos) or 'none'})"
        )

    def _set_step_calls(self, before: tuple[HookCall, ...], after: tuple[HookCall, ...]) -> None:
        """Call every one of ``before``/``after`` from the next step on; none is skipped."""
        self._step_calls = (before, after)
        self._before_run, self._after_run = before, after
        self._skipping.clear()
        self._wake_at = _NEVER

    def _reschedule(self) -> None:
        """Leave the skipped hooks out of this step's calls; call those due again."""
        step = self._state.global_step
        skipping = self._skipping
        for index, wake in list(skipping.items()):
            if wake <= step:
                del skipping[index]
        # A hook's lagged values are delivered at this step's after_run, skipped or not.
        late = self._fetcher.pending_for() & skipping.keys()
        before, after = self._step_calls
        self._before_run = tuple(c for c in before if c.plugin_index not in skipping)
        self._after_run = tuple(
            c for c in after if c.plugin_index not in skipping or c.plugin_index in late
        )
        self._wake_at = step + 1 if late else min(skipping.values(), default=_NEVER)

    def implements(self, hook: str) -> bool:
        """Whether any registered hook or plugin implements ``hook``."""
        return bool(self._require_plan()[hook])

    def implementers(self, hook: str) -> tuple[object, ...]:
        """The hook objects and plugins implementing ``hook``, in call order.

        For a plugin that hands values on to the others (a summary writer skips
        the handing when it is the only sink).
        """
        return tuple(call.info.plugin for call in self._require_plan()[hook])

    @property
    def has_summary_sinks(self) -> bool:
        """Whether any plugin implements ``write_summaries``."""
        return self.implements("write_summaries")

    async def plugin_states(self) -> dict[str, dict[str, Any]]:
        """Every plugin's ``plugin_state``, namespaced by plugin name and versioned."""
        saved: dict[str, dict[str, Any]] = {}
        for call, state in await self._require_plan().call_each("plugin_state", self):
            if state is not None:
                saved[call.info.name] = {
                    "version": _state_version(call.info.plugin),
                    "state": dict(state),
                }
        return saved

    async def load_plugin_states(self, saved: Mapping[str, Mapping[str, Any]]) -> None:
        """Give each plugin back what :meth:`plugin_states` saved for it.

        A plugin with nothing saved starts fresh when the session is created, and
        keeps the state it has on a later restore (a NaN guard's rollback, a
        re-creation), as its hooks are not made again; that is said (at INFO)
        only of plugins that hold state now, not of idle ones (an installed
        early stopping plugin with no ``monitor`` saves nothing and loses
        nothing). Each ``load_plugin_state`` is told the version its state was
        saved under, so that it can migrate an older layout.
        """
        plan = self._require_plan()
        holders = {call.plugin_index: call for call in plan["plugin_state"]}
        for call in plan["load_plugin_state"]:
            entry = saved.get(call.info.name)
            if entry is None:
                holder = holders.get(call.plugin_index)
                idle = holder is None or await invoke(holder, (self,)) is None
                log.log(
                    logging.DEBUG if idle else logging.INFO,
                    "No saved state for %s in what was restored; %s",
                    call.info.describe(),
                    "it keeps the state it has" if self._created_once else "it starts fresh",
                )
                continue
            state = entry.get("state") if isinstance(entry, Mapping) else None
            version = entry.get("version", 1) if isinstance(entry, Mapping) else None
            if (
                not isinstance(state, Mapping)
                or isinstance(version, bool)
                or not isinstance(version, int)
                or version < 1
            ):
                raise PluginError(
                    f"the saved state of {call.info.describe()} is malformed: expected "
                    f"{{'version': int >= 1, 'state': mapping}}, got {_shape_of(entry)}",
                    plugin=call.info.name,
                    distribution=call.info.distribution,
                    hook="load_plugin_state",
                )
            mine = _state_version(call.info.plugin)
            if version > mine:
                raise PluginError(
                    f"the checkpoint holds state version {version} for {call.info.describe()}, "
                    f"which reads versions up to {mine}; upgrade the plugin",
                    plugin=call.info.name,
                    distribution=call.info.distribution,
                    hook="load_plugin_state",
                )
            await invoke(call, (self, state, version), self._state.global_step)

    def _require_plan(self) -> CallPlan:
        if self._plan is None:
            raise RuntimeError("the session has not been entered yet")
        return self._plan


def _delegate(
    calls: tuple[HookCall, ...], plugin: str, hook: object | None, arguments: int
) -> tuple[HookCall, ...]:
    """``calls`` with ``plugin``'s call made to ``hook``'s method of that event (or left out)."""
    kept = []
    for call in calls:
        if call.info.name != plugin:
            kept.append(call)
            continue
        method = getattr(hook, call.hook, None) if hook is not None else None
        if method is None:
            continue
        if not _takes(method, arguments):
            raise PluginError(
                f"delegate_step_hooks: {_name_of(hook)}.{call.hook} of plugin {plugin!r} must "
                f"take the {call.hook} arguments in order "
                f"({'run_context' if arguments == 1 else 'run_context, run_values'})",
                plugin=plugin,
                hook=call.hook,
            )
        kept.append(call.delegated(method))
    return tuple(kept)


#: The methods found to take an event's arguments in order (``_takes``), by function:
#: a plugin delegates to an object of the same class in every session.
_TAKES: weakref.WeakKeyDictionary[Callable[..., Any], set[tuple[bool, int]]] = (
    weakref.WeakKeyDictionary()
)


def _takes(method: Callable[..., Any], arguments: int) -> bool:
    """Whether ``method`` can be called with ``arguments`` positional arguments."""
    function = getattr(method, "__func__", method)
    key = (function is not method, arguments)
    try:
        known = _TAKES.get(function)
    except TypeError:  # not weakly referenceable: checked each time
        known = None
    if known is not None and key in known:
        return True
    try:
        inspect.signature(method).bind(*range(arguments))
    except (TypeError, ValueError):
        return False
    with contextlib.suppress(TypeError):  # not weakly referenceable: not remembered
        _TAKES.setdefault(function, set()).add(key)
    return True


def _shape_of(entry: object) -> str:
    """A short description of a malformed saved entry (never its whole content)."""
    if isinstance(entry, Mapping):
        fields = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(entry.items())[:5])
        return f"a mapping {{{fields}}}"
    return f"a {type(entry).__name__}"


def _state_version(plugin: object) -> int:
    version = getattr(plugin, "plugin_state_version", 1)
    return version if isinstance(version, int) else 1


def _name_of(obj: object) -> str:
    if inspect.ismodule(obj) or inspect.isroutine(obj) or inspect.isclass(obj):
        return str(obj.__name__)
    return public_class(obj).__name__
