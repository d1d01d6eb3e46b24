"""Per-step overhead of ``MonitoredSession`` against a bare loop.

Measures microseconds per step of

* a **bare loop**: an ``async def`` loop that calls (and, for an async step,
  awaits) the same step function on the same kind of state, and nothing else;
* ``MonitoredSession`` with no hook at all;
* ``MonitoredSession`` with 10 no-op hook objects (sync or ``async def``
  ``before_run`` and ``after_run``);
* ``MonitoredSession`` with 10 no-op **installed plugins**: modules found through
  real ``monitored`` entry points of a throw-away distribution put on
  ``sys.path`` for the run (sync or async ``before_run`` and ``after_run``);

each for a sync and an ``async def`` step function; and the **fetch rows** (sync
step, sync hooks): 1, 10 or 100 hooks each fetching 0, 1, 8 or 64 names (step
outputs, a state entry and the global step) through a constant ``SessionRunArgs``
(as plugins build theirs once), one row building a new ``SessionRunArgs`` every
step (TF1 style) and one asking with ``lag=1``. A hook fetching 0 names returns
``SessionRunArgs(None)``: the same hook, asking for nothing. The session loop is the
idiomatic one, ``if sess.should_stop(): break`` then ``await sess.run(step)``.

Noise: the machine this runs on is small and shared. ``--clock cpu`` times with the
measuring thread's CPU time instead of elapsed time, which leaves out the spells
the process waits for a core (on an oversubscribed machine, most of the noise). Each
measurement runs in a
fresh process that opens one configuration **and** the bare loop for the same
step function, warms both up, then times them in alternating blocks of
``--block`` steps, so a slow spell of the machine hits both alike; the overhead
is the configuration's time minus that bare loop's. Within a repeat the
configurations take turns in a rotating order. The table gives medians over
repeats, with the min-max range of the paired overhead.

The no-op hook objects are instances of one class (one function behind every
call: the best case for CPython's specializing interpreter); the installed
plugins are ten modules, ten different functions, as real plugins are.

Installed plugins of the environment are not loaded
(``MONITORED_DISABLE_PLUGIN_AUTOLOAD=1``), except the benchmark's own and, in the
default install row, the environment's.

Under the table, the ratios the targets are stated in (docs/performance.md), each
from medians and from each row's least-disturbed repeat (its minimum).

Usage::

    python benchmarks/overhead.py [--steps N] [--repeats R] [--rows all|hooks|fetch|default]
        [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import inspect
import io
import multiprocessing
import os
import platform
import shlex
import statistics
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import anyio
import numpy as np

#: Set before ``monitored`` looks at it (it is read when a session is entered).
os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("MONITORED_DISABLE_PLUGINS", None)

import monitored
from monitored._core._plugins import installed_entry_points

#: TF1's ``MonitoredTrainingSession`` overhead on this class of machine (DESIGN.md).
TF1_US_PER_STEP: Final = 38.0
#: Issue 26's targets, ratios within one run: the fetch machinery of 10 hooks x 8
#: names over the same fetch written by hand; 10 hooks returning ``SessionRunArgs(None)``
#: over 10 returning ``None``; 10 async no-op hooks over 10 sync ones; and the default
#: install (every installed plugin, nothing due) over the core alone, in us/step.
TARGET_FETCH_OVER_HAND: Final = 1.5
TARGET_EMPTY_ARGS_OVER_NONE: Final = 1.1
TARGET_ASYNC_OVER_SYNC: Final = 1.2
TARGET_DEFAULT_OVER_CORE_US: Final = 1.0
#: What the fetch rows' hooks ask for, in this order: 8 names are the loss, the
#: state entry ``w``, the global step and 5 more step outputs.
FETCH_NAMES: Final = ("loss", "w", "global_step", *(f"m{i:02d}" for i in range(61)))
#: Whether the ``monitored`` being measured has ``SessionRunArgs(lag=...)`` (an older
#: checkout, measured for a before/after comparison, has not).
HAS_LAG: Final = "lag" in inspect.signature(monitored.SessionRunArgs).parameters
#: How many no-op plugins the loaded configurations carry.
N_PLUGINS: Final = 10
#: Name of the throw-away distribution that provides the entry-point plugins.
_DIST: Final = "monitored-bench-noop"
_PACKAGE: Final = "monitored_bench_noop"

StepFn = Callable[[monitored.TrainState], Any]


# --- the step function -----------------------------------------------------------------


def make_steps(size: int) -> tuple[StepFn, StepFn]:
    """A sync and an async step function doing the same tiny training step.

    Each does one in-place NumPy update of ``state["w"]`` (``size`` float32
    elements; ``size=0`` skips NumPy entirely), increments the global step and
    returns a constant outputs mapping, so the step itself allocates nothing.
    """
    grad = np.full(max(size, 1), 1e-6, dtype=np.float32)
    outputs: Mapping[str, Any] = {
        "loss": np.float32(0.5),
        **{name: np.float32(i) for i, name in enumerate(FETCH_NAMES[3:])},
    }

    if size > 0:

        def step(state: monitored.TrainState) -> Mapping[str, Any]:
            w = state["w"]
            np.subtract(w, grad, out=w)
            state.global_step += 1
            return outputs

        async def astep(state: monitored.TrainState) -> Mapping[str, Any]:
            w = state["w"]
            np.subtract(w, grad, out=w)
            state.global_step += 1
            return outputs

    else:

        def step(state: monitored.TrainState) -> Mapping[str, Any]:
            state.global_step += 1
            return outputs

        async def astep(state: monitored.TrainState) -> Mapping[str, Any]:
            state.global_step += 1
            return outputs

    return step, astep


def make_state(size: int) -> monitored.TrainState:
    """A fresh state with the one entry the step function updates."""
    return monitored.TrainState({"w": np.zeros(max(size, 1), dtype=np.float32)})


# --- no-op hooks -------------------------------------------------------------------------


class NoopHook:
    """A hook object whose ``before_run`` and ``after_run`` do nothing."""

    __slots__ = ()

    def before_run(self, run_context: monitored.SessionRunContext) -> None:
        """Ask for nothing."""

    def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        """Do nothing with nothing."""


class EmptyArgsHook:
    """Like :class:`NoopHook`, but ``before_run`` returns ``SessionRunArgs(None)``."""

    __slots__ = ()

    ARGS: Final = monitored.SessionRunArgs(None)

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        """Ask for nothing, in a ``SessionRunArgs``."""
        return self.ARGS

    def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        """Do nothing with nothing."""


class AsyncNoopHook:
    """Like :class:`NoopHook`, with ``async def`` implementations."""

    __slots__ = ()

    async def before_run(self, run_context: monitored.SessionRunContext) -> None:
        """Ask for nothing."""

    async def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        """Do nothing with nothing."""


class FetchHook:
    """A hook asking for ``names`` through one constant ``SessionRunArgs`` (a dict)."""

    __slots__ = ("args", "seen")

    def __init__(self, names: Sequence[str], lag: int = 0) -> None:
        fetches = {name: name for name in names} or None
        self.args = (
            monitored.SessionRunArgs(fetches, lag=lag)  # type: ignore[arg-type]
            if lag
            else monitored.SessionRunArgs(fetches)
        )
        self.seen: Any = None

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        """Ask for the same names as every step."""
        return self.args

    def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        """Keep the answer (as a hook reading it would)."""
        self.seen = run_values.results


class FreshFetchHook:
    """Like :class:`FetchHook`, building a new ``SessionRunArgs`` and dict every step."""

    __slots__ = ("names", "seen")

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.seen: Any = None

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        """Ask for the names in a new structure, as TF1-style hooks do."""
        return monitored.SessionRunArgs({name: name for name in self.names})

    def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        """Keep the answer."""
        self.seen = run_values.results


class Consumer:
    """What the hand-written fetch row fills: one consumer's dict of values."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: Any = None


def hand_fetch(
    outputs: Mapping[str, Any], state: monitored.TrainState, consumers: Sequence[Consumer]
) -> None:
    """The 10 x 8 fetch written by hand: each consumer builds its dict of the 8 values.

    The names are ``FETCH_NAMES[:8]``; the one array (``w``) is copied once per step
    and shared, the NumPy scalars are immutable and handed over as they are.
    """
    w = state["w"].copy()
    global_step = np.int64(state.global_step)
    for consumer in consumers:
        consumer.seen = {
            "loss": outputs["loss"],
            "w": w,
            "global_step": global_step,
            "m00": outputs["m00"],
            "m01": outputs["m01"],
            "m02": outputs["m02"],
            "m03": outputs["m03"],
            "m04": outputs["m04"],
        }


_MODULE_SOURCE: Final = {
    "sync": """\
        def before_run(run_context):
            return None


        def after_run(run_context, run_values):
            return None
        """,
    "async": """\
        async def before_run(run_context):
            return None


        async def after_run(run_context, run_values):
            return None
        """,
}


def _entry_point_name(kind: str, i: int) -> str:
    return f"bench_noop_{kind}_{i:02d}"


@contextlib.contextmanager
def installed_noop_plugins() -> Iterator[None]:
    """Put a distribution with ``2 * N_PLUGINS`` no-op plugin modules on ``sys.path``.

    It registers, under the ``monitored`` entry-point group, ``N_PLUGINS`` sync
    and ``N_PLUGINS`` async modules; a session picks one kind with
    ``disable_plugins`` (see :func:`_plugin_session`). Removed on exit.
    """
    with tempfile.TemporaryDirectory(prefix="monitored-bench-") as tmp:
        root = Path(tmp)
        package = root / _PACKAGE
        package.mkdir()
        (package / "__init__.py").write_text('"""No-op plugins for benchmarks/overhead.py."""\n')
        lines = ["[monitored]"]
        for kind, source in _MODULE_SOURCE.items():
            for i in range(N_PLUGINS):
                module = f"{kind}_{i:02d}"
                (package / f"{module}.py").write_text(textwrap.dedent(source))
                lines.append(f"{_entry_point_name(kind, i)} = {_PACKAGE}.{module}")
        info = root / f"{_PACKAGE}-0.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {_DIST}\nVersion: 0.0.0\n")
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        sys.path.insert(0, tmp)
        importlib.invalidate_caches()
        try:
            yield
        finally:
            sys.path.remove(tmp)
            for name in [m for m in sys.modules if m.split(".")[0] == _PACKAGE]:
                del sys.modules[name]


@contextlib.asynccontextmanager
async def _plugin_session(
    state: monitored.TrainState, kind: str
) -> AsyncIterator[monitored.MonitoredSession]:
    """A session whose hooks are the benchmark's installed ``kind`` plugins only."""
    wanted = {_entry_point_name(kind, i) for i in range(N_PLUGINS)}
    others = {ep.name for ep in installed_entry_points()} - wanted
    session = monitored.MonitoredSession(state, disable_plugins=others)
    saved = os.environ.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    try:
        await session.__aenter__()
    finally:
        os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = saved
    names = sorted(info.name for info in session.plugins)
    if names != sorted(wanted):  # pragma: no cover - a broken environment
        await session.close()
        raise RuntimeError(f"expected the {kind} bench plugins only, got {names}")
    try:
        yield session
    finally:
        await session.__aexit__(None, None, None)


# --- configurations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One row of the table: how steps run and with which hooks."""

    #: ``"sync"`` or ``"async"``: which step function.
    step_kind: str
    #: ``"bare"`` or the session's hook set: ``"none"``, ``"hooks"``, ``"plugins"``.
    runner: str
    #: ``"sync"`` or ``"async"`` hook implementations (``""`` without hooks).
    hook_kind: str = ""
    #: Fetch rows (``runner == "fetch"``): how many hooks, names each, lag, and
    #: whether each step builds a new ``SessionRunArgs``.
    hooks: int = 0
    names: int = 0
    lag: int = 0
    fresh: bool = False
    #: What the row is paired with in its process: the bare loop, or (``"none"``)
    #: the session without plugins.
    baseline: str = "bare"

    @property
    def label(self) -> str:
        """The runner column of the table."""
        if self.runner == "bare":
            return "bare loop"
        if self.runner == "none":
            return "MonitoredSession, 0 plugins"
        if self.runner == "hand":
            return f"hand-written: {self.hooks} consumers building a dict of {self.names} values"
        if self.runner == "direct":
            return f"hand-written: {N_PLUGINS} {self.hook_kind} no-op hooks called directly"
        if self.runner == "default":
            return "MonitoredSession, default install (nothing due), over 0 plugins"
        if self.runner == "fetch":
            label = f"MonitoredSession, {self.hooks} hooks fetching {self.names} names each"
            if self.lag:
                label += ", lag=1"
            if self.fresh:
                label += ", new SessionRunArgs each step"
            return label
        if self.hook_kind == "empty":
            return f"MonitoredSession, {N_PLUGINS} hook objects returning SessionRunArgs(None)"
        what = "hook objects" if self.runner == "hooks" else "installed plugins (modules)"
        return f"MonitoredSession, {N_PLUGINS} {self.hook_kind} {what}"


def all_configs(rows: str = "all") -> list[Config]:
    """Every configuration of ``rows`` (``all``, ``hooks``, ``fetch`` or ``default``),
    bare loops first."""
    configs = []
    if rows in {"all", "hooks"}:
        for step_kind in ("sync", "async"):
            configs.append(Config(step_kind, "bare"))
            configs.append(Config(step_kind, "none"))
            for runner in ("hooks", "plugins"):
                for hook_kind in ("sync", "async"):
                    configs.append(Config(step_kind, runner, hook_kind))
        configs += [
            Config("sync", "hooks", "empty"),
            Config("sync", "direct", "sync"),
            Config("sync", "direct", "async"),
        ]
    if rows in {"all", "default"}:
        if rows == "default":
            configs.append(Config("sync", "bare"))
            configs.append(Config("sync", "none"))
        configs.append(Config("sync", "default", baseline="none"))
    if rows in {"all", "fetch"}:
        if rows == "fetch":
            configs.append(Config("sync", "bare"))
            # The ratios' baselines, in the same run: hooks returning None, sync and async.
            configs.append(Config("sync", "hooks", "sync"))
            configs.append(Config("sync", "hooks", "async"))
            configs.append(Config("sync", "hooks", "empty"))
            configs.append(Config("sync", "direct", "sync"))
            configs.append(Config("sync", "direct", "async"))
        for hooks, names in ((1, 0), (1, 1), (1, 8), (1, 64), (10, 0), (10, 1), (10, 8)):
            configs.append(Config("sync", "fetch", "sync", hooks, names))
        configs.append(Config("sync", "fetch", "sync", 10, 8, fresh=True))
        if HAS_LAG:
            configs.append(Config("sync", "fetch", "sync", 10, 8, lag=1))
        configs.append(Config("sync", "fetch", "sync", 100, 0))
        configs.append(Config("sync", "fetch", "sync", 100, 8))
        configs.append(Config("sync", "hand", "sync", 10, 8))
    return configs


#: Runs ``n`` steps and returns the nanoseconds they took.
Runner = Callable[[int], Awaitable[int]]

#: The clocks ``--clock`` chooses from: elapsed time, or the CPU time of the
#: measuring thread (which leaves out the time the process waits for a core).
CLOCKS: Final[dict[str, Callable[[], int]]] = {
    "wall": time.perf_counter_ns,
    "cpu": time.thread_time_ns,
}
_now: Callable[[], int] = time.perf_counter_ns


def _bare_runner(step: StepFn, state: monitored.TrainState, is_async: bool) -> Runner:
    if is_async:

        async def run_async(n: int) -> int:
            start = _now()
            for _ in range(n):
                await step(state)
            return _now() - start

        return run_async

    async def run_sync(n: int) -> int:
        start = _now()
        for _ in range(n):
            step(state)
        return _now() - start

    return run_sync


def _hand_runner(step: StepFn, state: monitored.TrainState, consumers: int) -> Runner:
    sinks = [Consumer() for _ in range(consumers)]

    async def run(n: int) -> int:
        start = _now()
        for _ in range(n):
            hand_fetch(step(state), state, sinks)
        return _now() - start

    return run


def _direct_runner(step: StepFn, state: monitored.TrainState, is_async: bool) -> Runner:
    """A bare loop calling 10 no-op hook objects around each step, by hand."""
    hooks: list[Any] = [AsyncNoopHook() if is_async else NoopHook() for _ in range(N_PLUGINS)]
    before = [hook.before_run for hook in hooks]
    after = [hook.after_run for hook in hooks]
    values = monitored.SessionRunValues(None)

    if is_async:

        async def run_async(n: int) -> int:
            start = _now()
            for _ in range(n):
                for call in before:
                    await call(None)
                step(state)
                for call in after:
                    await call(None, values)
            return _now() - start

        return run_async

    async def run_sync(n: int) -> int:
        start = _now()
        for _ in range(n):
            for call in before:
                call(None)
            step(state)
            for call in after:
                call(None, values)
        return _now() - start

    return run_sync


@contextlib.asynccontextmanager
async def _default_session(
    state: monitored.TrainState,
) -> AsyncIterator[monitored.MonitoredSession]:
    """A session with every installed plugin of the environment, none of them due.

    The benchmark's own no-op plugins are left out; progress prints plain lines
    (every 30 s: none in a measurement), whatever the terminal.
    """
    ours = {_entry_point_name(kind, i) for kind in _MODULE_SOURCE for i in range(N_PLUGINS)}
    session = monitored.MonitoredSession(
        state, disable_plugins=ours, plugin_options={"progress": {"mode": "plain"}}
    )
    saved = os.environ.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    try:
        await session.__aenter__()
    finally:
        os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = saved
    try:
        yield session
    finally:
        with contextlib.redirect_stderr(io.StringIO()):  # progress's closing line
            await session.__aexit__(None, None, None)


def _session_runner(session: monitored.MonitoredSession, step: StepFn) -> Runner:
    async def run(n: int) -> int:
        # Hoisted like the bare loop's ``step``: two attribute lookups (~0.03 µs) less.
        should_stop, run_step = session.should_stop, session.run
        start = _now()
        for _ in range(n):
            if should_stop():
                break
            await run_step(step)
        return _now() - start

    return run


async def _open(
    config: Config, stack: contextlib.AsyncExitStack, steps: tuple[StepFn, StepFn], size: int
) -> Runner:
    step = steps[config.step_kind == "async"]
    state = make_state(size)
    if config.runner == "bare":
        return _bare_runner(step, state, config.step_kind == "async")
    if config.runner == "hand":
        return _hand_runner(step, state, config.hooks)
    if config.runner == "direct":
        return _direct_runner(step, state, config.hook_kind == "async")
    if config.runner == "default":
        session = await stack.enter_async_context(_default_session(state))
    elif config.runner == "plugins":
        session = await stack.enter_async_context(_plugin_session(state, config.hook_kind))
    elif config.runner == "fetch":
        names = FETCH_NAMES[: config.names]
        fetch_hooks = [
            FreshFetchHook(names) if config.fresh else FetchHook(names, config.lag)
            for _ in range(config.hooks)
        ]
        session = await stack.enter_async_context(
            monitored.MonitoredSession(state, hooks=fetch_hooks)
        )
    else:
        hook_type = {"async": AsyncNoopHook, "empty": EmptyArgsHook}.get(config.hook_kind, NoopHook)
        hooks = [hook_type() for _ in range(N_PLUGINS)] if config.runner == "hooks" else []
        session = await stack.enter_async_context(monitored.MonitoredSession(state, hooks=hooks))
    return _session_runner(session, step)


# --- measuring ---------------------------------------------------------------------------------


@dataclass
class Result:
    """The figures of one configuration, in µs per step, one per repeat."""

    config: Config
    us_per_step: list[float] = field(default_factory=list)
    #: This configuration's time minus the bare loop's, paired (same process, same time).
    overhead: list[float] = field(default_factory=list)
    #: This configuration's time over the bare loop's, paired likewise.
    ratio: list[float] = field(default_factory=list)


async def measure_pair(config: Config, *, steps: int, size: int, block: int) -> tuple[float, float]:
    """µs per step of ``config``'s baseline and of ``config``, for the same step function.

    The baseline is the bare loop (or, for the default install, the session
    without plugins). Both are opened and warmed up, then run in alternating
    blocks of ``block`` steps (which goes first alternates too), so a slow spell
    of the machine hits both alike.
    """
    step_fns = make_steps(size)
    blocks = max(1, steps // block)
    async with contextlib.AsyncExitStack() as stack:
        bare = await _open(Config(config.step_kind, config.baseline), stack, step_fns, size)
        runner = await _open(config, stack, step_fns, size)
        for warm_up in (bare, runner):
            await warm_up(min(2000, steps))
        totals = [0, 0]
        gc.collect()
        for b in range(blocks):
            for i in (0, 1) if b % 2 == 0 else (1, 0):
                totals[i] += await (bare, runner)[i](block)
    bare_ns, ns = totals
    return bare_ns / (blocks * block) / 1000, ns / (blocks * block) / 1000


def _child(conn: Connection, config: Config, steps: int, size: int, block: int, clock: str) -> None:
    global _now
    _now = CLOCKS[clock]
    try:
        pair = anyio.run(lambda: measure_pair(config, steps=steps, size=size, block=block))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    else:
        conn.send(("ok", pair))
    finally:
        conn.close()


def measure_in_child(
    config: Config, *, steps: int, size: int, block: int, clock: str = "wall"
) -> tuple[float, float]:
    """:func:`measure_pair` in a fresh process (forked where the platform can).

    A fresh interpreter per measurement keeps CPython's specializing interpreter
    honest: in one process, the session's hot path would be shared by every
    configuration (bound methods, functions, coroutines at the same call sites),
    while a real program runs one configuration.
    """
    context = (
        multiprocessing.get_context("fork")
        if "fork" in multiprocessing.get_all_start_methods()
        else multiprocessing.get_context("spawn")
    )
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, config, steps, size, block, clock))
    process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        status, payload = "error", "the measuring process died without an answer"
    finally:
        process.join()
        receiver.close()
    if status != "ok":
        raise RuntimeError(f"measuring {config.label} ({config.step_kind} step) failed:\n{payload}")
    bare, us = payload
    return bare, us


def measure(
    configs: Sequence[Config],
    *,
    steps: int,
    repeats: int,
    size: int,
    block: int,
    clock: str = "wall",
) -> list[Result]:
    """Time every session configuration ``repeats`` times against its bare loop.

    Each measurement runs in a fresh process (:func:`measure_in_child`); within a
    repeat the configurations take turns in a rotating order, so a slow spell of
    the machine is spread over all of them. The bare loop's figures are those
    measured beside every configuration with the same step function.
    """
    results = {config: Result(config) for config in configs}
    loaded = [config for config in configs if config.runner != "bare"]
    for repeat in range(repeats):
        print(f"repeat {repeat + 1}/{repeats}", file=sys.stderr, flush=True)
        shift = repeat % len(loaded)
        for config in loaded[shift:] + loaded[:shift]:
            bare_us, us = measure_in_child(config, steps=steps, size=size, block=block, clock=clock)
            if config.baseline == "bare":
                bare = results.setdefault(
                    Config(config.step_kind, "bare"), Result(Config(config.step_kind, "bare"))
                )
                bare.us_per_step.append(bare_us)
                bare.overhead.append(0.0)
                bare.ratio.append(1.0)
            result = results[config]
            result.us_per_step.append(us)
            result.overhead.append(us - bare_us)
            result.ratio.append(us / bare_us)
    return [results[config] for config in configs if config in results]


# --- reporting ---------------------------------------------------------------------------------


def machine() -> str:
    """One line describing the machine and the versions that matter."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("monitored", "numpy", "anyio", "pluggy")
    )
    return (
        f"{os.cpu_count()} CPUs ({cpu}, {platform.machine()}), {platform.system()} "
        f"{platform.release()}, {platform.python_implementation()} {platform.python_version()}; "
        f"{versions}; anyio backend asyncio"
    )


def _target_cell(result: Result, results: Sequence[Result]) -> str:
    config = result.config
    over = statistics.median(result.overhead)
    if config.runner == "default":
        ok = over <= TARGET_DEFAULT_OVER_CORE_US
        return f"{'yes' if ok else 'NO'} (<= {TARGET_DEFAULT_OVER_CORE_US:g} over 0 plugins)"
    return ""


def _find(results: Sequence[Result], config: Config) -> Result | None:
    return next((r for r in results if r.config == config), None)


def ratios(results: Sequence[Result]) -> list[str]:
    """The targets stated as ratios within this run, where the run has their rows.

    Each ratio is given from the rows' medians and from each row's least-disturbed
    repeat (its smallest overhead).
    """
    fetch = Config("sync", "fetch", "sync")
    rows = {
        "fetch": _find(results, dataclass_replace(fetch, hooks=10, names=8)),
        "empty": _find(results, dataclass_replace(fetch, hooks=10, names=0)),
        "empty args": _find(results, Config("sync", "hooks", "empty")),
        "hand": _find(results, Config("sync", "hand", "sync", 10, 8)),
        "sync": _find(results, Config("sync", "hooks", "sync")),
        "async": _find(results, Config("sync", "hooks", "async")),
        "direct sync": _find(results, Config("sync", "direct", "sync")),
        "direct async": _find(results, Config("sync", "direct", "async")),
    }

    def figures(name: str) -> tuple[float, float] | None:
        row = rows[name]
        return None if row is None else (statistics.median(row.overhead), min(row.overhead))

    def line(what: str, num: tuple[float, float], den: tuple[float, float], target: float) -> str:
        median, least = (n / d if d > 0 else float("inf") for n, d in zip(num, den, strict=True))
        ok = "yes" if median <= target else "NO"
        return f"{what}: {median:.2f}x (least-disturbed {least:.2f}x); target <= {target:g}x: {ok}"

    lines = []
    got = {name: figures(name) for name in rows}
    fetched, empty, hand = got["fetch"], got["empty"], got["hand"]
    if fetched is not None and empty is not None and hand is not None:
        machinery = (fetched[0] - empty[0], fetched[1] - empty[1])
        lines.append(
            line(
                "fetch machinery, 10 hooks x 8 names (10 x 8 row minus 10 x 0 row) "
                "over the same fetch by hand",
                machinery,
                hand,
                TARGET_FETCH_OVER_HAND,
            )
        )
    if got["empty args"] is not None and got["sync"] is not None:
        lines.append(
            line(
                "10 hooks returning SessionRunArgs(None) over 10 returning None",
                got["empty args"],
                got["sync"],
                TARGET_EMPTY_ARGS_OVER_NONE,
            )
        )
    if got["async"] is not None and got["sync"] is not None:
        lines.append(
            line(
                "10 async no-op hooks over 10 sync ones (sync step)",
                got["async"],
                got["sync"],
                TARGET_ASYNC_OVER_SYNC,
            )
        )
    if got["direct async"] is not None and got["direct sync"] is not None:
        lines.append(
            line(
                "the same, called by hand (what the calls themselves cost)",
                got["direct async"],
                got["direct sync"],
                TARGET_ASYNC_OVER_SYNC,
            )
        )
    return lines


def load_average() -> str:
    """The 1-minute load average (other work on the machine), or ``?``."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:  # pragma: no cover - not on Unix
        return "?"


def markdown(
    results: Sequence[Result], command: str, args: argparse.Namespace, loads: tuple[str, str]
) -> str:
    """The results as a markdown table, with the command line and machine."""
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}; 1-min load average {loads[0]} before, {loads[1]} after",
        "",
        f"Clock: {'CPU time of the measuring thread' if args.clock == 'cpu' else 'elapsed'}; "
        f"{args.repeats} repeats x {args.steps} steps per configuration (after warm-up), "
        "each in a fresh process beside its bare loop, the two alternating in blocks of "
        f"{args.block} steps; step = in-place NumPy update of {args.size} float32 + "
        "global step increment, returning a constant mapping of 62 outputs. Figures are "
        "medians over repeats; overhead = configuration "
        "minus bare loop in the same process (the default install: minus the session "
        "with 0 plugins), with its min-max range. "
        f"Reference: TF1 MonitoredTrainingSession adds about {TF1_US_PER_STEP:g} us/step.",
        "",
        "| step fn | runner | us/step | overhead us/step | overhead min - max | x bare | target |",
        "|---|---|--:|--:|--:|--:|---|",
    ]
    for result in results:
        us = statistics.median(result.us_per_step)
        bare = result.config.runner == "bare"
        over = "-" if bare else f"{statistics.median(result.overhead):.2f}"
        spread = "-" if bare else f"{min(result.overhead):.2f} - {max(result.overhead):.2f}"
        ratio = statistics.median(result.ratio)
        lines.append(
            f"| {result.config.step_kind} | {result.config.label} | {us:.2f} | {over} | "
            f"{spread} | {ratio:.1f} | {_target_cell(result, results)} |"
        )
    found = ratios(results)
    if found:
        lines += ["", *(f"- {line}" for line in found)]
    return "\n".join(lines)


def plain(results: Sequence[Result]) -> str:
    """The results as aligned text."""
    header = ("step", "runner", "us/step", "overhead", "min-max", "x bare")
    rows = ["{:5} {:80} {:>8} {:>9} {:>12} {:>6}".format(*header)]
    for result in results:
        over = statistics.median(result.overhead)
        spread = f"{min(result.overhead):.2f}-{max(result.overhead):.2f}"
        rows.append(
            f"{result.config.step_kind:5} {result.config.label:80} "
            f"{statistics.median(result.us_per_step):8.2f} {over:9.2f} {spread:>12} "
            f"{statistics.median(result.ratio):6.1f}"
        )
    rows += ratios(results)
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats (the median is shown)")
    parser.add_argument("--block", type=int, default=500, help="steps per interleaved block")
    parser.add_argument(
        "--size", type=int, default=64, help="float32 elements the step updates (0: no NumPy)"
    )
    parser.add_argument(
        "--rows",
        choices=("all", "hooks", "fetch", "default"),
        default="all",
        help="no-op hook rows, fetch rows, the default install row, or all",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="elapsed time, or the measuring thread's CPU time (steadier on a busy machine)",
    )
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.block < 1 or args.size < 0:
        parser.error("--steps, --repeats and --block must be positive, --size >= 0")
    args.block = min(args.block, args.steps)
    return args


def _interpreter() -> str:
    """How this interpreter was named: relative to the working directory if inside it."""
    path = Path(sys.executable)
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return path.name


def _script() -> str:
    """This script's path as given, or relative to the working directory."""
    path = Path(__file__)
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(arguments)
    command = shlex.join([_interpreter(), _script(), *arguments])
    load_before = load_average()
    with installed_noop_plugins():
        results = measure(
            all_configs(args.rows),
            steps=args.steps,
            repeats=args.repeats,
            size=args.size,
            block=args.block,
            clock=args.clock,
        )
    loads = (load_before, load_average())
    print(markdown(results, command, args, loads) if args.markdown else plain(results))


if __name__ == "__main__":
    main()
