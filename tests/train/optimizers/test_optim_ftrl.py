"""FtrlOptimizer against FTRL-Proximal (McMahan et al. 2013, TF1's ApplyFtrlV2) in float64."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import FtrlOptimizer

LR, L1, L2, SHRINK, INIT = 0.3, 0.05, 0.1, 0.02, 0.1


def _reference(power: float, l1: float, shrink: float) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        accum, linear = slots["accum"], slots["linear"]
        new_accum = accum + g * g
        sigma = (new_accum ** (-power) - accum ** (-power)) / LR
        linear += g + 2 * shrink * w - sigma * w
        quadratic = new_accum ** (-power) / LR + 2 * L2
        w[...] = np.where(np.abs(linear) > l1, (np.sign(linear) * l1 - linear) / quadratic, 0.0)
        accum[...] = new_accum

    return step


@pytest.mark.parametrize(
    ("power", "l1", "shrink"), [(-0.5, L1, 0.0), (-0.5, 0.0, SHRINK), (-0.3, L1, SHRINK)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
def test_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState],
    sparse: str | None,
    dtype: type,
    power: float,
    l1: float,
    shrink: float,
) -> None:
    check_trajectory(
        lambda: FtrlOptimizer(
            LR,
            learning_rate_power=power,
            initial_accumulator_value=INIT,
            l1_regularization_strength=l1,
            l2_regularization_strength=L2,
            l2_shrinkage_regularization_strength=shrink,
        ),
        _reference(power, l1, shrink),
        {"accum": INIT, "linear": 0.0},
        sparse=sparse,
        dtype=dtype,
    )


def test_strong_l1_zeroes_the_weights() -> None:
    state = TrainState({"w": np.ones(4, dtype=np.float32)})
    opt = FtrlOptimizer(0.1, l1_regularization_strength=10.0)
    opt.apply_gradients(state, {"w": np.full(4, 0.1, dtype=np.float32)})
    np.testing.assert_array_equal(state["w"], np.zeros(4, dtype=np.float32))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"learning_rate_power": 0.5}, "learning_rate_power must be <= 0"),
        ({"initial_accumulator_value": -0.1}, "initial_accumulator_value must be >= 0"),
        ({"l1_regularization_strength": -1.0}, "l1_regularization_strength"),
        ({"l2_regularization_strength": -1.0}, "l2_regularization_strength"),
        ({"l2_shrinkage_regularization_strength": -1.0}, "l2_shrinkage"),
    ],
)
def test_arguments_are_checked_as_tf1_does(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FtrlOptimizer(0.1, **kwargs)


def test_learning_rate_must_stay_positive() -> None:
    with pytest.raises(ValueError, match="learning_rate must be positive"):
        FtrlOptimizer(0.0)
    state = TrainState({"w": np.ones(2)}, global_step=3)
    opt = FtrlOptimizer(lambda step: 0.0)
    with pytest.raises(ValueError, match="learning rate is 0 at global step 3"):
        opt.apply_gradients(state, {"w": np.ones(2)})
    np.testing.assert_array_equal(state["w"], np.ones(2))
    assert state.global_step == 3


def test_zero_accumulator_without_l2_gives_zero_not_nan() -> None:
    state = TrainState({"w": np.ones(3, dtype=np.float32)})
    opt = FtrlOptimizer(0.1, initial_accumulator_value=0.0)
    opt.apply_gradients(state, {"w": np.array([0.0, 1.0, -2.0], dtype=np.float32)})
    assert state["w"][0] == 0.0  # TF1's select: 0 where the accumulator is 0
    np.testing.assert_allclose(state["w"][1:], [0.9, 1.1], rtol=1e-6)  # w - lr g / |g|


def test_zero_accumulator_with_shrinkage_follows_tf1s_select() -> None:
    import numpy as np

    from monitored import TrainState
    from monitored.train.optimizers import FtrlOptimizer

    state = TrainState({"w": np.array([1.0, 0.0])})
    opt = FtrlOptimizer(
        0.1, initial_accumulator_value=0.0, l2_shrinkage_regularization_strength=0.1
    )
    opt.apply_gradients(state, {"w": np.zeros(2)})
    # linear = 2 * 0.1 * w: -0.2 / 0 = -inf where w was 1; 0 (not NaN) where w was 0
    assert state["w"][0] == -np.inf
    assert state["w"][1] == 0.0
