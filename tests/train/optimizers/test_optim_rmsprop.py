"""RMSPropOptimizer (plain and centered) against TF1's documented rule in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import RMSPropOptimizer

LR, DECAY, MU, EPS = 0.01, 0.85, 0.5, 1e-6


def _reference(centered: bool) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        ms, mom = slots["rms"], slots["momentum"]
        ms[...] = DECAY * ms + (1 - DECAY) * g * g
        denominator = ms + EPS
        if centered:
            mg = slots["mg"]
            mg[...] = DECAY * mg + (1 - DECAY) * g
            denominator = ms - mg * mg + EPS
        mom[...] = MU * mom + LR * g / np.sqrt(denominator)
        w -= mom

    return step


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], sparse: str | None, dtype: type, centered: bool
) -> None:
    slots = {"rms": 1.0, "momentum": 0.0} | ({"mg": 0.0} if centered else {})
    check_trajectory(
        lambda: RMSPropOptimizer(LR, DECAY, MU, EPS, centered=centered),
        _reference(centered),
        slots,
        sparse=sparse,
        dtype=dtype,
    )


def test_mean_square_starts_at_one_as_in_tf1() -> None:
    state = TrainState({"w": np.zeros(2, dtype=np.float32)})
    opt = RMSPropOptimizer(0.1)
    opt.create_slots(state)
    np.testing.assert_array_equal(state["w/RMSProp/rms"], np.ones(2, dtype=np.float32))
    assert opt.get_slot_names() == ["momentum", "rms"]
    assert RMSPropOptimizer(0.1, centered=True).get_slot_names() == ["mg", "momentum", "rms"]


def test_checks_arguments() -> None:
    with pytest.raises(ValueError, match="decay must be <= 1"):
        RMSPropOptimizer(0.1, decay=1.5)
    with pytest.raises(ValueError, match="momentum must be >= 0"):
        RMSPropOptimizer(0.1, momentum=-1.0)
    with pytest.raises(TypeError, match="centered"):
        RMSPropOptimizer(0.1, centered="yes")  # type: ignore[arg-type]
