"""``MonitoredSession``: the async step loop with hooks, recovery and a clean close.

Lifecycle (TF1's, see ``docs/tf1-migration.md``): ``begin`` on every hook, the
state restored or initialized, ``after_create_session``; then for each ``run``:
``before_run``, the step, one batched fetch, ``after_run``; on a normal end
``end``. An end of input raised in the ``async with`` body is a normal end; any
other exception skips ``end`` and propagates unchanged once the session has
closed. ``AbortedError`` and ``UnavailableError`` re-create the session and retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, final

import anyio
import anyio.abc
import anyio.lowlevel

from ._calling import CallPlan, HookCall, annotate, invoke
from ._capabilities import CAPABILITIES, StepAside, provides_of, split_owners
from ._cluster import Cluster, LocalCluster
from ._config import TrainingConfig
from ._coordinator import END_OF_INPUT, Coordinator
from ._errors import (
    AbortedError,
    MissingPluginError,
    OutOfRangeError,
    PluginError,
    UnavailableError,
    install_hint,
)
from ._fetch import Fetcher, fetch_many
from ._options import resolve_options
from ._plugins import (
    DISABLE_AUTOLOAD_ENV,
    PluginInfo,
    PluginManager,
    autoload_enabled,
    disabled_from_env,
    installed_plugin_names,
    installed_plugins,
    public_class,
)
from ._profiler import StepTrace
from ._run import RunOptions, SessionRunArgs, SessionRunContext, SessionRunValues
from ._scaffold import Scaffold, SessionManager
from ._state import TrainState, check_global_step
from ._tf1_arguments import refuse_tf1_arguments
from ._watchdog import (
    FROM_ENV,
    LoopWatchdog,
    blocked_loop_threshold,
    describe_culprit,
)

if TYPE_CHECKING:
    from ..metrics import Metric

__all__ = ["MonitoredSession", "RawSession", "SingularMonitoredSession", "StepContext"]

log = logging.getLogger("monitored")

#: How often a step loop whose steps never wait gives the event loop a turn, so
#: background tasks run and cancel scopes around the loop take effect.
YIELD_INTERVAL_SECS: Final = 0.005

#: Steps in a row that leave the global step unchanged before the session warns
#: that the step function probably forgets ``state.global_step += 1``.
STALLED_STEPS_WARNING: Final = 10

#: Errors after which the session is re-created and the step retried.
RECOVERABLE: Final = (AbortedError, UnavailableError)

_NO_RESULTS: Final = SessionRunValues(None)
#: A global step no run reaches: nothing is skipped.
_NEVER: Final = 2**63

#: Features of ``MonitoredTrainingSession``: (the capability, does the config ask for
#: it, the argument). Who provides each, and what to install, is in ``CAPABILITIES``.
_FEATURES: Final = (
    ("checkpoint", "wants_checkpoints", "checkpoint_dir"),
    ("summaries", "wants_summaries", "save_summaries_steps/secs"),
)


class MonitoredSession:
    """Runs training steps over a :class:`~monitored.TrainState`, calling hooks.

    Use it as ``async with MonitoredSession(state, hooks=[...]) as sess:`` and call
    ``await sess.run(step_fn, *args, **kwargs)`` until ``sess.should_stop()``.

    Args:
        state: the arrays, global step and RNG to train (a new empty one if omitted).
        hooks: hook objects, called in list order. Installed plugins (the
            ``monitored`` entry-point group) are called after them.
        scaffold: how to initialize the state and tell it is ready.
        is_chief: the chief restores or initializes the state; other processes
            wait until it is ready, at most ``max_wait_secs``.
        stop_grace_period_secs: how long closing waits for the coordinator's
            threads once a stop is requested (its tasks are cancelled at once).
        disable_plugins: names of installed plugins not to load (also
            ``MONITORED_DISABLE_PLUGINS``, comma-separated).
        recovery_wait_secs: how often a worker checks whether the chief has made
            the state ready (TF1's ``SessionManager`` argument, 30 s).
        max_recoveries: how many times the session may be re-created after an
            ``AbortedError``/``UnavailableError`` (``None``: no limit, as TF1).
        session_manager: replaces the default ``SessionManager(scaffold)``.
        training_config: set by ``MonitoredTrainingSession``; plugins contribute
            hooks for it through the ``training_hooks`` hookspec.
        plugin_options: options of installed plugins, by plugin name
            (``{"progress": {"every_n_steps": 10}}``); each plugin declares its own
            (``declare_options``). ``MONITORED_PLUGIN_OPTIONS`` sets them too.
        coord: the :class:`~monitored.Coordinator` to use (default: a new one). A
            ``Supervisor`` passes its own, so that ``sv.coord`` exists before the
            session starts.
        blocked_loop_warning_secs: when a synchronous hook or step function
            holds the event loop longer than this, log one warning naming it
            (default 1 s; ``None`` or ``0``: never). Without the argument,
            ``MONITORED_BLOCKED_LOOP_WARNING_SECS`` sets it (``off`` switches it off).
    """

    _recoverable = True
    #: Whether to warn when steps leave the global step unchanged (an evaluation
    #: session, whose step never moves, turns it off).
    _warn_stalled_global_step = True
    #: The level of the "Loaded plugins" line (an evaluation session, one of many, says it quietly).
    _plugins_log_level = logging.INFO
    #: Whether installed plugins marked ``training_only`` are loaded (an evaluation
    #: session leaves out early stopping, NaN guards, progress and checkpoint saving).
    _loads_training_only_plugins = True

    #: Input pipelines among its hooks whose end the session's loop handles itself
    #: (a sharded evaluation's input): they do not look for their next batch to
    #: stop every process together, as other ``monitored.data`` pipelines do.
    _inputs_counted_by_loop: tuple[object, ...] = ()

    def __init__(
        self,
        state: TrainState | None = None,
        *,
        hooks: Iterable[object] | None = None,
        scaffold: Scaffold | None = None,
        is_chief: bool = True,
        stop_grace_period_secs: float = 120,
        max_wait_secs: float = 7200,
        disable_plugins: Iterable[str] = (),
        max_recoveries: int | None = None,
        session_manager: SessionManager | None = None,
        training_config: TrainingConfig | None = None,
        cluster: Cluster | None = None,
        plugin_options: Mapping[str, Mapping[str, Any]] | None = None,
        recovery_wait_secs: float = 30,
        session_creator: None = None,
        config: None = None,
        coord: Coordinator | None = None,
        blocked_loop_warning_secs: float | None = FROM_ENV,
    ) -> None:
        refuse_tf1_arguments(type(self).__name__, session_creator=session_creator, config=config)
        if state is not None and not isinstance(state, TrainState):
            raise TypeError(
                f"state must be a monitored.TrainState, got {type(state).__name__}; "
                "wrap your arrays: TrainState({'w': w, ...})"
            )
        if coord is not None and not isinstance(coord, Coordinator):
            raise TypeError(f"coord must be a monitored.Coordinator, got {type(coord).__name__}")
        if max_recoveries is not None and max_recoveries < 0:
            raise ValueError(f"max_recoveries must be >= 0 or None, got {max_recoveries}")
        self._state = state if state is not None else TrainState()
        self._hooks = list(hooks or ())
        for i, hook in enumerate(self._hooks):
            if inspect.isclass(hook):
                raise TypeError(
                    f"hooks[{i}] is the class {hook.__name__}, not a hook object: pass an "
                    f"instance, {hook.__name__}(...)"
                )
        self._cluster: Cluster = cluster or LocalCluster(is_chief)
        #: Whether a cluster was given: else an installed plugin may supply one.
        self._cluster_given = cluster is not None
        #: True once the processes agreed to stop (the stop is then the same everywhere).
        self._stop_agreed = False
        self._session_manager = session_manager or SessionManager(scaffold, recovery_wait_secs)
        self._stop_grace_period_secs = stop_grace_period_secs
        self._max_wait_secs = max_wait_secs
        self._disabled = frozenset(disable_plugins)
        self._max_recoveries = max_recoveries
        self._training_config = training_config
        self._plugin_options = plugin_options if plugin_options is not None else {}
        self._options: dict[str, dict[str, Any]] = {}
        self._coord = coord if coord is not None else Coordinator()
        self._blocked_loop_secs = blocked_loop_threshold(blocked_loop_warning_secs)
        self._plan: CallPlan | None = None
        self._before_run: tuple[HookCall, ...] = ()
        self._after_run: tuple[HookCall, ...] = ()
        #: Every ``before_run``/``after_run`` call, skipped or not (``skip_step_hooks``).
        self._step_calls: tuple[tuple[HookCall, ...], tuple[HookCall, ...]] = ((), ())
        #: Skipped hooks by plugin index: the global step a step starts at to call them again.
        self._skipping: dict[int, int] = {}
        #: The smallest of those (``_NEVER`` when none): one comparison per step.
        self._wake_at = _NEVER
        self._task_group: anyio.abc.TaskGroup | None = None
        self._entered = False
        self._open = False
        #: True while hooks or a step run: ``run`` from inside them is refused.
        self._busy = False
        self._should_stop = False
        self._recoveries = 0
        self._next_yield = 0.0
        self._outputs: Mapping[str, Any] = {}
        self._trace: StepTrace | None = None
        #: Whether this session finalized the state (and so un-finalizes it on exit).
        self._finalizes_state = False
        #: Fetch plans cached per hook, and values held for hooks that asked with lag=1.
        self._fetcher = Fetcher()
        #: Callbacks deferred with ``call_after_hooks``, run once the current event is done.
        self._deferred: list[Callable[[], Any]] = []
        #: The coroutine of the last ``run`` until it starts (to catch a missing await).
        self._unawaited: Coroutine[Any, Any, Any] | None = None
        self._last_global_step = -1
        self._stalled_steps = 0
        #: The global step when the session was first created: until a step leaves it
        #: elsewhere, steps that do not move it are warned about (see _note_stalled_step).
        self._start_step: int | None = None
        self.restored_from: Any = None
        #: Installed plugins that stepped aside for an explicit owner of their capability.
        self._stepped_aside: tuple[StepAside, ...] = ()
        #: Installed cluster plugins asked for a cluster that supplied none.
        self._idle_suppliers: frozenset[str] = frozenset()
        #: Whether the session was created once: a restore after that (a rollback, a
        #: re-creation) leaves plugins with the state they have, not a fresh one.
        self._created_once = False
        #: What ``raise_after_close`` asked to raise once the session closed normally.
        self._after_close: BaseException | None = None

    # -- properties -----------------------------------------------------------------------
    @property
    def state(self) -> TrainState:
        """The :class:`~monitored.TrainState` being trained."""
        return self._state

    @property
    def coord(self) -> Coordinator:
        """The session's :class:`~monitored.Coordinator`."""
        return self._coord

    @property
    def is_chief(self) -> bool:
        """Whether this process is the chief (restores, checkpoints, writes summaries)."""
        return self._cluster.is_chief

    @property
    def cluster(self) -> Cluster:
        """The processes this session trains with: :class:`~monitored.LocalCluster`
        alone, or the one a ``cluster`` plugin supplied (``monitored-mpi`` under
        ``mpiexec``). Known once the session is entered."""
        return self._cluster

    @property
    def scaffold(self) -> Scaffold:
        """How the state is initialized and checked ready (the session manager's)."""
        return self._session_manager.scaffold

    @property
    def plugins(self) -> tuple[PluginInfo, ...]:
        """Every registered hook and plugin, in call order (available once entered)."""
        return self._plan.infos if self._plan is not None else ()

    @property
    def stopped_by_signal(self) -> str | None:
        """The name of the signal (``"SIGTERM"``, ``"SIGINT"``) that stopped the session, if any.

        A hook that turns a signal into a clean stop says so with a
        ``preempted_by`` attribute naming the signal it received (``None``
        until then), as ``monitored-checkpoint``'s ``CheckpointSaverHook``
        does; this is the first such name among the session's hooks and
        plugins. A session stopped by a signal closes normally (its last
        checkpoint saved, ``end`` run): code that runs sessions (a
        hyper-parameter search, a loop over runs) reads this after the
        ``async with`` to tell "interrupted" from "finished".
        """
        for info in self.plugins:
            name = getattr(info.plugin, "preempted_by", None)
            if isinstance(name, str):
                return name
        return None

    @property
    def last_outputs(self) -> Mapping[str, Any]:
        """The outputs of the most recent step (empty before the first)."""
        return self._outputs

    @property
    def stop_grace_period_secs(self) -> float:
        """How long closing waits for the coordinator's threads (and plugins' last sends)."""
        return self._stop_grace_period_secs

    @property
    def training_config(self) -> TrainingConfig | None:
        """The configuration given by ``MonitoredTrainingSession``, if any."""
        return self._training_config

    # -- entering and leaving ------------------------------------------------------------------
    async def __aenter__(self) -> MonitoredSession:
        if self._entered:
            raise RuntimeError("a MonitoredSession can be entered only once")
        self._entered = True
        self._finalizes_state = not self._state.finalized
        try:
            await self._register_plugins()
        except BaseException as exc:
            self._cluster.fail(exc)
            raise
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        if self._blocked_loop_secs is not None:
            infos = self.plugins
            watchdog = LoopWatchdog(self._blocked_loop_secs, lambda f: describe_culprit(f, infos))
            self._task_group.start_soon(watchdog.run, name="monitored loop watchdog")
        self._coord._attach(self._task_group)
        self._open = True
        try:
            await self.call_hook("begin", self)
            await self._create_with_recovery(recreating=False)
            self._start_step = self._state.global_step
        except BaseException as exc:
            await self._close(failure=exc)
            raise
        return self

    def __enter__(self) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__} is an async context manager: write "
            "`async with MonitoredTrainingSession(...) as sess:` inside an `async def "
            "main()`, run with anyio.run(main) (in Jupyter: `await main()` in a cell), and "
            "`await sess.run(step_fn, ...)`"
        )

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        return None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None and self._unawaited is not None:
            try:
                self._check_awaited()
            except RuntimeError as unawaited:
                await self._close(failure=unawaited)
                raise
        end_of_input = isinstance(exc, END_OF_INPUT)
        if not self._open and exc is None:
            # As TF1: close() was called inside the block, which then left normally.
            raise RuntimeError(
                "Session is already closed: close() was called inside `async with`, "
                "which closes the session itself"
            )
        failure = exc if exc is not None and not end_of_input else self._coord.exception
        await self._close(failure=failure)
        if failure is not None and failure is not exc:
            raise failure
        if failure is None and self._after_close is not None:
            raise self._after_close
        return end_of_input

    async def close(self) -> None:
        """Close the session if still open: a normal end (``end`` is called) unless a
        background task failed, whose exception is then raised."""
        if self._open:
            failure = self._coord.exception
            await self._close(failure=failure)
            if failure is not None:
                raise failure
            if self._after_close is not None:
                raise self._after_close

    async def _close(self, failure: BaseException | None) -> None:
        if not self._open:
            return
        self._open = False
        self._should_stop = True
        self._coord._closing = True
        try:
            await self._close_open(failure)
        except BaseException as exc:
            # What escapes the close (a stop decision timing out, an ``end`` hook, a
            # background task) is this process's failure as much as one known before.
            self._cluster.fail(exc)
            raise
        if failure is not None:
            self._cluster.fail(failure)

    async def _close_open(self, failure: BaseException | None) -> None:
        """Close the open session: ``end`` unless ``failure``, then the background tasks."""
        error = failure
        try:
            if failure is None:
                if not self._stop_agreed and not isinstance(self._cluster, LocalCluster):
                    # An end of input (or a close) that no step agreed on: meet the
                    # other processes' stop decision, so that they end too.
                    self._stop_agreed = self._cluster.agree_to_stop(True)
                if self._fetcher.pending is not None:
                    await self._deliver_late(SessionRunContext(None, self))
                await self._call_end()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._fetcher.drop()
            self._coord.request_stop()
            task_group, self._task_group = self._task_group, None
            try:
                if task_group is not None:
                    task_group.cancel_scope.cancel()
                    await task_group.__aexit__(None, None, None)
            finally:
                self._coord._attach(None)
                self._outputs = {}
                if self._finalizes_state:
                    # As TF1 un-finalizes its graph: a later session on the same
                    # state (evaluation after training) may add entries in begin.
                    self._state.unfinalize()
                with anyio.CancelScope(shield=True):
                    try:
                        await self._before_close(error)
                    finally:
                        await self._join(failure)

    async def _before_close(self, error: BaseException | None) -> None:
        """Tell the plugins how the session ended (``before_close``)."""
        if self._plan is None or not self._plan["before_close"]:
            return
        try:
            await self.call_hook("before_close", self, error)
        except Exception as exc:
            if error is None:
                raise
            log.warning("While closing after an error, a before_close hook failed too: %r", exc)

    async def _call_end(self) -> None:
        """Call every ``end``, even after one of them raised.

        A plugin failing at the end must not cost another its final work (the
        checkpoint hook's last save runs whatever hook came before it). The first
        error is raised once every ``end`` has run, its note naming the hook and
        plugin; the later ones are added to it as notes, never lost.
        """
        step = self._state.global_step
        first: Exception | None = None
        for call in self._require_plan()["end"]:
            try:
                await invoke(call, (self,), step)
            except Exception as exc:
                if first is None:
                    first = exc
                else:
                    first.add_note(
                        f"hook 'end' of {call.info.describe()} raised too: "
                        f"{type(exc).__name__}: {exc}"
                    )
        if first is not None:
            raise first

    async def _join(self, failure: BaseException | None) -> None:
        try:
            await self._coord.join(
                stop_grace_period_secs=self._stop_grace_period_secs,
                ignore_live_threads=failure is not None,
            )
        except Exception as exc:
            if failure is None:
                raise
            if exc is not failure:
                log.warning("While closing after an error, a background task failed too: %r", exc)

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
        _log_plugins(self._plan.infos, self._plugins_log_level, statuses)
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

    # -- creating the session -----------------------------------------------------------------
    async def _create_with_recovery(self, *, recreating: bool) -> None:
        """Create the session, retrying after ``AbortedError``/``UnavailableError``."""
        while True:
            try:
                await self._create_session(recreating=recreating)
                return
            except RECOVERABLE as exc:
                if not self._may_recover(exc):
                    raise
                # A retried creation does what the failed one would have done: a
                # first creation still initializes the state (runs init_fn).

    async def _create_session(self, *, recreating: bool) -> None:
        self._busy = True  # hooks run below: `run` from them is refused
        try:
            if self.is_chief:
                self.restored_from = await self._session_manager.prepare_session(
                    self, recreating=recreating
                )
            await self._cluster.share_state(self, self._max_wait_secs)
            if not self.is_chief:
                await self._session_manager.wait_for_session(self, self._max_wait_secs)
            self._state.finalize()
            # The global step may have gone back (a restore): no hook stays skipped.
            self._set_step_calls(*self._step_calls)
            await self.call_hook("after_create_session", self, self._coord)
            await self._run_deferred()
            if not isinstance(self._cluster, LocalCluster):
                # A stop asked for while the session was created (StopAtStepHook of a
                # run resumed at its last step) holds before the first step, on every
                # process alike: they agree on it now.
                self._agree_to_stop_now(self._coord._stopped)
            self._created_once = True
        finally:
            self._deferred.clear()
            self._busy = False

    def _may_recover(self, exc: BaseException) -> bool:
        """Count a recovery after ``exc``; ``False`` if no more are allowed."""
        self._recoveries += 1
        if not self._recoverable or (
            self._max_recoveries is not None and self._recoveries > self._max_recoveries
        ):
            return False
        if not isinstance(self._cluster, LocalCluster):
            exc.add_note(
                "Not recovered: this process trains with others, which are already past "
                "this step or waiting in its collectives; one process cannot re-create "
                "its session alone, so the job ends (every process); restart it to "
                "resume from the last checkpoint"
            )
            return False
        log.warning(
            "%s at step %d: re-creating the session and retrying (recovery %d): %s",
            type(exc).__name__,
            self._state.global_step,
            self._recoveries,
            exc,
        )
        return True

    async def _recover(self, exc: BaseException) -> bool:
        """Re-create the session after ``exc``; ``False`` if recovery is not allowed."""
        if not self._may_recover(exc):
            return False
        # As TF1 gives each incarnation a new coordinator: the tasks hooks started
        # for the old one stop, and after_create_session starts them afresh.
        coord = self._coord
        coord._cancel_tasks()
        if coord._stopped:
            # A recoverable error reported to the coordinator (a lost peer, an input
            # service gone): the old incarnation's threads are stopped and joined,
            # and the coordinator starts clean.
            with contextlib.suppress(Exception):
                await coord.join(
                    stop_grace_period_secs=self._stop_grace_period_secs,
                    ignore_live_threads=True,
                )
            coord.clear_stop()
        await self._create_with_recovery(recreating=True)
        return True

    def _recovery_pending(self) -> bool:
        """Whether the coordinator holds a recoverable error this session will recover from."""
        return (
            self._recoverable
            and isinstance(self._coord._exc, RECOVERABLE)
            and isinstance(self._cluster, LocalCluster)
            and (self._max_recoveries is None or self._recoveries < self._max_recoveries)
        )

    def _cause(self, exc: BaseException) -> BaseException | None:
        """The recoverable error behind ``exc``: itself, or the one the coordinator holds.

        A step that fails because the coordinator stopped (a cancelled wait, a closed
        queue) hides the root cause; as TF1, the coordinator's recoverable error is
        what counts.
        """
        if isinstance(exc, RECOVERABLE):
            return exc
        held = self._coord._exc
        return held if isinstance(held, RECOVERABLE) else None

    async def _recover_if_pending(self) -> None:
        if self._coord._stopped and self._recovery_pending():
            held = self._coord._exc
            assert held is not None
            await self._recover(held)

    # -- running steps ----------------------------------------------------------------------
    def should_stop(self) -> bool:
        """Whether the loop should end: a hook, the step or a background task asked.

        A recoverable error reported to the coordinator (``AbortedError``,
        ``UnavailableError``) is not a stop: the next ``run`` re-creates the session.
        """
        if self._unawaited is not None:
            self._check_awaited()
        if self._should_stop:
            return True
        if not isinstance(self._cluster, LocalCluster):
            # Processes stop only together, after a step's agreement: a stop
            # requested since then is agreed on at the end of the next step.
            return False
        return self._coord._stopped and not self._recovery_pending()

    def raise_after_close(self, exc: BaseException) -> None:
        """Stop, and raise ``exc`` from the ``async with`` once the session has closed.

        For a hook whose verdict ends the run without it being a failure (Optuna's
        ``TrialPruned``): the stop is requested through the coordinator, so it
        takes effect after the current step, through the stop agreement of every
        process; the close is a normal one (``end`` runs on every hook, a final
        checkpoint and summaries are written); then ``exc`` is raised instead of
        leaving the block normally. A failure of the session (an exception in the
        block, a hook or a background task) is raised instead, ``exc`` dropped.
        The first verdict asked for is the one raised.
        """
        if not isinstance(exc, BaseException):
            raise TypeError(
                f"raise_after_close takes an exception, got {type(exc).__name__}: {exc!r}"
            )
        if self._after_close is None:
            self._after_close = exc
        self._coord.request_stop()

    def _log_stop(self, requested_by: str | None) -> None:
        """Log who asked for the stop the processes agreed on."""
        who = requested_by or self._coord.stop_requested_by
        if who is None:
            alone = isinstance(self._cluster, LocalCluster)
            who = "an earlier stop request" if alone else "another process of the job"
        log.info("Stopping after step %d: stop requested by %s", self._state.global_step, who)

    def _agree_to_stop_now(self, local: bool, requested_by: str | None = None) -> bool:
        """Take part in a stop agreement that every process holds at this same point.

        Besides the one at the end of each step: before the first batch of an
        input pipeline (``monitored.data``), or for a step this process sits out.
        ``True`` when the processes agreed to stop (the loop then ends).
        """
        if self._cluster.agree_to_stop(local):
            self._should_stop = self._stop_agreed = True
            self._log_stop(requested_by)
            return True
        return False

    def _sit_out_step(self) -> None:
        """Take part in a step's stop agreement without running the step or its hooks.

        For a process of a job that has nothing to do in a step the others run
        (a sharded evaluation whose shard is done): the others' agreement at the
        end of that step needs this process's vote.
        """
        self._check_can_run()
        self._agree_to_stop_now(self._coord._stopped and not self._recovery_pending())

    def _check_awaited(self) -> None:
        """Raise if the last ``run`` was never awaited (its coroutine never started)."""
        coroutine, self._unawaited = self._unawaited, None
        if coroutine is None or inspect.getcoroutinestate(coroutine) != "CORO_CREATED":
            return
        coroutine.close()  # no "never awaited" RuntimeWarning on top of this error
        raise RuntimeError(
            "MonitoredSession.run() was called without await, so the step never ran: "
            "write `await sess.run(step_fn, ...)` inside an async function (the loop runs "
            "under anyio.run(main) or asyncio.run(main); in Jupyter, `await main()` in a cell)"
        )

    def _check_can_run(self) -> None:
        if not self._open:
            state = "closed" if self._entered else "not entered"
            raise RuntimeError(f"the session is {state}; use `async with session:` around runs")
        if self._busy:
            raise RuntimeError(
                "run called from inside a hook or a step; hooks read values with "
                "SessionRunArgs fetches or session.fetch(...), and run_step_fn's "
                "step_context.session runs steps without hooks"
            )
        if self._should_stop or (self._coord.should_stop() and not self._recovery_pending()):
            self._coord.raise_requested_exception()
            if not self._should_stop and not isinstance(self._cluster, LocalCluster):
                return  # a local stop request: the step runs, and its end agrees on it
            raise RuntimeError("Run called even after should_stop requested.")

    def run(
        self, step_fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, Mapping[str, Any]]:
        """Run one training step with hooks; return the step's outputs (``await`` it).

        Calls ``step_fn(state, *args, **kwargs, **feeds)`` (awaiting it if it is
        async), where ``feeds`` are what hooks asked to add. The step returns a
        mapping of names to arrays (or ``None``); those names, and the state's
        entries, are what hooks may fetch.

        A plain method returning the coroutine, so that misuse fails at the call:
        ``run`` from inside a hook (TF1 hooks called ``session.run``) raises
        ``RuntimeError`` at once, and a ``run`` that was never awaited is reported
        by the next ``should_stop()`` or ``run`` instead of looping forever.
        """
        if self._unawaited is not None:
            self._check_awaited()
        if not self._open or self._busy or self._should_stop or self._coord._stopped:
            self._check_can_run()
        self._unawaited = coroutine = self._run(step_fn, args, kwargs)
        return coroutine

    async def _run(
        self, step_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Mapping[str, Any]:
        self._unawaited = None
        if self._coord._stopped:
            await self._recover_if_pending()
        while True:
            try:
                outputs = await self._run_hooked(step_fn, args, kwargs)
            except Exception as exc:
                cause = self._cause(exc)
                if cause is None:
                    raise
                if not await self._recover(cause):
                    if cause is not exc:  # as TF1: the root cause, not its symptom
                        raise cause from exc
                    raise
                continue
            if self._coord._stopped:
                await self._recover_if_pending()
            return outputs

    async def run_step_fn(self, step_fn: Callable[[StepContext], Any]) -> Any:
        """Run ``step_fn(step_context)``, which decides how the step runs.

        ``await step_context.run_with_hooks(fn, ...)`` runs a hooked step,
        ``step_context.session.run(fn, ...)`` runs one without hooks, and
        ``step_context.request_stop()`` ends the loop after this call. Returns what
        ``step_fn`` returns (``None`` when it requested a stop).
        """
        self._check_can_run()
        _check_step_fn(step_fn)
        await self._recover_if_pending()
        while True:
            context = StepContext(self)
            try:
                try:
                    result = step_fn(context)
                except StopIteration as exc:
                    raise _end_of_input(f"step function {_name_of(step_fn)}") from exc
                if inspect.isawaitable(result):
                    result = await result
            except _StopRequested:
                self._agree_to_stop_now(True, f"step function {_name_of(step_fn)}")
                return None
            except Exception as exc:
                cause = self._cause(exc)
                if cause is None:
                    raise
                if not await self._recover(cause):
                    if cause is not exc:  # as TF1: the root cause, not its symptom
                        raise cause from exc
                    raise
                continue
            await self._recover_if_pending()
            return result

    async def _run_hooked(
        self, step_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Mapping[str, Any]:
        # The hot path, kept in one coroutine on purpose: each extra coroutine layer
        # costs about 0.3 us per step (benchmarks/overhead.py).
        now = time.monotonic()
        if now >= self._next_yield:
            self._next_yield = now + YIELD_INTERVAL_SECS
            await anyio.lowlevel.checkpoint()
        self._busy = True
        try:
            state = self._state
            if state.global_step >= self._wake_at:
                self._reschedule()
            context = SessionRunContext(None, self, kwargs)
            requests: list[tuple[HookCall, SessionRunArgs]] = []
            feeds: dict[str, Any] | None = None
            #: Set once a hook asks for a trace (RunOptions(trace=True)): the rest of
            #: the step is recorded. Steps nobody traces pay two `is None` tests.
            trace: StepTrace | None = None
            for call in self._before_run:
                started = time.perf_counter() if trace is not None else 0.0
                try:
                    asked = call.call(context)
                    # SessionRunArgs before isawaitable, whose ABC check costs ~0.3 us.
                    if asked is not None and (
                        call.is_async
                        or (type(asked) is not SessionRunArgs and inspect.isawaitable(asked))
                    ):
                        asked = await asked
                except StopIteration as exc:
                    raise _end_of_input(f"hook 'before_run' of {call.info.describe()}") from exc
                except Exception as exc:
                    annotate(exc, call, state.global_step)
                    raise
                if trace is not None:
                    trace.add(call.info.name, "before_run", started)
                if asked is None:
                    continue
                if type(asked) is not SessionRunArgs and not isinstance(asked, SessionRunArgs):
                    raise TypeError(
                        f"hook 'before_run' of {call.info.describe()} returned "
                        f"{type(asked).__name__}; it must return SessionRunArgs or None"
                    )
                if asked.fetches is not None:
                    requests.append((call, asked))
                if asked.feeds:
                    feeds = self._merge_feeds(feeds, asked.feeds, kwargs, call)
                if asked.options is not None:
                    trace = self._start_trace(trace, asked.options, call)

            if feeds:
                kwargs = {**kwargs, **feeds}
            if trace is not None:
                return await self._finish_traced(step_fn, args, kwargs, context, requests, trace)
            try:
                returned = step_fn(state, *args, **kwargs) if args or kwargs else step_fn(state)
            except StopIteration as exc:
                raise _end_of_input(f"step function {_name_of(step_fn)}") from exc
            except TypeError:
                # Checked only once the call failed: nothing on the hot path.
                if not callable(step_fn):
                    _refuse_fetches(type(self).__name__, step_fn)
                raise
            if type(returned) is not dict:
                if inspect.isawaitable(returned):
                    returned = await returned
                if type(returned) is not dict:
                    returned = _outputs_of(returned, step_fn)
            outputs: Mapping[str, Any] = returned
            self._outputs = outputs
            # Inlined on purpose (the hot path); _track_global_step is the same for traced steps.
            if type(state.global_step) is not int:
                state.global_step = check_global_step(state.global_step, step_fn)
            if state.global_step == self._last_global_step:
                self._note_stalled_step(step_fn)
            else:
                self._last_global_step = state.global_step
                self._stalled_steps = 0

            results = (
                self._fetcher.answers(requests, outputs, state)
                if requests or self._fetcher.pending is not None
                else None
            )
            for call in self._after_run:
                values = results.get(call.plugin_index, _NO_RESULTS) if results else _NO_RESULTS
                try:
                    done = call.call(context, values)
                    if done is not None and (call.is_async or inspect.isawaitable(done)):
                        await done
                except StopIteration as exc:
                    raise _end_of_input(f"hook 'after_run' of {call.info.describe()}") from exc
                except Exception as exc:
                    annotate(exc, call, state.global_step)
                    raise
            if self._deferred:
                await self._run_deferred()
            # _agree_to_stop_now inlined on purpose (the hot path: one call less per step).
            if self._cluster.agree_to_stop(
                context._stop_requested or (self._coord._stopped and not self._recovery_pending())
            ):
                self._should_stop = self._stop_agreed = True
                self._log_stop(context.stop_requested_by)
                if self._fetcher.pending is not None:
                    await self._deliver_late(context)
            return outputs
        finally:
            if self._deferred:  # left by a failed step: never run them later
                self._deferred.clear()
            self._busy = False

    # -- traced steps ---------------------------------------------------------------------------
    def _start_trace(
        self, trace: StepTrace | None, options: RunOptions, call: HookCall
    ) -> StepTrace | None:
        """Begin recording this step when ``call``'s hook asked for a trace."""
        if trace is None and options.trace:
            trace = StepTrace(self._state.global_step + 1, show_memory=options.show_memory)
            self._trace = trace
        if trace is not None:
            trace.requested_by[call.plugin_index] = options
            if options.show_memory:
                trace.show_memory = True
        return trace

    async def _finish_traced(
        self,
        step_fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        context: SessionRunContext,
        requests: list[tuple[HookCall, Any]],
        trace: StepTrace,
    ) -> Mapping[str, Any]:
        """The rest of a step a hook asked to trace: step, fetch and ``after_run``, timed.

        Kept apart from ``_run_hooked`` so that steps nobody traces pay nothing.
        """
        state = self._state
        try:
            trace.memory(state)
            started = time.perf_counter()
            try:
                returned = step_fn(state, *args, **kwargs) if args or kwargs else step_fn(state)
                if inspect.isawaitable(returned):
                    returned = await returned
            except StopIteration as exc:
                raise _end_of_input(f"step function {_name_of(step_fn)}") from exc
            except TypeError:
                if not callable(step_fn):
                    _refuse_fetches(type(self).__name__, step_fn)
                raise
            trace.add("step", _name_of(step_fn), started)
            outputs = _outputs_of(returned, step_fn)
            self._outputs = outputs
            self._track_global_step(step_fn)
            trace.memory(state)

            results: dict[int, SessionRunValues] = {}
            if requests or self._fetcher.pending is not None:
                started = time.perf_counter()
                results = self._fetcher.answers(requests, outputs, state)
                trace.add("session", "fetch", started, names=len(requests))
            for call in self._after_run:
                asked = trace.requested_by.get(call.plugin_index)
                got = results.get(call.plugin_index)
                values = SessionRunValues(
                    got.results if got is not None else None,
                    asked,
                    trace if asked is not None else None,
                )
                started = time.perf_counter()
                try:
                    done = call.call(context, values)
                    if done is not None and (call.is_async or inspect.isawaitable(done)):
                        await done
                except StopIteration as exc:
                    raise _end_of_input(f"hook 'after_run' of {call.info.describe()}") from exc
                except Exception as exc:
                    annotate(exc, call, state.global_step)
                    raise
                trace.add(
                    call.info.name, "after_run", started, fetched=call.plugin_index in results
                )
            if self._deferred:
                started = time.perf_counter()
                await self._run_deferred()
                trace.add("session", "call_after_hooks", started)
            local = context._stop_requested or (
                self._coord._stopped and not self._recovery_pending()
            )
            if (
                self._agree_to_stop_now(local, context.stop_requested_by)
                and self._fetcher.pending is not None
            ):
                await self._deliver_late(context)
            return outputs
        finally:
            if self._deferred:  # left by a failed step: never run them later
                self._deferred.clear()
            self._trace = None
            trace.close()

    @property
    def current_trace(self) -> StepTrace | None:
        """The trace of the step being run, when a hook asked for one (else ``None``).

        Plugins add their own spans to it (a background write, a wait) with
        :meth:`StepTrace.add`; ``ProfilerHook`` writes it out.
        """
        return self._trace

    async def _deliver_late(self, context: SessionRunContext) -> None:
        """Deliver the values hooks asked for with ``lag=1`` at the last step, now.

        When the loop stops (or the session ends), no next step will carry them:
        each such hook's ``after_run`` is called once more, with those values.
        """
        busy, self._busy = self._busy, True
        try:
            results = self._fetcher.flush()
            for call in self._step_calls[1]:  # skipped ones too: they asked for the values
                values = results.get(call.plugin_index)
                if values is not None:
                    await invoke(call, (context, values), self._state.global_step)
            if self._deferred:
                await self._run_deferred()
        finally:
            self._deferred.clear()
            self._busy = busy

    def _track_global_step(self, step_fn: Callable[..., Any]) -> None:
        """Check the global step a step left, and count steps that did not move it."""
        state = self._state
        if type(state.global_step) is not int:
            state.global_step = check_global_step(state.global_step, step_fn)
        if state.global_step == self._last_global_step:
            self._note_stalled_step(step_fn)
        else:
            self._last_global_step = state.global_step
            self._stalled_steps = 0

    def _note_stalled_step(self, step_fn: Callable[..., Any]) -> None:
        """Count a step that left the global step where it was; warn once at a threshold.

        A loop whose stop depends on the global step (``StopAtStepHook``) would
        otherwise run forever without a word. TF1's ``StepCounterHook`` warns too.
        The trap is a step function that never advances the global step, so the
        warning holds only while the step is still where the session was created:
        once a step of this session has moved it, steps that leave it alone are
        evaluation steps (a validation or test pass in the managed session) and
        are not warned about.
        """
        self._stalled_steps += 1
        if (
            self._stalled_steps == STALLED_STEPS_WARNING
            and self._warn_stalled_global_step
            and self._last_global_step == self._start_step
        ):
            log.warning(
                "The global step has not been increased: it is still %d after %d steps of "
                "step function %s. Increase it in the step (state.global_step += 1), or an "
                "optimizer's minimize/apply_gradients with global_step=True does it; hooks "
                "that stop at a step (StopAtStepHook) never stop otherwise.",
                self._last_global_step,
                STALLED_STEPS_WARNING,
                _name_of(step_fn),
            )

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

    @staticmethod
    def _merge_feeds(
        feeds: dict[str, Any] | None,
        new: Mapping[str, Any],
        kwargs: Mapping[str, Any],
        call: HookCall,
    ) -> dict[str, Any]:
        feeds = {} if feeds is None else feeds
        for key, value in new.items():
            if key in kwargs:
                raise RuntimeError(
                    f"Same feed key {key!r} is given by the caller and by {call.info.describe()}"
                )
            if key in feeds:
                raise RuntimeError(
                    f"Same feed key {key!r} is given by two hooks; the second is "
                    f"{call.info.describe()}"
                )
            feeds[key] = value
        return feeds

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
        try:
            inspect.signature(method).bind(*range(arguments))
        except (TypeError, ValueError):
            raise PluginError(
                f"delegate_step_hooks: {_name_of(hook)}.{call.hook} of plugin {plugin!r} must "
                f"take the {call.hook} arguments in order "
                f"({'run_context' if arguments == 1 else 'run_context, run_values'})",
                plugin=plugin,
                hook=call.hook,
            ) from None
        kept.append(call.delegated(method))
    return tuple(kept)


def _shape_of(entry: object) -> str:
    """A short description of a malformed saved entry (never its whole content)."""
    if isinstance(entry, Mapping):
        fields = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(entry.items())[:5])
        return f"a mapping {{{fields}}}"
    return f"a {type(entry).__name__}"


@final
class SingularMonitoredSession(MonitoredSession):
    """A ``MonitoredSession`` that does not recover: ``AbortedError`` propagates.

    TF1's ``SingularMonitoredSession``; :meth:`raw_session` runs steps without hooks.
    """

    _recoverable = False

    def raw_session(self) -> RawSession | None:
        """The session without hooks; ``None`` once the session is closed (as TF1)."""
        return RawSession(self) if self._open else None


@final
class RawSession:
    """Runs step functions on the state without calling any hook."""

    __slots__ = ("_session",)

    def __init__(self, session: MonitoredSession) -> None:
        self._session = session

    @property
    def state(self) -> TrainState:
        return self._session.state

    async def run(self, step_fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``step_fn(state, *args, **kwargs)``, awaited if async; no hooks are called."""
        if not callable(step_fn):
            _refuse_fetches("RawSession", step_fn)
        if not self._session._open:
            raise RuntimeError(
                f"RawSession.run({_name_of(step_fn)}): the session is closed; a raw "
                "session runs steps only while its MonitoredSession is open"
            )
        result = step_fn(self._session.state, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result


class _StopRequested(Exception):
    """Raised by ``StepContext.request_stop`` to leave the step function at once."""


@final
class StepContext:
    """What ``run_step_fn`` passes to its step function."""

    __slots__ = ("_session",)

    def __init__(self, session: MonitoredSession) -> None:
        self._session = session

    @property
    def session(self) -> RawSession:
        """The session without hooks: ``await step_context.session.run(fn, ...)``."""
        return RawSession(self._session)

    @property
    def state(self) -> TrainState:
        return self._session.state

    async def run_with_hooks(
        self, step_fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Mapping[str, Any]:
        """Run one step with every hook, like ``MonitoredSession.run``."""
        session = self._session
        if session._busy or not session._open:
            session._check_can_run()
        outputs: Mapping[str, Any] = await session._run_hooked(step_fn, args, kwargs)
        return outputs

    def request_stop(self) -> None:
        """End the loop after this step; leaves the step function at once."""
        raise _StopRequested("step_fn has requested the iterations to stop.")


#: Step functions whose signature ``run_step_fn`` has checked (no check per step).
_CHECKED_STEP_FNS: weakref.WeakKeyDictionary[Any, None] = weakref.WeakKeyDictionary()

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _check_step_fn(step_fn: Callable[..., Any]) -> None:
    """Refuse, up front, a ``run_step_fn`` function that cannot take one ``step_context``."""
    key = getattr(step_fn, "__func__", step_fn)
    try:
        if key in _CHECKED_STEP_FNS:
            return
    except TypeError:  # not weak-referenceable: checked every time
        key = None
    try:
        signature = inspect.signature(step_fn)
    except (TypeError, ValueError):  # a builtin or C callable: let the call tell
        return
    params = list(signature.parameters.values())
    required = [
        p
        for p in params
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    takes_one = any(p.kind in _POSITIONAL or p.kind is p.VAR_POSITIONAL for p in params)
    if len(required) > 1 or not takes_one or any(p.kind is p.KEYWORD_ONLY for p in required):
        raise ValueError(
            "`step_fn` may either have one `step_context` argument, or `self` and "
            f"`step_context` arguments if it's an instance method; {_name_of(step_fn)}"
            f"{signature} does not fit run_step_fn"
        )
    if key is not None:
        _CHECKED_STEP_FNS[key] = None


def _outputs_of(returned: Any, step_fn: Callable[..., Any]) -> Mapping[str, Any]:
    """A step function's outputs: its mapping, ``{}`` for ``None``, else a ``TypeError``."""
    if returned is None:
        return {}
    if isinstance(returned, Mapping):
        return returned
    raise TypeError(
        f"step function {_name_of(step_fn)} returned {type(returned).__name__}; it "
        "must return a mapping of output names to arrays, or None"
    )


def _refuse_fetches(where: str, fetches: object) -> NoReturn:
    """Refuse TF1's ``session.run(fetches)``: ``run`` takes a step function.

    TF1 read values with ``session.run(m.lr)``; here a name given to ``run`` would
    fail inside the step as ``'str' object is not callable``. Say what reads a
    value instead.
    """
    if isinstance(fetches, str):
        names: list[object] = [fetches]
    elif isinstance(fetches, Mapping):
        names = list(fetches.values())
    elif isinstance(fetches, list | tuple):
        names = list(fetches)
    else:
        names = []
    if names and all(isinstance(name, str) for name in names):
        raise TypeError(
            f"{where}.run({fetches!r}): run takes a step function, not values to read "
            "(TF1's session.run(fetches)); read a state entry or an output of the last "
            f"step with session.fetch({fetches!r}), or ask for it in a hook's before_run "
            f"with SessionRunArgs({fetches!r})"
        ) from None
    raise TypeError(
        f"{where}.run: got {type(fetches).__name__}, not a step function; pass "
        "step_fn(state, ...) and its arguments: await session.run(step_fn, ...)"
    ) from None


def _end_of_input(who: str) -> OutOfRangeError:
    """``StopIteration`` cannot cross a coroutine (PEP 479): it becomes this."""
    return OutOfRangeError(f"{who} raised StopIteration: the input is exhausted")


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


def _name_of(obj: object) -> str:
    if inspect.ismodule(obj) or inspect.isroutine(obj) or inspect.isclass(obj):
        return str(obj.__name__)
    return public_class(obj).__name__


def _state_version(plugin: object) -> int:
    version = getattr(plugin, "plugin_state_version", 1)
    return version if isinstance(version, int) else 1
