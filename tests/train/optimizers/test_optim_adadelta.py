"""AdadeltaOptimizer against Zeiler's rule as TF1 writes it, in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import AdadeltaOptimizer

LR, RHO, EPS = 0.5, 0.9, 1e-6


def reference(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
    acc, acc_up = slots["accum"], slots["accum_update"]
    acc[...] = RHO * acc + (1 - RHO) * g * g
    update = np.sqrt(acc_up + EPS) / np.sqrt(acc + EPS) * g
    w -= LR * update
    acc_up[...] = RHO * acc_up + (1 - RHO) * update * update


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], sparse: str | None, dtype: type
) -> None:
    check_trajectory(
        lambda: AdadeltaOptimizer(LR, rho=RHO, epsilon=EPS),
        reference,
        {"accum": 0.0, "accum_update": 0.0},
        sparse=sparse,
        dtype=dtype,
    )


def test_tf1_defaults() -> None:
    opt = AdadeltaOptimizer()
    assert opt.learning_rate == 0.001
    assert (
        repr(opt)
        == "AdadeltaOptimizer(learning_rate=0.001, rho=0.95, epsilon=1e-08, name='Adadelta')"
    )


@pytest.mark.parametrize("rho", [-0.1, 1.5])
def test_rho_must_be_in_unit_interval(rho: float) -> None:
    with pytest.raises(ValueError, match="rho"):
        AdadeltaOptimizer(rho=rho)


def test_epsilon_must_be_positive() -> None:
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        AdadeltaOptimizer(epsilon=0.0)
