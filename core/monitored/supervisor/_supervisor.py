"""``Supervisor``: TF1's ``tf.train.Supervisor`` on a :class:`~monitored.MonitoredSession`.

The Supervisor is a thin shell, as TF1's was around a Coordinator, a Saver and a
SessionManager: ``managed_session()`` enters one ``MonitoredSession`` over the
state and starts the standard services; there is no second step loop.

- **Checkpoints** (``logdir``, every ``save_model_secs``): the checkpoint plugin's
  ``CheckpointSaverHook``, which restores the newest checkpoint of ``logdir`` when
  the session starts (recovery after a crash) and saves at the first step
  boundary after each interval, off the step loop, plus once at a normal end.
  Saving between steps rather than from a timer thread is deliberate: a
  checkpoint then always holds a state as one step left it.
- **Summaries** (every ``save_summaries_secs``): the summaries plugin's
  ``SummarySaverHook`` writes what the step records with
  ``monitored_summaries.scalar(...)`` etc. (TF1's merged summary op), a task
  calls the user's summary function (``summary_op``) and a task writes
  ``global_step/sec``. ``summary_computed`` appends to the same event file.
- **Queue runners** of the ``queue_runners`` collection are started with the
  session.

Services that need a plugin package: see :class:`Supervisor`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, NoReturn, final

import anyio
import anyio.to_thread

from .._core._capabilities import Provider, find_provider, provider
from .._core._config import TrainingConfig
from .._core._coordinator import Coordinator, ExcInfo, LooperThread
from .._core._errors import UnsupportedArgumentError
from .._core._printable import printable
from .._core._scaffold import Scaffold, SessionManager
from .._core._session import MonitoredSession
from .._core._state import TrainState
from .._core._tf1_arguments import refuse_tf1_arguments
from .._core._training_session import USE_DEFAULT
from ..data import QueueRunner
from ..data import start_queue_runners as _start_collection
from ._services import check_summaries, count_steps, run_summary_function, summary_records

__all__ = ["ManagedSession", "Supervisor"]

log = logging.getLogger("monitored")

StateFn = Callable[[TrainState], Any]


@final
class ManagedSession:
    """What :meth:`Supervisor.managed_session` returns: an ``async with`` block only.

    TF1 code writes ``with sv.managed_session() as sess``; here the session is
    async, and the plain ``with`` says so instead of failing inside contextlib.
    """

    __slots__ = ("_manager",)

    def __init__(self, manager: contextlib.AbstractAsyncContextManager[MonitoredSession]) -> None:
        self._manager = manager

    async def __aenter__(self) -> MonitoredSession:
        return await self._manager.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        return await self._manager.__aexit__(exc_type, exc, traceback)

    def __enter__(self) -> NoReturn:
        raise TypeError(
            "Supervisor.managed_session() is an async context manager: write "
            "`async with sv.managed_session() as sess:` inside an `async def main()`, run "
            "with anyio.run(main) (in Jupyter: `await main()` in a cell), and "
            "`await sess.run(step_fn, ...)`"
        )

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        return None


@final
class Supervisor:
    """TF1's ``Supervisor``: a managed session with checkpoint and summary services.

    Use it as TF1's, with ``async``::

        sv = Supervisor(state, logdir="runs/a", init_fn=init)
        async with sv.managed_session() as sess:
            while not sv.should_stop():
                await sess.run(train_step, batch)

    TF1's arguments take functions of the :class:`~monitored.TrainState` where
    TF1 took graph ops (each may be ``async``); ``None`` switches one off and the
    default (``USE_DEFAULT``) is TF1's default behaviour:

    Args:
        state: the arrays, global step and RNG to train.
        is_chief: the chief restores or initializes the state and runs the
            services; other processes wait until the state is ready. An
            installed cluster plugin (``monitored-mpi`` under ``mpiexec``) may
            decide otherwise when the session is entered: then its answer counts
            (:attr:`is_chief`), and a process it makes a worker neither saves
            checkpoints nor writes summaries.
        init_op: ``fn(state)`` run when no checkpoint is restored, before
            ``init_fn`` (default: nothing; the state's arrays are initialized when
            you build it).
        init_fn: ``fn(state)`` run after ``init_op`` only when no checkpoint of
            ``logdir`` is restored: the place to load a pre-trained model
            (:func:`monitored.train.warm_start`). TF1 called it with the session.
        local_init_op: ``fn(state)`` run each time the session is created, on every
            process, once ``ready_for_local_init_op`` allows it.
        ready_op: ``fn(state)`` returning ``None`` when the state is ready, else a
            message saying what is missing. Default: the state counts as ready
            once initialized or restored.
        ready_for_local_init_op: the same check, made before ``local_init_op``.
        logdir: where checkpoints and event files go; ``None`` (or ``""``, as in
            TF1) switches off the checkpoint and summary services (and recovery).
        summary_op: a summary function ``fn(state) -> {tag: number or array}``,
            called every ``save_summaries_secs`` (in a task, between steps); its
            values are written at the global step it saw. ``None`` switches the
            summary service off (write your own with :meth:`summary_computed`:
            TF1's "larger model" scenario). The default writes what the step
            records with ``monitored_summaries.scalar(...)`` and friends.
        saver: a ``monitored_checkpoint.Saver`` (default: ``Saver()``, five
            checkpoints kept); ``None`` switches off checkpoints and recovery.
        global_step: the global step is ``state.global_step``; ``None`` switches
            off the ``global_step/sec`` service.
        save_summaries_secs: how often the summary and step-counter services run
            (120 s); ``0`` switches both off.
        save_model_secs: how often a checkpoint is saved (600 s); ``0`` saves none
            while training but still restores from ``logdir`` (as TF1).
        recovery_wait_secs: how often a waiting worker (or
            ``wait_for_checkpoint``) looks again.
        stop_grace_secs: how long closing waits for threads (queue runners,
            :meth:`loop` threads) once a stop is requested.
        checkpoint_basename: checkpoints are ``<logdir>/<basename>-<step>``.
        session_manager: a :class:`~monitored.SessionManager` to use instead of one
            made from the ``*_op``/``init_fn`` arguments (give one or the other).
        summary_writer: a ``monitored_summaries.FileWriter`` to write to (default:
            the shared writer of ``logdir``); ``None`` switches summaries off.
        hooks: more hooks for the session, called before the services' hooks.
        disable_plugins: as for :class:`~monitored.MonitoredSession`.
        plugin_options: as for :class:`~monitored.MonitoredSession`.
        max_recoveries: as for :class:`~monitored.MonitoredSession`.

    **Plugins.** Checkpoints need ``monitored-checkpoint`` and summaries
    ``monitored-summaries``. A ``logdir`` asks for checkpoints (and recovery):
    without the plugin that is a :class:`~monitored.MissingPluginError` naming the
    package (pass ``saver=None`` to run without checkpoints). Summaries left at
    their defaults are silently off without their plugin (logged at debug
    level); asked for explicitly (``save_summaries_secs``, a ``summary_op``
    function, a ``summary_writer``, :attr:`summary_writer` or
    :meth:`summary_computed`) they are a ``MissingPluginError`` too.

    TF1's ``graph=``, ``init_feed_dict=`` and ``local_init_run_options=`` have no
    meaning here and are refused with what to do instead
    (:class:`~monitored.UnsupportedArgumentError`), as is an op where a function
    is expected.
    """

    #: TF1's ``Supervisor.USE_DEFAULT``: leave an argument at its default behaviour.
    USE_DEFAULT: Final[Any] = USE_DEFAULT

    def __init__(
        self,
        state: TrainState | None = None,
        *,
        graph: None = None,
        ready_op: StateFn | None = USE_DEFAULT,
        is_chief: bool = True,
        init_op: StateFn | None = USE_DEFAULT,
        init_feed_dict: None = None,
        local_init_op: StateFn | None = USE_DEFAULT,
        logdir: str | os.PathLike[str] | None = None,
        summary_op: StateFn | None = USE_DEFAULT,
        saver: Any = USE_DEFAULT,
        global_step: None = USE_DEFAULT,
        save_summaries_secs: float = USE_DEFAULT,
        save_model_secs: float = 600,
        recovery_wait_secs: float = 30,
        stop_grace_secs: float = 120,
        checkpoint_basename: str = "model.ckpt",
        session_manager: SessionManager | None = None,
        summary_writer: Any = USE_DEFAULT,
        init_fn: StateFn | None = None,
        local_init_run_options: None = None,
        ready_for_local_init_op: StateFn | None = USE_DEFAULT,
        hooks: Iterable[object] | None = None,
        disable_plugins: Iterable[str] = (),
        plugin_options: Mapping[str, Mapping[str, Any]] | None = None,
        max_recoveries: int | None = None,
    ) -> None:
        _refuse(
            graph=(
                graph,
                "there is no graph: drop graph=; the model is the TrainState "
                "(Supervisor(state, ...))",
            ),
            init_feed_dict=(
                init_feed_dict,
                "there are no feeds: drop init_feed_dict= and set the values in init_fn(state)",
            ),
            local_init_run_options=(
                local_init_run_options,
                "there are no run options: drop local_init_run_options=",
            ),
        )
        if global_step is not USE_DEFAULT and global_step is not None:
            raise UnsupportedArgumentError(
                "Supervisor(global_step=...): the global step is state.global_step, which the "
                "step function increments; drop global_step= (None switches off the "
                "global_step/sec service)"
            )
        if state is not None and not isinstance(state, TrainState):
            raise TypeError(
                f"Supervisor: state must be a monitored.TrainState, got {type(state).__name__}"
            )
        functions = {
            "init_op": _state_function("init_op", init_op),
            "init_fn": _state_function("init_fn", init_fn),
            "ready_op": _state_function("ready_op", ready_op),
            "local_init_op": _state_function("local_init_op", local_init_op),
            "ready_for_local_init_op": _state_function(
                "ready_for_local_init_op", ready_for_local_init_op
            ),
        }
        summary_fn = _state_function("summary_op", summary_op)
        for name, value in {
            "save_summaries_secs": save_summaries_secs,
            "save_model_secs": save_model_secs,
            "recovery_wait_secs": recovery_wait_secs,
            "stop_grace_secs": stop_grace_secs,
        }.items():
            if value is not USE_DEFAULT:
                _check_secs(name, value)
        if session_manager is not None:
            given = [name for name, fn in functions.items() if fn is not None]
            if given:
                raise ValueError(
                    f"Supervisor: give either session_manager or {', '.join(given)}; the "
                    "session manager's Scaffold holds those functions"
                )
            if not isinstance(session_manager, SessionManager):
                raise TypeError(
                    "Supervisor: session_manager must be a monitored.SessionManager, got "
                    f"{type(session_manager).__name__}"
                )
        if not checkpoint_basename or "/" in checkpoint_basename:
            raise ValueError(
                f"Supervisor: checkpoint_basename must be a plain file name, got "
                f"{checkpoint_basename!r}"
            )

        self._state = state if state is not None else TrainState()
        self._is_chief = is_chief
        # TF1: an empty logdir is none (no checkpoints, no summaries unless a writer is given).
        self._logdir = os.fspath(logdir) if logdir is not None and os.fspath(logdir) else None
        self._checkpoint_basename = checkpoint_basename
        self._save_model_secs = save_model_secs
        explicit_summaries = save_summaries_secs is not USE_DEFAULT
        self._save_summaries_secs: float = (
            120 if save_summaries_secs is USE_DEFAULT else save_summaries_secs
        )
        self._recovery_wait_secs = recovery_wait_secs
        self._stop_grace_secs = stop_grace_secs
        self._hooks = list(hooks or ())
        self._disable_plugins = tuple(disable_plugins)
        self._plugin_options = plugin_options
        self._max_recoveries = max_recoveries
        self._count_steps = global_step is not None
        self._summary_fn = summary_fn
        self._summaries_on = summary_op is not None
        self._session_manager = session_manager or SessionManager(
            Scaffold(
                init_fn=_init_function(functions["init_op"], functions["init_fn"]),
                ready_fn=functions["ready_op"],
                local_init_fn=functions["local_init_op"],
                ready_for_local_init_fn=functions["ready_for_local_init_op"],
            ),
            recovery_wait_secs,
        )
        self._coord = Coordinator()
        #: The managed session, once entered (never one whose entry failed).
        self._session: MonitoredSession | None = None
        #: Whether the Supervisor closed it (``stop``, the end of ``managed_session``):
        #: the next ``prepare_or_wait_for_session`` then makes a fresh one, as TF1's.
        self._session_closed = False
        #: Why creating the managed session failed, if it did: the coordinator is
        #: then stopped and closed, so this Supervisor cannot make another.
        self._failed: BaseException | None = None
        self._summary_hook: object | None = None
        #: The installed provider of "checkpoint", when the checkpoint service is on.
        self._checkpoints: Provider | None = None
        self._saver = self._checkpoint_saver(saver)
        #: Whether this process has an event file (TF1: the chief, with a logdir).
        self._writer_wanted = self._logdir is not None and is_chief and summary_writer is not None
        self._writer: Any = None
        self._summaries = self._summary_plugin(
            explicit=explicit_summaries
            or summary_fn is not None
            or summary_writer not in (USE_DEFAULT, None),
            summary_writer=summary_writer,
        )
        #: The writer given as ``summary_writer=`` (reused after a close, as TF1's).
        self._given_writer: Any = None
        if summary_writer is not USE_DEFAULT and summary_writer is not None:
            self._writer = self._given_writer = summary_writer

    # -- plugins ------------------------------------------------------------------------------
    def _checkpoint_saver(self, saver: Any) -> Any:
        """The ``Saver`` of the checkpoint service, or ``None`` when it is off."""
        if saver is None or self._logdir is None or not self._is_chief:
            return None
        self._checkpoints = provider(
            "checkpoint",
            f"Supervisor(logdir={self._logdir!r}) saves and restores checkpoints there",
            "; pass saver=None to run without checkpoints",
        )
        try:
            return self._checkpoints.call(
                "checkpoint_saver", saver=None if saver is USE_DEFAULT else saver
            )
        except TypeError as exc:
            raise UnsupportedArgumentError(
                f"Supervisor(saver=...): {exc}, or None to run without checkpoints"
            ) from None

    def _summary_plugin(self, *, explicit: bool, summary_writer: Any) -> Provider | None:
        """The provider of "summaries" when the summary services are on, else ``None``."""
        if not self._writer_wanted or not self._save_summaries_secs:
            return None
        if not explicit:
            found = find_provider("summaries")
            if found is None:
                log.debug("Supervisor: summaries are off, no installed plugin provides them")
            return found
        summaries = provider("summaries", "the Supervisor was asked for summaries")
        if summary_writer is not USE_DEFAULT:
            try:
                summaries.call("summary_writer", logdir=None, writer=summary_writer)
            except TypeError as exc:
                raise UnsupportedArgumentError(
                    f"Supervisor(summary_writer=...): {exc}, or None to switch summaries off"
                ) from None
        return summaries

    # -- properties ---------------------------------------------------------------------------
    @property
    def state(self) -> TrainState:
        """The :class:`~monitored.TrainState` being trained."""
        return self._state

    @property
    def is_chief(self) -> bool:
        """Whether this process restores, initializes and runs the services.

        Once the managed session is entered, the session's role: an installed
        cluster plugin (the ``cluster`` hookspec; MPI makes every rank but 0 a
        worker) decides it then. Before, the ``is_chief`` given to the constructor.
        """
        if self._session is not None:
            return self._session.is_chief
        return self._is_chief

    @property
    def coord(self) -> Coordinator:
        """The :class:`~monitored.Coordinator` of the managed session (exists from the start)."""
        return self._coord

    @property
    def session(self) -> MonitoredSession | None:
        """The managed :class:`~monitored.MonitoredSession`, once created."""
        return self._session

    @property
    def session_manager(self) -> SessionManager:
        """The :class:`~monitored.SessionManager` that restores or initializes the state."""
        return self._session_manager

    @property
    def logdir(self) -> str | None:
        """Where checkpoints and event files go (``None``: no checkpoints, no summaries)."""
        return self._logdir

    @property
    def save_path(self) -> str | None:
        """``<logdir>/<checkpoint_basename>``: checkpoints are ``<save_path>-<step>``."""
        if self._logdir is None:
            return None
        return os.path.join(self._logdir, self._checkpoint_basename)

    @property
    def saver(self) -> Any:
        """The ``monitored_checkpoint.Saver`` of the checkpoint service (``None``: off).

        TF1's ``sv.saver.save(sess, path, global_step=sv.global_step)`` works as it
        is: the saver takes the session (its state) or the state.
        """
        return self._saver

    @property
    def global_step(self) -> int:
        """The global step now: ``state.global_step``.

        TF1's ``sv.global_step`` was the step tensor, read with ``sess.run``; here it
        is the number itself, read each time (``global_step=sv.global_step``).
        """
        return self._state.global_step

    @property
    def save_model_secs(self) -> float:
        return self._save_model_secs

    @property
    def save_summaries_secs(self) -> float:
        return self._save_summaries_secs

    @property
    def summary_op(self) -> StateFn | None:
        """The summary function, if one was given."""
        return self._summary_fn

    @property
    def summary_writer(self) -> Any:
        """The ``monitored_summaries.FileWriter`` of ``logdir`` (``None`` when summaries
        are off: no ``logdir``, not the chief, ``summary_writer=None``).

        Made on first use, which creates the event file: on a process that a
        cluster plugin makes a worker, ask for it only once the session is entered
        (:attr:`is_chief` knows the role then). Asking for it without the
        summaries plugin is a :class:`~monitored.MissingPluginError`.
        """
        if self._writer is None and self._writer_wanted and self.is_chief:
            summaries = self._summaries or provider(
                "summaries", "Supervisor.summary_writer writes event files"
            )
            self._writer = summaries.call("summary_writer", logdir=self._logdir, writer=None)
        return self._writer

    # -- the managed session ------------------------------------------------------------------
    def managed_session(
        self,
        master: str = "",
        config: None = None,
        start_standard_services: bool = True,
        close_summary_writer: bool = True,
    ) -> ManagedSession:
        """``async with sv.managed_session() as sess``: a ready session, closed at the end.

        The state is restored from the newest checkpoint of ``logdir`` or
        initialized (``init_op``, ``init_fn``), and the services start. As TF1's:
        an exception raised in the block is reported to the coordinator
        (:meth:`request_stop`), the services stop, and it is raised again once
        everything is closed; an end of input (``OutOfRangeError``) is a normal
        end. A normal end saves a last checkpoint. An exception of a service stops
        the loop (:meth:`should_stop` turns true) and is raised here.
        ``close_summary_writer`` closes the event file at the end.
        """
        refuse_tf1_arguments("Supervisor.managed_session", master=master or None, config=config)
        return ManagedSession(self._managed(start_standard_services, close_summary_writer))

    @contextlib.asynccontextmanager
    async def _managed(
        self, start_standard_services: bool, close_summary_writer: bool
    ) -> AsyncIterator[MonitoredSession]:
        failed = True
        try:
            session = await self.prepare_or_wait_for_session(
                start_standard_services=start_standard_services
            )
            try:
                yield session
            except BaseException as exc:
                if isinstance(exc, Exception):
                    self._coord.request_stop(exc)  # reported, as TF1's managed_session does
                try:
                    if await session.__aexit__(type(exc), exc, exc.__traceback__):
                        failed = False
                        return
                finally:
                    self._session_closed = True
                raise
            try:
                await session.__aexit__(None, None, None)
            finally:
                self._session_closed = True
            failed = False
        finally:
            if close_summary_writer:
                self._close_writer(failed)

    async def prepare_or_wait_for_session(
        self,
        master: str = "",
        config: None = None,
        wait_for_checkpoint: bool = False,
        max_wait_secs: float = 7200,
        start_standard_services: bool = True,
    ) -> MonitoredSession:
        """Create the session, make the state ready and start the services; return it.

        The chief restores the newest checkpoint of ``logdir`` (with
        ``wait_for_checkpoint``, it first waits up to ``max_wait_secs`` for one to
        appear) or initializes the state; a worker waits for the chief, up to
        ``max_wait_secs``. With ``start_standard_services`` the chief saves
        checkpoints and runs the summary services, and every process starts the
        queue runners. Close it with :meth:`stop` (``managed_session`` does all this).
        """
        refuse_tf1_arguments(
            "Supervisor.prepare_or_wait_for_session", master=master or None, config=config
        )
        if self._failed is not None:
            raise RuntimeError(
                "this Supervisor's session failed to start "
                f"({type(self._failed).__name__}: {self._failed}) and its coordinator is "
                "closed: make a new Supervisor to try again"
            ) from self._failed
        if self._session is not None:
            if not self._session_closed:
                raise RuntimeError(
                    "this Supervisor already manages an open session; stop it (sv.stop(), or "
                    "the end of `async with sv.managed_session()`) before preparing another"
                )
            # TF1 makes a fresh session on each call, with the stop request cleared.
            self._session = None
            self._coord.clear_stop()
            self._coord._closing = False
            writer = self._writer
            if writer is not None and writer.closed and writer is not self._given_writer:
                self._writer = None  # logdir's: a new event file on first use
        if wait_for_checkpoint and self._saver is not None:
            await self._wait_for_checkpoint(max_wait_secs)
        services = self._service_hooks(start_standard_services)
        # The services are the chief's: the session leaves them out where it is not
        # the chief, which an installed cluster plugin may decide only once it is
        # entered (as MonitoredTrainingSession's chief_only_hooks). The rest of the
        # config asks the plugins for no hooks of their own.
        training_config = TrainingConfig(
            is_chief=self._is_chief,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
            max_wait_secs=max_wait_secs,
            stop_grace_period_secs=self._stop_grace_secs,
            chief_only_hooks=tuple(services),
        )
        session = MonitoredSession(
            self._state,
            hooks=[*self._hooks, *services],
            is_chief=self._is_chief,
            stop_grace_period_secs=self._stop_grace_secs,
            max_wait_secs=max_wait_secs,
            disable_plugins=self._disable_plugins,
            max_recoveries=self._max_recoveries,
            session_manager=self._session_manager,
            plugin_options=self._plugin_options,
            recovery_wait_secs=self._recovery_wait_secs,
            coord=self._coord,
            training_config=training_config,
        )
        try:
            await session.__aenter__()
        except BaseException as exc:
            self._failed = exc
            raise
        self._session, self._session_closed = session, False
        try:
            if session.is_chief and self._writer is None and self._summary_hook is not None:
                # The hook opened the directory's shared writer when the session began;
                # the Supervisor holds it too (the session's end only releases it), so
                # close_summary_writer=False keeps it open, as TF1's did.
                self._writer = self.summary_writer
            if start_standard_services:
                if session.is_chief:
                    self.start_standard_services(session)
                self.start_queue_runners(session)
        except BaseException as exc:
            self._session, self._failed = None, exc
            await session.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return session

    def _service_hooks(self, start_standard_services: bool) -> list[object]:
        """The checkpoint and summary hooks of the plugins, for the session to be made.

        Only the chief runs them. Nothing is written here: the summary hook opens the
        event file when the session begins, on the chief only.
        """
        hooks: list[object] = []
        if self._saver is not None:
            assert self._logdir is not None
            assert self._checkpoints is not None
            made = self._checkpoints.call(
                "checkpoint_hooks",
                checkpoint_dir=self._logdir,
                save_secs=self._save_model_secs if start_standard_services else None,
                saver=self._saver,
                checkpoint_basename=self._checkpoint_basename,
            )
            hooks.extend(made or ())
        self._summary_hook = None
        if start_standard_services and self._summaries is not None and self._summaries_on:
            # A writer you gave is used as it is; else the hook takes logdir's shared
            # writer (the provider's, as summary_writer does) when it begins.
            made = list(
                self._summaries.call(
                    "summary_hooks",
                    save_secs=self._save_summaries_secs,
                    summary_writer=self._writer,
                    output_dir=None if self._writer is not None else self._logdir,
                )
                or ()
            )
            self._summary_hook = made[0] if made else None
            hooks.extend(made)
        return hooks

    def start_standard_services(self, sess: MonitoredSession) -> None:
        """Start the summary function and ``global_step/sec`` services on ``sess`` (chief only).

        ``prepare_or_wait_for_session`` calls it. The checkpoint service is a hook
        of the session, chosen when the session is created.
        """
        if not sess.is_chief:
            raise RuntimeError(
                "Only chief supervisor can start standard services, because only chief "
                "supervisors can write events"
            )
        if self._logdir is None or self._summaries is None or self.summary_writer is None:
            return
        interval = self._save_summaries_secs
        if self._summary_fn is not None:
            sess.coord.start_soon(
                run_summary_function,
                sess,
                self._summary_fn,
                interval,
                self._emit,
                name="Supervisor summary service",
            )
        if self._count_steps:
            sess.coord.start_soon(
                count_steps, sess, interval, self._emit, name="Supervisor step counter"
            )

    async def _emit(self, step: int, values: Mapping[str, Any]) -> None:
        """Hand a service's values to every summary sink; to the event file when none of
        the summaries plugin is in the session."""
        session = self._session
        assert session is not None
        await session.write_summaries(step, values)
        if self._summary_hook is None:
            self.summary_computed(session, values, step)

    async def _wait_for_checkpoint(self, max_wait_secs: float) -> None:
        checkpoints = self._checkpoints
        assert checkpoints is not None  # there is a saver
        with anyio.move_on_after(max_wait_secs):
            while (
                await anyio.to_thread.run_sync(
                    functools.partial(
                        checkpoints.call, "latest_checkpoint", checkpoint_dir=self._logdir
                    )
                )
                is None
            ):
                log.info("Waiting for a checkpoint in %s", printable(self._logdir))
                await anyio.sleep(self._recovery_wait_secs)

    def start_queue_runners(
        self, sess: MonitoredSession, queue_runners: Iterable[QueueRunner] | None = None
    ) -> list[threading.Thread]:
        """Start the threads of ``queue_runners`` (default: the ``queue_runners``
        collection, :func:`monitored.data.add_queue_runner`) under the Supervisor's
        coordinator; return them. They are joined when the session closes."""
        if queue_runners is None:
            return _start_collection(sess, coord=self._coord)
        threads: list[threading.Thread] = []
        for runner in queue_runners:
            threads += runner.create_threads(sess, coord=self._coord, daemon=True, start=True)
        return threads

    # -- stopping -----------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """Whether the loop should end: a hook, a service, the coordinator or :meth:`stop`."""
        if self._session is not None:
            return self._session.should_stop()
        return self._coord.should_stop()

    def request_stop(self, ex: BaseException | ExcInfo | None = None) -> None:
        """Ask the loop to stop; ``ex`` is raised from the session (as ``Coordinator``'s)."""
        self._coord.request_stop(ex)

    @contextlib.contextmanager
    def stop_on_exception(self) -> Generator[None, None, None]:
        """Turn an exception raised in the block into a stop request carrying it."""
        with self._coord.stop_on_exception():
            yield

    async def stop(
        self,
        threads: Iterable[threading.Thread] | None = None,
        close_summary_writer: bool = True,
        ignore_live_threads: bool = False,
    ) -> None:
        """Stop the services and close the session (after :meth:`prepare_or_wait_for_session`).

        Requests a stop, closes the session (a normal end: ``end`` hooks run and a
        last checkpoint is saved, unless a stop carried an exception, which is
        then raised), joins ``threads`` with the grace period and closes the event
        file. ``managed_session`` calls it for you.
        """
        self._coord.request_stop()
        failed = True
        try:
            if self._session is not None:
                try:
                    await self._session.close()
                finally:
                    self._session_closed = True
            if threads is not None:
                await self._coord.join(
                    threads,
                    stop_grace_period_secs=self._stop_grace_secs,
                    ignore_live_threads=ignore_live_threads,
                )
            failed = False
        finally:
            if close_summary_writer:
                self._close_writer(failed)

    def _close_writer(self, failed: bool) -> None:
        """Close the event file; while another error propagates, its own failure is logged.

        Writes TF1's ``SessionLog.STOP`` first, unless the summary service's hook
        wrote it at the session's end. The next session of this Supervisor then
        opens a new event file of ``logdir`` (TF1's ``close_summary_writer=True``).
        """
        writer = self._writer
        if writer is None or writer.closed:
            return
        try:
            if self._summary_hook is None:
                summaries = self._summaries or find_provider("summaries")
                if summaries is not None and summaries.implements("summary_session_log"):
                    summaries.call(
                        "summary_session_log", writer=writer, status="stop", global_step=None
                    )
            writer.close()
        except Exception as exc:
            if not failed:
                raise
            log.warning("While closing after an error, the summary writer failed too: %r", exc)

    # -- your own services and summaries ---------------------------------------------------
    def loop(
        self,
        timer_interval_secs: float | None,
        target: Callable[..., Any],
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> LooperThread | None:
        """Call ``target(*args, **kwargs)`` every ``timer_interval_secs`` until a stop.

        TF1's ``Supervisor.loop``. A plain function runs in a
        :class:`~monitored.LooperThread` (returned); an ``async`` function runs as
        a task of the session (``None`` is returned; the session must be open).
        Either way an exception it raises stops the loop and is raised from the
        session, and the session's close waits for it.
        """
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        if inspect.iscoroutinefunction(target):
            if self._session is None:
                raise RuntimeError(
                    f"Supervisor.loop({_name_of(target)}): an async target runs as a task of "
                    "the session; call loop inside `async with sv.managed_session()`"
                )

            async def call() -> None:
                await target(*args, **kwargs)

            self._coord.start_looper(timer_interval_secs, call, name=f"loop:{_name_of(target)}")
            return None
        return LooperThread.loop(self._coord, timer_interval_secs, target, args, kwargs)

    def summary_computed(
        self, sess: MonitoredSession | None, summary: Any, global_step: int | None = None
    ) -> None:
        """Append ``summary`` to the event file of ``logdir`` at ``global_step``.

        ``summary`` is ``{tag: number or array}`` (a single value is a scalar,
        more a histogram; CuPy arrays are copied to the host), or a TensorBoard
        ``Summary`` proto or its bytes. ``global_step`` defaults to the state's.
        ``sess`` is accepted for TF1's signature.
        """
        writer = self.summary_writer
        if writer is None:
            raise RuntimeError(
                "Supervisor.summary_computed requires a summary writer: give the Supervisor "
                "a logdir (on the chief) and leave summary_writer at its default, or give it "
                "a summary_writer"
            )
        step = self._state.global_step if global_step is None else int(global_step)
        if isinstance(summary, bytes) or hasattr(summary, "SerializeToString"):
            writer.add_summary(summary, step)
            return
        check_summaries(summary, "Supervisor.summary_computed")
        records, host = summary_records(summary)
        writer.add_records(step, records, host)


def _refuse(**given: tuple[Any, str]) -> None:
    for name, (value, what_to_do) in given.items():
        if value is not None:
            raise UnsupportedArgumentError(f"Supervisor({name}=...): {what_to_do}")


def _state_function(name: str, value: Any) -> StateFn | None:
    """A function of the state, or ``None`` for ``None`` and ``USE_DEFAULT``."""
    if value is USE_DEFAULT or value is None:
        return None
    if not callable(value):
        raise UnsupportedArgumentError(
            f"Supervisor({name}=...): got {type(value).__name__}, which is not a function; "
            "there are no graph ops here: pass a function of the TrainState, fn(state), or "
            "None"
        )
    return value  # type: ignore[no-any-return]


def _init_function(init_op: StateFn | None, init_fn: StateFn | None) -> StateFn | None:
    """``init_op`` then ``init_fn``, as one scaffold ``init_fn`` (TF1's order)."""
    if init_op is None or init_fn is None:
        return init_op or init_fn
    first, then = init_op, init_fn

    async def init(state: TrainState) -> None:
        for fn in (first, then):
            result = fn(state)
            if inspect.isawaitable(result):
                await result

    return init


def _check_secs(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"Supervisor({name}={value!r}): give a number of seconds >= 0")


def _name_of(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)
