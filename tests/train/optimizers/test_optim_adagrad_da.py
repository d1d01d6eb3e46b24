"""AdagradDAOptimizer against TF1's ApplyAdagradDA with T = global_step + 1, in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import AdagradDAOptimizer

LR, INIT = 0.5, 0.1


def _reference(l1: float, l2: float) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        gacc, gsq = slots["gradient_accumulator"], slots["gradient_squared_accumulator"]
        gacc += g
        gsq += g * g
        shrunk = np.sign(gacc) * np.maximum(np.abs(gacc) - l1 * t, 0.0)
        w[...] = -LR * shrunk / (l2 * t * LR + np.sqrt(gsq))

    return step


@pytest.mark.parametrize(("l1", "l2"), [(0.0, 0.0), (0.01, 0.2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState],
    sparse: str | None,
    dtype: type,
    l1: float,
    l2: float,
) -> None:
    check_trajectory(
        lambda: AdagradDAOptimizer(LR, INIT, l1, l2),
        _reference(l1, l2),
        {"gradient_accumulator": 0.0, "gradient_squared_accumulator": INIT},
        sparse=sparse,
        dtype=dtype,
    )


def test_matches_tf1_unit_test_values() -> None:
    """TF1's adagrad_da_test: one step from [1, 2] and [4, 3] with learning rate 3."""
    state = TrainState(
        {"v0": np.array([1.0, 2.0], np.float32), "v1": np.array([4.0, 3.0], np.float32)}
    )
    AdagradDAOptimizer(3.0).apply_gradients(
        state,
        {"v0": np.array([0.1, 0.2], np.float32), "v1": np.array([0.01, 0.02], np.float32)},
    )
    np.testing.assert_allclose(state["v0"], [-0.904534, -1.603567], rtol=1e-5)
    np.testing.assert_allclose(state["v1"], [-0.094821, -0.189358], rtol=1e-5)


def test_uses_the_state_global_step() -> None:
    state = TrainState({"w": np.zeros(1)}, global_step=9)
    AdagradDAOptimizer(1.0, 1.0, l1_regularization_strength=0.1).apply_gradients(
        state, {"w": np.array([0.5])}
    )
    # T = 10: |g_acc| - l1 T = 0.5 - 1.0 < 0, so the weight is exactly zero.
    assert state["w"][0] == 0.0
    assert state.global_step == 10
