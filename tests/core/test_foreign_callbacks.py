"""A hook object's methods named after other frameworks' callbacks are said, not ignored."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import monitored
from monitored._core._foreign_callbacks import FOREIGN_CALLBACKS
from monitored._core._plugins import _SPEC_NAMES


class Ported:
    """A callback half ported: ``before_run`` renamed, ``on_step_end`` not."""

    def before_run(self, run_context: Any) -> None:
        return None

    def on_step_end(self, args: Any, state: Any, control: Any) -> None:
        raise AssertionError("never called")

    def on_train_batch_end(self, batch: Any, logs: Any = None) -> None:
        raise AssertionError("never called")


def step(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(1.0)}


async def test_a_hook_with_a_real_hook_and_foreign_callbacks_warns_naming_each_and_its_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="monitored"):
        async with monitored.MonitoredSession(hooks=[Ported()]) as sess:
            await sess.run(step)
    warnings = [r.getMessage() for r in caplog.records if "another framework" in r.getMessage()]
    assert len(warnings) == 1
    assert "'on_step_end' (the closest hook: 'after_run')" in warnings[0]
    assert "'on_train_batch_end' (the closest hook: 'after_run')" in warnings[0]
    assert "Ported" in warnings[0]


async def test_a_hook_with_only_foreign_callbacks_is_refused_naming_the_hook_to_use() -> None:
    class OnlyKeras:
        def on_train_begin(self, logs: Any = None) -> None: ...

    with pytest.raises(
        monitored.PluginValidationError,
        match="'on_train_begin' is another framework's, use 'begin'",
    ):
        async with monitored.MonitoredSession(hooks=[OnlyKeras()]):
            pass


async def test_a_hook_without_foreign_names_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    class Plain:
        def after_run(self, run_context: Any, run_values: Any) -> None: ...

        def helper(self) -> None: ...

    with caplog.at_level(logging.WARNING, logger="monitored"):
        async with monitored.MonitoredSession(hooks=[Plain()]) as sess:
            await sess.run(step)
    assert not [r for r in caplog.records if "another framework" in r.getMessage()]


def test_every_closest_hook_is_a_hook_and_no_foreign_name_is_one() -> None:
    assert set(FOREIGN_CALLBACKS.values()) <= _SPEC_NAMES
    assert not set(FOREIGN_CALLBACKS) & _SPEC_NAMES
