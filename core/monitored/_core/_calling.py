"""Calling hook implementations: ours, not pluggy's, because hooks may be async.

pluggy has no released support for awaiting implementations, so the session
calls them itself. The order and the way each implementation takes its
arguments are worked out once per session (a :class:`CallPlan`); a step then
costs one plain call per implementation, plus an ``await`` for async ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final, final

from .. import hookspecs
from ._errors import OutOfRangeError
from ._plugins import Impl, PluginInfo, PluginManager

__all__ = ["CallPlan", "HookCall", "annotate"]

_SPEC_ARGS: Final = {
    name: tuple(inspect.signature(getattr(hookspecs, name)).parameters)
    for name in hookspecs.__all__
}


@final
class HookCall:
    """One hook implementation, adapted to take the spec's arguments positionally."""

    __slots__ = ("call", "hook", "info", "is_async", "plugin_index")

    def __init__(self, hook: str, impl: Impl, info: PluginInfo, index: int) -> None:
        self.hook = hook
        self.info = info
        self.plugin_index = index
        self.is_async = inspect.iscoroutinefunction(impl.function)
        self.call: Callable[..., Any] = (
            _first_args(impl.function, len(impl.argnames), len(_SPEC_ARGS[hook]))
            if impl.positional
            else _adapt(impl.function, impl.argnames, _SPEC_ARGS[hook])
        )

    def delegated(self, function: Callable[..., Any]) -> HookCall:
        """This implementation's place in the call order, calling ``function`` instead.

        ``function`` takes the spec's arguments in order (a hook object's method).
        """
        call = object.__new__(HookCall)
        call.hook = self.hook
        call.info = self.info
        call.plugin_index = self.plugin_index
        call.is_async = inspect.iscoroutinefunction(function)
        call.call = function
        return call

    def __repr__(self) -> str:
        return f"<HookCall {self.hook} of {self.info.name}>"


def _adapt(
    function: Callable[..., Any], argnames: tuple[str, ...], spec_args: tuple[str, ...]
) -> Callable[..., Any]:
    if argnames == spec_args:
        return function
    picks = tuple(spec_args.index(name) for name in argnames)
    if not picks:
        return lambda *_: function()
    return lambda *args: function(*[args[i] for i in picks])


def _first_args(function: Callable[..., Any], count: int, total: int) -> Callable[..., Any]:
    """Call ``function`` with the first ``count`` of the spec's ``total`` arguments."""
    if count == total:
        return function
    if count == 0:
        return lambda *_: function()
    return lambda *args: function(*args[:count])


def annotate(exc: BaseException, call: HookCall, step: int | None = None) -> None:
    """Add a note to ``exc`` naming the hook, plugin and distribution (and step)."""
    where = f" at step {step}" if step is not None else ""
    exc.add_note(f"raised in hook {call.hook!r} of {call.info.describe()}{where}")


@final
class CallPlan:
    """The implementations of every hook of one session, in call order.

    Each hook's list is worked out the first time it is asked for (a session
    calls a dozen of the hooks, and the plans made only to call one hook while
    plugins are being registered call just that one); the manager must not
    change after the plan is made.
    """

    __slots__ = ("_index", "_manager", "_plans", "infos")

    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager
        self.infos: tuple[PluginInfo, ...] = tuple(manager.infos)
        self._index = {info.name: i for i, info in enumerate(self.infos)}
        self._plans: dict[str, tuple[HookCall, ...]] = {}

    def __getitem__(self, hook: str) -> tuple[HookCall, ...]:
        try:
            return self._plans[hook]
        except KeyError:
            if hook not in _SPEC_ARGS:
                raise
        index = self._index
        plan = self._plans[hook] = tuple(
            HookCall(hook, impl, info, index[info.name])
            for impl, info in self._manager.ordered_impls(hook)
        )
        return plan

    async def call(self, hook: str, *args: Any, step: int | None = None) -> list[Any]:
        """Call every implementation of ``hook`` in order; return their results."""
        return [result for _, result in await self.call_each(hook, *args, step=step)]

    async def call_each(
        self, hook: str, *args: Any, step: int | None = None
    ) -> list[tuple[HookCall, Any]]:
        """Like :meth:`call`, pairing each result with the implementation that gave it."""
        results = []
        for call in self[hook]:
            results.append((call, await invoke(call, args, step)))
        return results

    async def call_first(self, hook: str, *args: Any, step: int | None = None) -> Any:
        """Call implementations in order until one returns something other than None."""
        for call in self[hook]:
            result = await invoke(call, args, step)
            if result is not None:
                return result
        return None


async def invoke(call: HookCall, args: tuple[Any, ...], step: int | None = None) -> Any:
    """Call one implementation, awaiting its result if it is awaitable."""
    try:
        result = call.call(*args)
        if call.is_async or inspect.isawaitable(result):
            result = await result
    except StopIteration as exc:  # it cannot cross a coroutine (PEP 479)
        raise OutOfRangeError(
            f"hook {call.hook!r} of {call.info.describe()} raised StopIteration: "
            "the input is exhausted"
        ) from exc
    except Exception as exc:
        annotate(exc, call, step)
        raise
    return result
