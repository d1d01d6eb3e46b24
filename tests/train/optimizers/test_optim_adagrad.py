"""AdagradOptimizer against ``accum += g^2; w -= lr g / sqrt(accum)`` in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import AdagradOptimizer

LR = 0.3


def reference(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
    acc = slots["accumulator"]
    acc += g * g
    w -= LR * g / np.sqrt(acc)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], sparse: str | None, dtype: type
) -> None:
    check_trajectory(
        lambda: AdagradOptimizer(LR, initial_accumulator_value=0.2),
        reference,
        {"accumulator": 0.2},
        sparse=sparse,
        dtype=dtype,
    )


def test_constant_gradient_closed_form() -> None:
    # accum_t = a0 + t g^2, w_t = -lr g sum_k 1 / sqrt(a0 + k g^2)
    state = TrainState({"w": np.zeros(2)})
    g = np.array([0.5, -3.0])
    opt = AdagradOptimizer(LR)
    for _ in range(20):
        opt.apply_gradients(state, {"w": g})
    k = np.arange(1, 21)[:, None]
    expected = -LR * np.sum(g / np.sqrt(0.1 + k * g * g), axis=0)
    np.testing.assert_allclose(state["w"], expected, rtol=1e-12)


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_initial_accumulator_value_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="initial_accumulator_value must be > 0"):
        AdagradOptimizer(0.1, initial_accumulator_value=value)
