"""``ProgressHook``: a live progress display, or plain log lines without a terminal.

On an interactive terminal (or in Jupyter) a ``rich`` progress bar shows the
step, steps/s, elapsed time, the ETA when the last step is known, the latest
values of chosen outputs and the latest checkpoint; log records of the session
print above it through the same console. In Jupyter the bar is rich's notebook
display, one output redrawn in place by its display id (no widget, so a notebook
run without a front end, as by ``nbconvert --execute``, works the same); a kernel
without ``IPython`` gets the plain lines instead.
Elsewhere (CI, log files, ``nohup``) it writes a plain line every
``log_every_secs`` seconds, with no control characters. Per step it reads the
clock and compares; on the few steps where a refresh is due it fetches the
``show`` outputs (in the step's batched fetch) and redraws. It never creates a coroutine in a step.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, ClassVar, Final, Literal, final

import anyio

from monitored import SessionRunArgs, StopAtStepHook, optional, to_host

from ._errors import ProgressConfigError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = ["ProgressHook", "progress_enabled"]

#: ``MONITORED_PROGRESS=0`` (or false/no/off) turns the installed display off.
ENV: Final = "MONITORED_PROGRESS"
_OFF: Final = frozenset({"0", "false", "no", "off"})

Mode = Literal["auto", "live", "plain", "off"]
MODES: Final = ("auto", "live", "plain", "off")


def progress_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``MONITORED_PROGRESS`` leaves the display on (it is on when unset)."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value.strip().lower() not in _OFF


def _interactive() -> bool:
    """Whether standard error is an interactive terminal, or this runs in Jupyter.

    Decided without importing ``rich`` (a tenth of a second at start-up), which is
    loaded only for the live display.
    """
    if "ipykernel" in sys.modules:
        return True
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def _notebook_display() -> bool:
    """Whether a live display can be redrawn in a notebook (it needs ``IPython.display``)."""
    try:
        return importlib.util.find_spec("IPython.display") is not None
    except (ImportError, ValueError):  # a module set to None, or without a spec
        return False


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "-:--:--"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _number(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.4g}"


@final
class ProgressHook:
    """Shows training progress on the chief; see the module docstring.

    Args:
        show: names of step outputs (or state entries) whose latest values are
            shown; fetched as ``monitored.optional`` only on refresh steps.
        every_n_steps: refresh every this many global steps (0: by time).
        refresh_secs: with ``every_n_steps=0``, seconds between refreshes of the
            live display.
        log_every_secs: seconds between plain lines when there is no terminal.
        total: the last global step, for the ETA (default: a ``StopAtStepHook``'s).
        mode: ``"auto"`` (live on a terminal or in Jupyter, plain lines
            elsewhere), ``"live"``, ``"plain"`` or ``"off"``.
        console: the ``rich`` console to draw on (default: standard error).
    """

    #: Passed in ``hooks=[...]``, it is the session's display: the installed
    #: ``progress`` plugin steps aside (one display).
    provides: ClassVar[frozenset[str]] = frozenset({"progress"})

    def __init__(
        self,
        show: Sequence[str] = (),
        every_n_steps: int = 0,
        refresh_secs: float = 0.2,
        log_every_secs: float = 30.0,
        total: int | None = None,
        mode: Mode = "auto",
        console: Console | None = None,
    ) -> None:
        where = "ProgressHook"
        if isinstance(show, str) or not all(isinstance(n, str) and n for n in show):
            raise ProgressConfigError(f"{where}: show must be a list of names, got {show!r}")
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 0
        ):
            raise ProgressConfigError(
                f"{where}: every_n_steps must be an integer >= 0, got {every_n_steps!r}"
            )
        for name, value in (("refresh_secs", refresh_secs), ("log_every_secs", log_every_secs)):
            if not isinstance(value, int | float) or not value > 0:
                raise ProgressConfigError(f"{where}: {name} must be positive, got {value!r}")
        if total is not None and (not isinstance(total, int) or total < 0):
            raise ProgressConfigError(f"{where}: total must be a step >= 0, got {total!r}")
        if mode not in MODES:
            raise ProgressConfigError(f"{where}: mode must be one of {MODES}, got {mode!r}")
        self.show = list(show)
        self.every_n_steps = every_n_steps
        self.refresh_secs = float(refresh_secs)
        self.log_every_secs = float(log_every_secs)
        self.total = total
        self.mode: Mode = mode
        self._console = console
        self._args = SessionRunArgs({name: optional(name) for name in self.show}) if show else None
        self._live = False
        self._on = False
        self._due = False
        self._next_time = math.inf
        self._next_step = -1
        self._start_time = 0.0
        self._start_step = 0
        self._last_time = 0.0
        self._last_step = 0
        self._rate = math.nan
        self._lines = 0
        #: The latest values of the ``show`` outputs and of reported metrics.
        self.values: dict[str, Any] = {}
        self.metrics: dict[str, Any] = {}
        self._savers: list[Any] = []
        self._saved = ""
        self._progress: Progress | None = None
        self._display: _Display | None = None
        self._task: Any = None

    # -- hooks ----------------------------------------------------------------------------------
    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        if self._on:  # a re-created session: the display goes on
            return
        mode = self.mode
        if mode == "auto":
            mode = "live" if self._console is not None or _interactive() else "plain"
        if mode == "off":
            return
        console = self._console
        if mode == "live" and console is None:
            console = _default_console()
        if self.mode == "auto" and console is not None:
            mode = "live" if console.is_terminal or console.is_jupyter else "plain"
        if mode == "live" and console is not None and console.is_jupyter:
            mode = "live" if _notebook_display() else "plain"
        self._console = console
        self._on = True
        self._live = mode == "live"
        if self.total is None:
            for info in session.plugins:
                if isinstance(info.plugin, StopAtStepHook) and info.plugin.last_step is not None:
                    self.total = info.plugin.last_step
        self._savers = [
            info.plugin for info in session.plugins if hasattr(info.plugin, "last_write")
        ]
        now = time.monotonic()
        step = session.state.global_step
        self._start_time = self._last_time = now
        self._start_step = self._last_step = step
        interval = self.refresh_secs if self._live else self.log_every_secs
        self._next_time = now + interval if not self.every_n_steps else math.inf
        n = self.every_n_steps
        self._next_step = (step // n + 1) * n if n else -1
        if self._live:
            self._start_live(console, step)
        coord.start_soon(self._close_when_done)

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        next_step = self._next_step
        if next_step >= 0:
            due = run_context.session.state.global_step + 1 >= next_step
        else:
            due = time.monotonic() >= self._next_time
        self._due = due
        return self._args if due else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if not self._due:
            return
        step = run_context.session.state.global_step
        now = time.monotonic()
        if self._next_step >= 0:
            n = self.every_n_steps
            self._next_step = (step // n + 1) * n
        else:
            self._next_time = now + (self.refresh_secs if self._live else self.log_every_secs)
        results = run_values.results
        if results:
            self.values.update((k, v) for k, v in results.items() if v is not None)
        self._refresh(step, now)

    def end(self, session: MonitoredSession) -> None:
        if not self._on:
            return
        step = session.state.global_step
        self._refresh(step, time.monotonic(), final=True)
        self._close()

    def report(self, metrics: Mapping[str, Any]) -> None:
        """Show ``metrics`` (evaluation results) from the next refresh on."""
        self.metrics.update(metrics)

    def after_evaluate(
        self, session: MonitoredSession, step: int, metrics: Mapping[str, Any]
    ) -> None:
        """Evaluation results reported in this session are shown as they arrive."""
        self.report(metrics)

    # -- drawing --------------------------------------------------------------------------------
    def _start_live(self, console: Console | None, step: int) -> None:
        assert console is not None
        display = _Display.on(console)
        self._display = display
        self._progress = display.progress
        self._task = display.progress.add_task(
            "train", total=self.total, completed=step, rate="", eta="-:--:--", values=""
        )

    def _refresh(self, step: int, now: float, *, final: bool = False) -> None:
        if now > self._last_time and step > self._last_step:
            self._rate = (step - self._last_step) / (now - self._last_time)
        self._last_time, self._last_step = now, step
        elapsed = now - self._start_time
        rate = self._rate
        if final and elapsed > 0:
            rate = (step - self._start_step) / elapsed
        eta = math.nan
        if self.total is not None and rate > 0:
            eta = max(self.total - step, 0) / rate
        for saver in self._savers:
            job = saver.last_write
            if job is not None and job.done.is_set() and job.error is None:
                self._saved = f"checkpoint {job.step}"
        shown = {**self.values, **self.metrics}
        values = " ".join(f"{k}={_number(to_host([v])[0])}" for k, v in shown.items())
        if self._saved:
            values = f"{values} {self._saved}".strip()
        rate_text = f"{rate:.3g} steps/s" if math.isfinite(rate) else "- steps/s"
        progress = self._progress
        if progress is not None:
            progress.update(
                self._task,
                completed=step,
                total=self.total,
                rate=rate_text,
                eta=_clock(eta),
                values=values,
            )
            display = self._display
            if display is not None:
                display.draw()
            return
        if final and not self._lines:
            return  # a short run without a terminal stays quiet
        self._lines += 1
        where = f"step {step}" if self.total is None else f"step {step}/{self.total}"
        parts = [where, rate_text, f"elapsed {_clock(elapsed)}"]
        if self.total is not None:
            parts.append(f"ETA {_clock(eta)}")
        if values:
            parts.append(values)
        file = self._console.file if self._console is not None else sys.stderr
        file.write(("done: " if final else "") + "  ".join(parts) + "\n")
        file.flush()

    async def _close_when_done(self) -> None:
        """Stop the live display and give logging its streams back, however the session ends."""
        try:
            await anyio.sleep_forever()
        finally:
            self._close()

    def _close(self) -> None:
        self._on = False
        self._progress = None
        display, self._display = self._display, None
        if display is not None:
            display.leave(self._task)


#: How a notebook shows the bars: rich's own notebook style (monospace, no wrapping).
_NOTEBOOK_HTML: Final = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">{code}</pre>"
)

#: The console of live displays given none: one per process, so that sessions running
#: at once share one live display (rich allows one per console).
_console: Console | None = None


def _default_console() -> Console:
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True)
    return _console


@final
class _Display:
    """The one live display of a console, shared by the sessions drawing on it: a line each.

    rich draws one live display per console at a time (a second is a
    ``LiveError``), and two would overwrite each other's lines anyway. So the
    first live ``ProgressHook`` on a console starts it, each one adds its line
    (a task of one ``Progress``) and removes it when its session ends, and the
    last one stops it and gives logging its streams back. Kept in a module-level
    table by console: shared on purpose, safe for sessions in one event loop
    (it is only touched from the loop's thread).
    """

    __slots__ = ("handle", "progress", "streams", "tasks")

    _open: ClassVar[dict[int, _Display]] = {}

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks = 0
        #: In a notebook: the handle of the output the bars are drawn in (None until drawn).
        self.handle: Any = None
        self.streams: list[tuple[logging.StreamHandler[Any], IO[str]]] = []

    @classmethod
    def on(cls, console: Console) -> _Display:
        """The display of ``console``, started if none is open; one more line is counted."""
        display = cls._open.get(id(console))
        if display is None:
            display = cls._start(console)
            cls._open[id(console)] = display
        display.tasks += 1
        return display

    @staticmethod
    def _start(console: Console) -> _Display:
        from rich.file_proxy import FileProxy
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = [
            TextColumn("[bold]step {task.completed:.0f}[/]"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[values]}"),
        ]
        progress = Progress(
            *columns,
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        if not console.is_jupyter:
            progress.start()
        display = _Display(progress)
        # Log records print above the bars through the same console, never through them.
        for logger in (logging.getLogger(), logging.getLogger("monitored")):
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream in (
                    sys.stderr,
                    sys.stdout,
                    sys.__stderr__,
                    sys.__stdout__,
                ):
                    old = handler.setStream(FileProxy(console, handler.stream))
                    if old is not None:
                        display.streams.append((handler, old))
        return display

    def draw(self) -> None:
        """Redraw the bars: on a terminal through rich's live display, in a notebook in place.

        In a notebook the bars are one output updated by its display id
        (``update_display_data``, IOPub only), not rich's ``ipywidgets.Output``: a
        widget's front end answers every redraw with a ``comm_msg`` on the kernel's
        shell channel, and one that lands as the cell's ``execute_reply`` is sent can
        strand that reply in ``ipykernel`` 7, so ``nbconvert --execute`` (whose
        ``nbclient`` mimics the widget) waited for ever.
        """
        progress = self.progress
        console = progress.console
        if not console.is_jupyter:
            progress.refresh()
            return
        from IPython.display import display
        from rich.console import Console

        record = Console(
            file=io.StringIO(),
            record=True,
            width=console.width,
            color_system="truecolor",
            force_jupyter=False,
        )
        record.print(progress.get_renderable())
        data = {
            "text/html": record.export_html(
                inline_styles=True, code_format=_NOTEBOOK_HTML, clear=False
            ),
            "text/plain": record.export_text(),
        }
        if self.handle is None:
            self.handle = display(data, raw=True, display_id=True)  # type: ignore[no-untyped-call]
        else:
            self.handle.update(data, raw=True)

    def leave(self, task: Any) -> None:
        """Remove one session's line; the last one out stops the display."""
        self.tasks -= 1
        if self.tasks > 0:
            self.progress.remove_task(task)
            self.draw()
            return
        if not self.progress.console.is_jupyter:
            self.progress.stop()
        for handler, stream in reversed(self.streams):
            handler.setStream(stream)
        self.streams.clear()
        for key, display in list(self._open.items()):
            if display is self:
                del self._open[key]
