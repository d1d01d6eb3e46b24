"""MonitoredSession.delegate_step_hooks: a plugin's per-step calls made to its hook object."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import Recorder, counting_step

import monitored
from monitored import PluginError, TrainState


class Plugin:
    """A plugin keeping one hook object per session, as installed plugins do."""

    plugin_name = "mine"

    def __init__(self, log: list[Any], delegate: object | None) -> None:
        self.log = log
        self.delegate = delegate

    def begin(self, session: monitored.MonitoredSession) -> None:
        session.delegate_step_hooks("mine", self.delegate)

    def before_run(self, run_context: monitored.SessionRunContext) -> None:
        self.log.append(("mine", "before_run"))

    def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> None:
        self.log.append(("mine", "after_run"))

    def end(self, session: monitored.MonitoredSession) -> None:
        self.log.append(("mine", "end"))


class Delegate:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        self.log.append(("delegate", "before_run"))
        return monitored.SessionRunArgs("global_step")

    async def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> None:
        self.log.append(("delegate", "after_run", int(run_values.results)))


async def test_the_delegate_is_called_at_the_plugins_place_and_its_other_hooks_stay(
    state: TrainState, log: list[Any]
) -> None:
    hooks = [Recorder("a", log), Plugin(log, Delegate(log)), Recorder("b", log)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        log.clear()
        await sess.run(counting_step)
        assert log == [
            ("a", "before_run"),
            ("delegate", "before_run"),
            ("b", "before_run"),
            ("a", "after_run"),
            ("delegate", "after_run", 1),  # its fetch answered, its async method awaited
            ("b", "after_run"),
        ]
        log.clear()
    assert ("mine", "end") in log


async def test_none_leaves_the_plugin_out_of_every_step(state: TrainState, log: list[Any]) -> None:
    hooks = [Recorder("a", log), Plugin(log, None)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        log.clear()
        await sess.run(counting_step)
        assert log == [("a", "before_run"), ("a", "after_run")]
        assert sess.implements("before_run")  # the plugin still declares the hook


async def test_a_delegate_without_an_event_leaves_that_event_uncalled(
    state: TrainState, log: list[Any]
) -> None:
    class BeforeOnly:
        def before_run(self, run_context: monitored.SessionRunContext) -> None:
            log.append(("delegate", "before_run"))

    async with monitored.MonitoredSession(state, hooks=[Plugin(log, BeforeOnly())]) as sess:
        log.clear()
        await sess.run(counting_step)
    assert log[:1] == [("delegate", "before_run")]
    assert ("mine", "after_run") not in log


async def test_an_unknown_plugin_is_an_error_naming_it_and_the_plugins(state: TrainState) -> None:
    async with monitored.MonitoredSession(state, hooks=[Recorder("a", [])]) as sess:
        with pytest.raises(PluginError, match=r"no plugin 'nope' in this session \(plugins: ") as e:
            sess.delegate_step_hooks("nope", None)
    assert e.value.plugin == "nope"


async def test_a_delegate_method_of_the_wrong_signature_is_an_error(
    state: TrainState, log: list[Any]
) -> None:
    class Wrong:
        def after_run(self) -> None:
            """Takes none of the spec's arguments."""

    with pytest.raises(PluginError, match=r"Wrong\.after_run of plugin 'mine' must take") as e:
        async with monitored.MonitoredSession(state, hooks=[Plugin(log, Wrong())]):
            pass
    assert (e.value.plugin, e.value.hook) == ("mine", "after_run")


def test_delegating_needs_an_entered_session() -> None:
    with pytest.raises(RuntimeError, match="not been entered"):
        monitored.MonitoredSession().delegate_step_hooks("mine", None)
