"""GradientDescentOptimizer against ``w -= lr * g`` in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import GradientDescentOptimizer, IndexedSlices
from monitored.train.schedules import exponential_decay


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], sparse: str | None, dtype: type
) -> None:
    def reference(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        w -= 0.1 * g

    check_trajectory(
        lambda: GradientDescentOptimizer(0.1), reference, {}, sparse=sparse, dtype=dtype
    )


def test_schedule_is_evaluated_at_the_global_step_before_the_increment(
    check_trajectory: Callable[..., TrainState],
) -> None:
    def reference(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        w -= 0.2 * 0.5 ** ((t - 1) / 5) * g

    schedule = exponential_decay(0.2, 5, 0.5)
    check_trajectory(lambda: GradientDescentOptimizer(schedule), reference, {})


def test_constant_gradient_closed_form() -> None:
    state = TrainState({"w": np.zeros(4, dtype=np.float32)})
    opt = GradientDescentOptimizer(0.25)
    g = np.array([1.0, -2.0, 0.5, 0.0], dtype=np.float32)
    for _ in range(20):
        opt.apply_gradients(state, [(g, "w")])
    np.testing.assert_array_equal(state["w"], -20 * 0.25 * g)  # exact in binary


def test_float16_is_preserved() -> None:
    state = TrainState({"w": np.ones(5, dtype=np.float16)})
    GradientDescentOptimizer(0.5).apply_gradients(state, {"w": np.ones(5, dtype=np.float16)})
    assert state["w"].dtype == np.float16
    np.testing.assert_array_equal(state["w"], np.full(5, 0.5, dtype=np.float16))


def test_sparse_update_sums_duplicate_rows() -> None:
    state = TrainState({"emb": np.zeros((4, 2), dtype=np.float32)})
    grad = IndexedSlices(np.ones((3, 2), dtype=np.float32), np.array([2, 0, 2]))
    GradientDescentOptimizer(1.0).apply_gradients(state, {"emb": grad})
    np.testing.assert_array_equal(state["emb"], [[-1, -1], [0, 0], [-2, -2], [0, 0]])
