"""``SecondOrStepTimer``: fire every N seconds or every N steps (TF1's)."""

from __future__ import annotations

import time
from typing import final

__all__ = ["SecondOrStepTimer"]


@final
class SecondOrStepTimer:
    """Triggers once every ``every_secs`` seconds or once every ``every_steps`` steps.

    Exactly one of the two is given. The first call of
    :meth:`should_trigger_for_step` always triggers.
    """

    __slots__ = ("_every_secs", "_every_steps", "_last_step", "_last_time")

    def __init__(self, every_secs: float | None = None, every_steps: int | None = None) -> None:
        if every_secs is None and every_steps is None:
            raise ValueError("Either every_secs or every_steps should be provided.")
        if every_secs is not None and every_steps is not None:
            raise ValueError("Can not provide both every_secs and every_steps.")
        if every_secs is not None and every_secs <= 0:
            raise ValueError(f"every_secs must be positive, got {every_secs}")
        if every_steps is not None and every_steps <= 0:
            raise ValueError(f"every_steps must be positive, got {every_steps}")
        self._every_secs = every_secs
        self._every_steps = every_steps
        self._last_time: float | None = None
        self._last_step: int | None = None

    def reset(self) -> None:
        """Forget the last trigger: the next check triggers."""
        self._last_time = None
        self._last_step = None

    def should_trigger_for_step(self, step: int) -> bool:
        """Whether the timer fires at ``step`` (never twice for the same step)."""
        if self._last_step is None:
            return True
        if self._last_step == step:
            return False
        if self._every_secs is not None:
            assert self._last_time is not None
            return time.monotonic() >= self._last_time + self._every_secs
        assert self._every_steps is not None
        return step >= self._last_step + self._every_steps

    def update_last_triggered_step(self, step: int) -> tuple[float | None, int | None]:
        """Record a trigger at ``step``; return seconds and steps since the previous."""
        now = time.monotonic()
        if self._last_time is None or self._last_step is None:
            elapsed: tuple[float | None, int | None] = (None, None)
        else:
            elapsed = (now - self._last_time, step - self._last_step)
        self._last_time = now
        self._last_step = step
        return elapsed

    def last_triggered_step(self) -> int | None:
        """The step of the last trigger, or ``None``."""
        return self._last_step
