"""Proximal gradient descent and proximal Adagrad (FOBOS) against float64 references."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import ProximalAdagradOptimizer, ProximalGradientDescentOptimizer

LR, INIT = 0.2, 0.1


def _shrink(p: np.ndarray, threshold: np.ndarray | float) -> np.ndarray:
    return np.sign(p) * np.maximum(np.abs(p) - threshold, 0.0)


def _proximal_gd(l1: float, l2: float) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        w[...] = _shrink(w - LR * g, LR * l1) / (1 + LR * l2)

    return step


def _proximal_adagrad(l1: float, l2: float) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        acc = slots["accumulator"]
        acc += g * g
        rate = LR / np.sqrt(acc)
        w[...] = _shrink(w - rate * g, rate * l1) / (1 + rate * l2)

    return step


REGULARIZATION = [(0.0, 0.0), (0.05, 0.0), (0.0, 0.3), (0.05, 0.3)]


@pytest.mark.parametrize(("l1", "l2"), REGULARIZATION)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_proximal_gd_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState],
    sparse: str | None,
    dtype: type,
    l1: float,
    l2: float,
) -> None:
    check_trajectory(
        lambda: ProximalGradientDescentOptimizer(LR, l1, l2),
        _proximal_gd(l1, l2),
        {},
        sparse=sparse,
        dtype=dtype,
    )


@pytest.mark.parametrize(("l1", "l2"), REGULARIZATION)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_proximal_adagrad_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState],
    sparse: str | None,
    dtype: type,
    l1: float,
    l2: float,
) -> None:
    check_trajectory(
        lambda: ProximalAdagradOptimizer(LR, INIT, l1, l2),
        _proximal_adagrad(l1, l2),
        {"accumulator": INIT},
        sparse=sparse,
        dtype=dtype,
    )


def test_l1_shrinkage_makes_exact_zeros() -> None:
    state = TrainState({"w": np.array([0.05, -0.05, 2.0], dtype=np.float32)})
    ProximalGradientDescentOptimizer(1.0, l1_regularization_strength=0.1).apply_gradients(
        state, {"w": np.zeros(3, dtype=np.float32)}
    )
    np.testing.assert_array_equal(state["w"], np.array([0.0, 0.0, 1.9], dtype=np.float32))


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="l1_regularization_strength"):
        ProximalGradientDescentOptimizer(0.1, -1.0)
    with pytest.raises(ValueError, match="initial_accumulator_value must be > 0"):
        ProximalAdagradOptimizer(0.1, 0.0)
