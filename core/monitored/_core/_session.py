"""``MonitoredSession``: the async step loop with hooks, recovery and a clean close.

Lifecycle (TF1's, see ``docs/tf1-migration.md``): ``begin`` on every hook, the
state restored or initialized, ``after_create_session``; then for each ``run``:
``before_run``, the step, one batched fetch, ``after_run``; on a normal end
``end``. An end of input raised in the ``async with`` body is a normal end; any
other exception skips ``end`` and propagates unchanged once the session has
closed. ``AbortedError`` and ``UnavailableError`` re-create the session and retry.

``MonitoredSession`` is made of parts with one job each, one module each:

- this module: the user API, opening and closing, and the step loop (``run``,
  ``_run_hooked``: the hot path, kept in one coroutine with its state here);
- ``_session_plugins.PluginRegistration``: which hooks and plugins it calls;
- ``_session_services.PluginServices``: what it offers hooks and plugins, and which
  step hooks the loop calls (delegated, skipped);
- ``_session_stop.StopAgreement``: the processes' stop decisions;
- ``_session_recovery.Recovery``: creating the session, and re-creating it;
- ``_host.TaskHost``: its background work, in a task of its own.

The parts are mixins over the session's own attributes (each declares those it
reads), not objects it delegates to: the hot path reads them without a hop.
"""

from __future__ import annotations

import inspect
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, NoReturn, final

import anyio
import anyio.lowlevel

from ._calling import CallPlan, HookCall, annotate, invoke
from ._capabilities import StepAside
from ._cluster import Cluster, LocalCluster
from ._config import TrainingConfig
from ._coordinator import END_OF_INPUT, Coordinator
from ._errors import EventLoopEndedError, OutOfRangeError
from ._fetch import Fetcher
from ._host import TaskHost
from ._launcher import check_launch
from ._ownership import RunOwner
from ._plugins import PluginInfo
from ._profiler import StepTrace
from ._run import RunOptions, SessionRunArgs, SessionRunContext, SessionRunValues
from ._run_claim import claim_session_directories, release_all, release_all_off_loop
from ._scaffold import Scaffold, SessionManager
from ._session_plugins import PluginRegistration
from ._session_recovery import Recovery
from ._session_services import _NEVER, PluginServices, _name_of
from ._session_stop import StopAgreement
from ._state import TrainState, check_global_step
from ._tf1_arguments import refuse_tf1_arguments
from ._watchdog import (
    FROM_ENV,
    LoopWatchdog,
    blocked_loop_threshold,
    describe_culprit,
)

__all__ = ["MonitoredSession", "RawSession", "SingularMonitoredSession", "StepContext"]

log = logging.getLogger("monitored")

#: How often a step loop whose steps never wait gives the event loop a turn, so
#: background tasks run and cancel scopes around the loop take effect.
YIELD_INTERVAL_SECS: Final = 0.005

#: Steps in a row that leave the global step unchanged before the session warns
#: that the step function probably forgets ``state.global_step += 1``.
STALLED_STEPS_WARNING: Final = 10

_NO_RESULTS: Final = SessionRunValues(None)


class MonitoredSession(Recovery, StopAgreement, PluginRegistration, PluginServices):
    """Runs training steps over a :class:`~monitored.TrainState`, calling hooks.

    Use it as ``async with MonitoredSession(state, hooks=[...]) as sess:`` and call
    ``await sess.run(step_fn, *args, **kwargs)`` until ``sess.should_stop()``.
    ``await sess.open()`` and ``await sess.close()`` do the same for a session that
    outlives one block (kept open across notebook cells, or opened, run and closed
    by different tasks of the event loop, in any order with other sessions).

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
    #: Whether the chief claims the directories its hooks write (``run_directories``):
    #: an evaluation session, which writes beside a run it reads, claims none.
    _claims_run_directories = True

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
        #: Hosts the session's background work (watchdog, coordinator tasks) while open.
        self._host: TaskHost | None = None
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
        #: The run directories this chief's session owns until it closes (``_run_claim``).
        self._owners: list[RunOwner] = []

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
        return await self.open()

    async def open(self) -> MonitoredSession:
        """Open the session (what ``async with`` does on entry); returns the session.

        With :meth:`close`, for a session that outlives one block of code: opened
        in one notebook cell, run in the next ones, closed in a later one; or
        opened, run and closed by different tasks of the same event loop, in any
        order relative to other sessions. The session's background work runs in
        a task of its own (not in the task that opened it) until it closes. A
        session is opened once; ``async with`` is the form to prefer where one
        block holds the whole session, as it closes the session on every exit.
        """
        if self._entered:
            raise RuntimeError(
                f"a {type(self).__name__} can be entered only once (`async with` or open())"
            )
        self._entered = True
        self._finalizes_state = not self._state.finalized
        try:
            await self._register_plugins()
            check_launch(
                trains_alone=isinstance(self._cluster, LocalCluster),
                idle_suppliers=self._idle_suppliers,
            )
            if self.is_chief and self._claims_run_directories:
                self._owners = await claim_session_directories(self._require_plan(), self)
        except BaseException as exc:
            self._cluster.fail(exc)
            raise
        # The background work lives in a task of the session's own (see _host): the
        # session can then be closed from any task, in any order with other sessions.
        self._host = TaskHost(self._background_failed)
        task_group = await self._host.start()
        if self._blocked_loop_secs is not None:
            infos = self.plugins
            watchdog = LoopWatchdog(self._blocked_loop_secs, lambda f: describe_culprit(f, infos))
            task_group.start_soon(watchdog.run, name="monitored loop watchdog")
        self._coord._attach(task_group)
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
        background task failed, whose exception is then raised.

        A session whose event loop ended while it was open (``EventLoopEndedError``)
        is closed without its ``end`` hooks (its background work is gone), which
        releases what it holds, such as its run directories; that is said in a
        warning, not raised again, as closing it is what that error asks for.
        """
        if self._open:
            failure = self._coord.exception
            await self._close(failure=failure)
            if isinstance(failure, EventLoopEndedError):
                log.warning(
                    "Closed a session whose event loop ended while it was open: its end "
                    "hooks did not run (no final checkpoint); it released what it held"
                )
                return
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
            release_all(self._owners)
            # What escapes the close (a stop decision timing out, an ``end`` hook, a
            # background task) is this process's failure as much as one known before.
            self._cluster.fail(exc)
            raise
        await release_all_off_loop(self._owners)
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
            host, self._host = self._host, None
            try:
                if host is not None:
                    await host.stop()
            finally:
                self._coord._attach(None)
                _warn_unawaited_outputs(self._outputs)
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

    def _background_failed(self, exc: BaseException) -> None:
        """A task of the session's host raised past its guard: stop, carrying ``exc``.

        The next step boundary (``run``, ``should_stop``) raises it, and so does
        the close (see ``TaskHost.stop``).
        """
        if not self._coord.joined:
            self._coord.request_stop(exc)

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

                # A retried creation does what the failed one would have done: a
                # first creation still initializes the state (runs init_fn).

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
            how = (
                "a closed session does not open again: open a new one"
                if self._entered
                else "run inside `async with session:`, or after `await session.open()`"
            )
            raise RuntimeError(f"the session is {state}; {how}")
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
            except TypeError as exc:
                # Checked only once the call failed: nothing on the hot path.
                if not callable(step_fn):
                    _refuse_fetches(type(self).__name__, step_fn)
                _explain_feed_dict(step_fn, kwargs, exc)
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
            except TypeError as exc:
                if not callable(step_fn):
                    _refuse_fetches(type(self).__name__, step_fn)
                _explain_feed_dict(step_fn, kwargs, exc)
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


def _explain_feed_dict(step_fn: object, kwargs: Mapping[str, Any], exc: TypeError) -> None:
    """Raise a ``TypeError`` saying what replaces TF1's ``feed_dict=``, if that was the mistake."""
    if "feed_dict" in kwargs and "feed_dict" in str(exc):
        raise TypeError(
            f"sess.run({_name_of(step_fn)}, feed_dict=...): there is no graph to feed here; "
            "a step's values are its arguments: await sess.run(step, batch, lr) calls "
            "step(state, batch, lr), and an optimizer takes a fed rate as "
            "apply_gradients(..., learning_rate=lr) (docs/estimator.md#feed_dict)"
        ) from exc


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


def _warn_unawaited_outputs(outputs: Mapping[str, Any]) -> None:
    """Warn of a last step's output that is a coroutine never awaited.

    It is an ``await`` forgotten in the step (``return {"loss": compute()}`` with
    ``async def compute``). A hook fetching it says so at once (``FetchError``);
    where nothing fetches it, it is said here, at the close, which costs the steps
    nothing. The coroutine is closed, so Python adds no warning of its own.
    """
    for name, value in outputs.items():
        if inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == "CORO_CREATED":
            value.close()
            warnings.warn(
                f"the last step's output {name!r} is coroutine "
                f"{value.__qualname__}, never awaited: did you forget `await` "
                "where the step computes it?",
                RuntimeWarning,
                stacklevel=2,
            )


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
