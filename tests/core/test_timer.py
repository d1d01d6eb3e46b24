"""SecondOrStepTimer."""

from __future__ import annotations

import time

import pytest

from monitored import SecondOrStepTimer


def test_validation() -> None:
    with pytest.raises(ValueError, match="Either every_secs or every_steps should be provided."):
        SecondOrStepTimer()
    with pytest.raises(ValueError, match="Can not provide both every_secs and every_steps."):
        SecondOrStepTimer(every_secs=1, every_steps=1)
    with pytest.raises(ValueError, match="every_steps must be positive"):
        SecondOrStepTimer(every_steps=0)
    with pytest.raises(ValueError, match="every_secs must be positive"):
        SecondOrStepTimer(every_secs=-1)


def test_steps() -> None:
    timer = SecondOrStepTimer(every_steps=3)
    assert timer.should_trigger_for_step(0)
    assert timer.update_last_triggered_step(0) == (None, None)
    assert timer.last_triggered_step() == 0
    assert not timer.should_trigger_for_step(0)
    assert not timer.should_trigger_for_step(2)
    assert timer.should_trigger_for_step(3)
    secs, steps = timer.update_last_triggered_step(3)
    assert steps == 3
    assert secs is not None
    assert secs >= 0
    timer.reset()
    assert timer.should_trigger_for_step(4)


def test_seconds() -> None:
    timer = SecondOrStepTimer(every_secs=0.05)
    timer.update_last_triggered_step(0)
    assert not timer.should_trigger_for_step(1)
    time.sleep(0.06)
    assert timer.should_trigger_for_step(1)
