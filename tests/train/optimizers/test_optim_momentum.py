"""MomentumOptimizer (heavy ball and Nesterov) against TF1's documented rule in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import MomentumOptimizer

LR, MU = 0.05, 0.9


def _reference(nesterov: bool) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        accum = slots["momentum"]
        accum[...] = MU * accum + g
        if nesterov:
            w -= LR * g + LR * MU * accum
        else:
            w -= LR * accum

    return step


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], sparse: str | None, dtype: type, nesterov: bool
) -> None:
    check_trajectory(
        lambda: MomentumOptimizer(LR, MU, use_nesterov=nesterov),
        _reference(nesterov),
        {"momentum": 0.0},
        sparse=sparse,
        dtype=dtype,
    )


def test_constant_gradient_closed_form() -> None:
    # accum_t = g (1 - mu^t) / (1 - mu); w_t = -lr g sum_k (1 - mu^k) / (1 - mu)
    state = TrainState({"w": np.zeros(3)})
    g = np.array([1.0, -1.0, 2.0])
    opt = MomentumOptimizer(LR, MU)
    for _ in range(30):
        opt.apply_gradients(state, {"w": g})
    k = np.arange(1, 31)
    expected = -LR * g * np.sum((1 - MU**k) / (1 - MU))
    np.testing.assert_allclose(state["w"], expected, rtol=1e-12)
    np.testing.assert_allclose(state["w/Momentum/momentum"], g * (1 - MU**30) / (1 - MU))


def test_use_nesterov_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="use_nesterov"):
        MomentumOptimizer(0.1, 0.9, use_nesterov=1)  # type: ignore[arg-type]
