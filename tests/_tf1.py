"""Helpers shared by the TF1 ports: a fake clock, summary sinks, simple steps."""

from __future__ import annotations

from typing import Any

import numpy as np

import monitored
from monitored import TrainState

#: TF's realistic start time for tests that mock the clock.
MOCK_START_TIME = 1484695987.209386


class FakeClock:
    """Stands in for the ``time`` module of ``monitored._core._timer``: ``value`` is now."""

    def __init__(self, start: float = MOCK_START_TIME) -> None:
        self.value = start

    def monotonic(self) -> float:
        return self.value

    def time(self) -> float:
        return self.value

    def perf_counter(self) -> float:
        return self.value


class SummarySink:
    """A ``write_summaries`` plugin that keeps what it gets, by step (TF's fake writer)."""

    def __init__(self) -> None:
        self.summaries: dict[int, dict[str, Any]] = {}

    def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
        self.summaries.setdefault(step, {}).update(summaries)


def do_step(state: TrainState) -> dict[str, Any]:
    """TF's ``assign_add(global_step, 1)``: returns the new global step."""
    state.global_step += 1
    return {"global_step": state.global_step}


def step_by(n: int) -> Any:
    def step(state: TrainState) -> dict[str, Any]:
        state.global_step += n
        return {"global_step": state.global_step}

    return step


def constant_step(**outputs: Any) -> Any:
    """A step that returns constants (TF: running constant tensors) and counts."""

    def step(state: TrainState, **feeds: Any) -> dict[str, Any]:
        state.global_step += 1
        return {name: np.asarray(value) for name, value in outputs.items()}

    return step


def session(state: TrainState | None = None, **kwargs: Any) -> monitored.MonitoredSession:
    return monitored.MonitoredSession(state if state is not None else TrainState(), **kwargs)
