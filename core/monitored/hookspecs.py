"""The hook contract of ``monitored``: one documented specification per event.

A hook implementation is any callable named after one of these specifications:
a method of a hook object passed in ``hooks=[...]``, or a function of a plugin
module found through the ``monitored`` entry-point group. It may be a plain
function or an ``async def``; the session awaits whatever it returns that is
awaitable. It may accept any subset of the specification's arguments, by name.
The :data:`monitored.hookimpl` marker is optional and carries ``tryfirst`` and
``trylast``.

Order of calls, for every event: implementations marked ``tryfirst``, then the
session's hooks in list order (``hooks=[...]``, then the hooks that plugins and
``MonitoredTrainingSession`` add), then installed plugins sorted by entry-point
name, then implementations marked ``trylast``.

The five events are TF1's ``SessionRunHook`` methods, with TF1's semantics; the
others are the extension points the plugin ecosystem builds on, and the
capability hooks (at the end) that the core and other plugins call on the one
plugin that provides a capability (``provides = {"checkpoint"}``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._core._markers import hookspec

if TYPE_CHECKING:
    from ._core._cluster import Cluster
    from ._core._commands import Commands
    from ._core._config import TrainingConfig
    from ._core._coordinator import Coordinator
    from ._core._options import Option
    from ._core._run import SessionRunArgs, SessionRunContext, SessionRunValues
    from ._core._session import MonitoredSession
    from ._core._state import TrainState

__all__ = [
    "after_create_session",
    "after_evaluate",
    "after_run",
    "after_save",
    "before_close",
    "before_run",
    "before_save",
    "begin",
    "checkpoint_hooks",
    "checkpoint_saver",
    "checkpoints_iterator",
    "cluster",
    "declare_options",
    "end",
    "latest_checkpoint",
    "list_checkpoints",
    "load_plugin_state",
    "plugin_state",
    "plugin_status",
    "read_checkpoint",
    "register_commands",
    "restore_checkpoint",
    "restore_state",
    "run_directories",
    "save_checkpoint",
    "summary_hooks",
    "summary_session_log",
    "summary_writer",
    "training_hooks",
    "write_summaries",
]

# --- the session's life -------------------------------------------------------------


@hookspec
def begin(session: MonitoredSession) -> None:
    """Called once, before the session is created.

    The state is not initialized or restored yet; this is the place to add entries
    to ``session.state`` (after ``after_create_session`` the set of entries is fixed,
    as TF1 finalizes its graph).
    """


@hookspec
def after_create_session(session: MonitoredSession, coord: Coordinator) -> None:
    """Called when the state is initialized or restored, before the first step.

    Called again each time the session is re-created after an
    :class:`~monitored.AbortedError` or :class:`~monitored.UnavailableError`.
    ``coord`` is the session's :class:`~monitored.Coordinator`: start background
    tasks on it, or request a stop.
    """


@hookspec
def before_run(run_context: SessionRunContext) -> SessionRunArgs | None:
    """Called before each step; may return what the hook wants of that step.

    Return :class:`~monitored.SessionRunArgs` to fetch named values (step outputs
    or state entries, in any nesting) and to add feeds (keyword arguments of the
    step function). A feed given by two hooks, or by a hook and the caller, is a
    ``RuntimeError``. ``run_context.request_stop()`` ends the loop after this step.
    """


@hookspec
def after_run(run_context: SessionRunContext, run_values: SessionRunValues) -> None:
    """Called after each step, for every hook, even after a stop was requested.

    ``run_values.results`` holds exactly this hook's own fetches as host (NumPy)
    values, fetched for all hooks in one batched transfer, or ``None`` when the
    hook asked for nothing.
    """


@hookspec
def end(session: MonitoredSession) -> None:
    """Called once when training ends normally, before the session closes.

    Normal ends are a stop request and the end of input (``OutOfRangeError``,
    ``StopIteration``, ``StopAsyncIteration`` raised in the ``async with`` body).
    Not called when any other exception ends the session.
    """


@hookspec
def before_close(session: MonitoredSession, error: BaseException | None) -> None:
    """Called once as the session closes, however it ended.

    ``error`` is ``None`` after a normal end (after ``end``), else the exception
    that ends the session: a step's error, a background task's, a
    ``KeyboardInterrupt`` or a cancellation. Called after the background tasks
    are cancelled and before the session waits, at most
    ``session.stop_grace_period_secs``, for the coordinator's threads: a plugin
    that sends work from a thread of its own (an experiment tracker) hands it
    its last items here and says how the run ended. After an ``error`` an
    exception raised here is logged, not raised over the one that ended the run.
    """


# --- extension points -----------------------------------------------------------------


@hookspec
def declare_options() -> Sequence[Option] | None:
    """Declare the options this plugin accepts, with their defaults.

    Return a list of :class:`~monitored.Option`. Users set them with
    ``MonitoredSession(..., plugin_options={"<plugin>": {"<option>": value}})``
    or ``MONITORED_PLUGIN_OPTIONS="<plugin>.<option>=value;..."``; an unknown
    option or a value of the wrong type is an error before the session starts.
    The plugin reads the resolved values with
    :meth:`~monitored.MonitoredSession.options_for` (or, in ``training_hooks``,
    ``config.plugin_options``). ``monitored plugins`` lists them.
    """


@hookspec
def plugin_status(session: MonitoredSession) -> str | None:
    """What this plugin does in ``session``, for the "Loaded plugins" line.

    A few words shown after the plugin's version, e.g. ``"off: set
    MLFLOW_TRACKING_URI"`` or ``"logging to http://127.0.0.1:5000"``, so that a user
    reading the log tells an installed plugin that acts from one that is idle
    in this session, and how to switch it on. ``None`` says nothing. Called once
    the session's hooks are known (plugin options and ``training_hooks`` are
    resolved), before ``begin``.
    """


@hookspec
def training_hooks(config: TrainingConfig) -> Sequence[object] | None:
    """Contribute hooks to a ``MonitoredTrainingSession``.

    ``config`` holds the session's arguments (``checkpoint_dir``,
    ``save_checkpoint_steps``, ``save_summaries_steps``, ``is_chief``, ...). A plugin
    returns the hooks that implement its feature for that configuration (a
    checkpoint plugin returns its saver hook when ``checkpoint_dir`` is set), or
    ``None``. The hooks are called after the user's own hooks.
    """


@hookspec
def run_directories(session: MonitoredSession) -> Sequence[str] | None:
    """The directories this hook writes to during ``session``, which the chief must own.

    Called once on the chief, before any ``begin``: the session claims every
    directory returned (one run, one writer) and keeps it until it closes. A
    directory another live training owns stops the session with
    :class:`~monitored.RunOwnedError` before anything is restored or written; a
    dead owner's claim is taken over with a :class:`~monitored.RunTakenOverWarning`.
    Return paths or URLs (a relative path is resolved once, against the working
    directory at the session's start), or ``None``. Readers return nothing; an
    evaluation session does not call it (it claims nothing).
    """


@hookspec(firstresult=True)
def restore_state(session: MonitoredSession) -> object | None:
    """Restore ``session.state`` on the chief when the session is created.

    The first implementation that returns something other than ``None`` wins; it
    restores arrays, global step, RNG state and plugin states (through
    :meth:`~monitored.MonitoredSession.load_plugin_states`) and returns what it
    restored from (a checkpoint path). When no implementation restores anything,
    the state is freshly initialized by the scaffold's ``init_fn``.
    """


@hookspec(firstresult=True)
def cluster(session: MonitoredSession) -> Cluster | None:
    """Supply the :class:`~monitored.Cluster` this process trains in.

    Asked of installed plugins once, when a session is entered without a
    ``cluster=`` argument, before any other hook: the answer decides whether this
    process is the chief (and so which chief-only plugins load). The first
    implementation that returns something other than ``None`` wins; without one,
    the process is alone (``LocalCluster(is_chief)``). The MPI plugin returns its
    cluster when the process was launched by ``mpiexec`` with more than one rank.
    """


@hookspec
def plugin_state(session: MonitoredSession) -> Mapping[str, Any] | None:
    """Return this plugin's own state, to be saved with checkpoints.

    JSON-serializable values only (early-stopping patience, best value, timers).
    The session namespaces each plugin's state by the name it is registered under,
    so two instances never collide; a plugin that changes its layout declares
    ``plugin_state_version`` (an int attribute, default 1).
    """


@hookspec
def load_plugin_state(session: MonitoredSession, state: Mapping[str, Any], version: int) -> None:
    """Take back the state this plugin returned from ``plugin_state``.

    Called on restore with exactly what was saved for this plugin, and the
    ``plugin_state_version`` it was saved under: a plugin that changed its layout
    migrates an older ``state`` here (a version newer than the plugin's own is
    refused before this is called).
    """


@hookspec
def write_summaries(session: MonitoredSession, step: int, summaries: Mapping[str, Any]) -> None:
    """Receive summary values for ``step``: a summary sink (TensorBoard, a log).

    ``summaries`` maps tags (``"loss"``, ``"global_step/sec"``) to host scalars or
    arrays. Hooks emit summaries through
    :meth:`~monitored.MonitoredSession.write_summaries`; the summaries plugin
    emits every scalar its steps record, at the step written, and its own sink
    skips them. A sink writes what it receives and never emits it again (every
    sink, itself included, would receive it twice).
    """


@hookspec
def before_save(session: MonitoredSession, step: int) -> None:
    """Called by checkpoint plugins before a checkpoint of ``step`` is written."""


@hookspec
def after_save(session: MonitoredSession, step: int, path: str) -> bool | None:
    """Called by checkpoint plugins after the checkpoint of ``step`` is complete.

    Return ``True`` to request a stop, like TF1's ``CheckpointSaverListener``.
    A checkpoint plugin writes in the background and calls this at the first
    step boundary after the write finished, where a stop requested here takes
    effect; so that listening to saves never makes a save wait for the disk.
    An implementation that must hear of each save before the next step (to stop
    at exactly the saved step) sets ``synchronous_after_save = True`` on its
    hook object or plugin module: the checkpoint plugin then waits for each
    write, as TF1 did.
    """


@hookspec
def after_evaluate(session: MonitoredSession, step: int, metrics: Mapping[str, float]) -> None:
    """Called on a training session's plugins when an evaluation has finished.

    ``step`` is the global step of the state evaluated and ``metrics`` maps each
    metric's name to its result. Emitted by
    :meth:`~monitored.MonitoredSession.report_evaluation` (the evaluation package's
    ``EvaluationHook`` calls it): early stopping, progress and summaries plugins
    react to evaluation results here. The evaluation has already handed the same
    values to the summary sinks of its own session (``<model_dir>/eval``).
    """


# --- the command line ------------------------------------------------------------------


@hookspec
def register_commands(commands: Commands) -> None:
    """Add commands to the ``monitored`` command line (``monitored checkpoint ls DIR``).

    Called on each installed plugin that is not disabled, each time ``monitored``
    runs (never in a session). ``commands.add_parser(name, help=...)`` adds the
    command ``monitored <name>`` and returns its :class:`argparse.ArgumentParser`:
    add arguments or subcommands to it and set what runs with
    ``set_defaults(handler=fn)``; ``fn(args)`` returns the exit status.
    ``monitored --help`` lists each command with the plugin that adds it. A
    plugin that fails to import or raises here loses its commands only, with an
    error naming it; a name another plugin or the core has is refused.
    """


# --- capabilities: asked of the one installed plugin that provides them -----------------------
#
# A plugin declares what it provides (``provides = {"checkpoint"}``). The core, and a
# plugin that needs another's capability, find its provider (``monitored.provider``)
# and call these on it alone, synchronously, instead of importing a plugin package by
# name: another provider can stand in.


@hookspec(firstresult=True)
def latest_checkpoint(checkpoint_dir: str) -> str | None:
    """Provider of ``"checkpoint"``: the path of the newest checkpoint in ``checkpoint_dir``.

    ``None`` when it holds none. The session manager restores from it, the
    evaluation finds what to evaluate with it, the Supervisor waits for it.
    """


@hookspec(firstresult=True)
def restore_checkpoint(state: TrainState, path: str) -> object | None:
    """Provider of ``"checkpoint"``: fill ``state`` from the checkpoint at ``path``.

    Arrays, global step and RNG state, as saved; returns what it restored
    (anything but ``None``). A checkpoint that does not exist raises
    ``FileNotFoundError`` (or a subclass); a malformed one the provider's error.
    """


@hookspec(firstresult=True)
def read_checkpoint(path: str) -> tuple[str, Mapping[str, Any]] | None:
    """Provider of ``"checkpoint"``: ``(resolved path, {name: host array})`` of ``path``.

    Reads a checkpoint without a state to fill (``monitored.train.warm_start``
    copies chosen arrays out of it); ``path`` may name a checkpoint or a
    directory (its newest checkpoint).
    """


@hookspec(firstresult=True)
def list_checkpoints(checkpoint_dir: str) -> Sequence[tuple[str, int, Mapping[str, Any]]] | None:
    """Provider of ``"checkpoint"``: every checkpoint of ``checkpoint_dir``, oldest step first.

    Each as ``(path, global step, plugin states)``, the plugin states as
    :meth:`~monitored.MonitoredSession.load_plugin_states` takes them; an empty
    sequence when it holds none. A checkpoint that cannot be read is left out.
    A NaN guard rolls back to the newest one older than the step that diverged.
    """


@hookspec(firstresult=True)
def save_checkpoint(
    state: TrainState,
    checkpoint_dir: str,
    basename: str,
    step: int,
    plugin_states: Mapping[str, Any],
    max_to_keep: int,
) -> str | None:
    """Provider of ``"checkpoint"``: write ``state`` as checkpoint ``<basename>-<step>``.

    In ``checkpoint_dir`` (created if needed), with ``plugin_states`` (what
    :meth:`~monitored.MonitoredSession.plugin_states` returned); only the newest
    ``max_to_keep`` checkpoints of that directory are kept (0: all). Returns the
    path, which :func:`restore_checkpoint` takes. Early stopping exports its best
    state with it.
    """


@hookspec(firstresult=True)
def checkpoints_iterator(
    checkpoint_dir: str,
    min_interval_secs: float,
    timeout: float | None,
    timeout_fn: Any,
    poll_secs: float | None,
) -> Any:
    """Provider of ``"checkpoint"``: an async iterator over new checkpoints of ``checkpoint_dir``.

    TF1's ``checkpoints_iterator``: yields each new checkpoint's path, at most one
    every ``min_interval_secs``; after ``timeout`` seconds without one it ends,
    unless ``timeout_fn()`` returns false. The evaluation follows training with it.
    The iterator also has ``reject(path, reason)``: the evaluation hands back a
    checkpoint it yielded but could not restore (deleted, incomplete or damaged,
    raising ``FileNotFoundError`` or :class:`~monitored.DamagedCheckpointError`),
    which then counts as never yielded.
    """


@hookspec(firstresult=True)
def checkpoint_saver(saver: object | None) -> object | None:
    """Provider of ``"checkpoint"``: the saver object a ``Supervisor`` exposes as ``sv.saver``.

    ``saver=None`` asks for a new default one; given an object, return it when
    the provider saves with it, or raise ``TypeError`` saying what to pass.
    """


@hookspec(firstresult=True)
def checkpoint_hooks(
    checkpoint_dir: str, save_secs: float | None, saver: object, checkpoint_basename: str
) -> Sequence[object] | None:
    """Provider of ``"checkpoint"``: the hooks of a ``Supervisor``'s checkpoint service.

    They restore the newest checkpoint of ``checkpoint_dir`` when the session is
    created and, when ``save_secs`` is set, save one every ``save_secs`` seconds
    (and at the end) with ``saver`` as ``<checkpoint_basename>-<step>``.
    """


@hookspec(firstresult=True)
def summary_writer(logdir: str | None, writer: object | None) -> object | None:
    """Provider of ``"summaries"``: the event-file writer of ``logdir``.

    Given ``writer``, return it when the provider writes with it, or raise
    ``TypeError`` saying what to pass; else the writer ``logdir`` shares (made
    on first use, which creates its event file).
    """


@hookspec(firstresult=True)
def summary_session_log(writer: object, status: str, global_step: int | None) -> bool | None:
    """Provider of ``"summaries"``: write TF1's ``SessionLog`` event to ``writer``.

    ``status`` is ``"start"`` or ``"stop"``; ``global_step`` the event's step
    (``None``: none, as TF1's ``Supervisor.stop`` writes ``STOP``). Return ``True``.
    """


@hookspec(firstresult=True)
def summary_hooks(
    save_secs: float, summary_writer: object | None, output_dir: str | None
) -> Sequence[object] | None:
    """Provider of ``"summaries"``: the hooks of a ``Supervisor``'s summary service.

    They write what the steps record every ``save_secs`` seconds to
    ``summary_writer``, or, when it is ``None``, to ``output_dir``'s shared writer.
    """
