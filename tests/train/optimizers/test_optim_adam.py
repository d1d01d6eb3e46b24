"""Adam, lazy Adam and AdamW against Kingma & Ba's bias-corrected rule in float64.

TF1's sparse Adam is dense-equivalent: the reference is the dense rule fed the
densified gradient. Lazy Adam touches only the given rows. AdamW (TF1 contrib)
subtracts ``weight_decay * w`` first, from the given rows only when sparse.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import (
    AdamOptimizer,
    AdamWOptimizer,
    IndexedSlices,
    LazyAdamOptimizer,
)

LR, B1, B2, EPS, WD = 0.01, 0.8, 0.95, 1e-7, 0.02


def _adam(weight_decay: float = 0.0) -> Callable[..., None]:
    def step(w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int) -> None:
        m, v = slots["m"], slots["v"]
        w -= weight_decay * w
        m[...] = B1 * m + (1 - B1) * g
        v[...] = B2 * v + (1 - B2) * g * g
        lr_t = LR * np.sqrt(1 - B2**t) / (1 - B1**t)
        w -= lr_t * m / (np.sqrt(v) + EPS)

    return step


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "dense_equivalent"])
def test_adam_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], sparse: str | None, dtype: type
) -> None:
    state = check_trajectory(
        lambda: AdamOptimizer(LR, B1, B2, EPS),
        _adam(),
        {"m": 0.0, "v": 0.0},
        sparse=sparse,
        dtype=dtype,
    )
    # TF1's beta1_power / beta2_power: beta ** (steps + 1) after `steps` steps.
    np.testing.assert_allclose(state["Adam/beta1_power"], B1**26, rtol=1e-12)
    np.testing.assert_allclose(state["Adam/beta2_power"], B2**26, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [None, "rows"])
@pytest.mark.parametrize(
    "make",
    [lambda: LazyAdamOptimizer(LR, B1, B2, EPS), lambda: AdamOptimizer(LR, B1, B2, EPS, lazy=True)],
)
def test_lazy_adam_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState],
    sparse: str | None,
    dtype: type,
    make: Callable[[], AdamOptimizer],
) -> None:
    check_trajectory(make, _adam(), {"m": 0.0, "v": 0.0}, sparse=sparse, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_dense_trajectory_matches_reference(
    check_trajectory: Callable[..., TrainState], dtype: type
) -> None:
    check_trajectory(
        lambda: AdamWOptimizer(WD, LR, B1, B2, EPS), _adam(WD), {"m": 0.0, "v": 0.0}, dtype=dtype
    )


@pytest.mark.parametrize("lazy", [False, True])
def test_adamw_sparse_decays_only_the_given_rows(lazy: bool, helpers: SimpleNamespace) -> None:
    shape = helpers.SHAPE
    state = TrainState({"w": helpers.initial_value(np.float32)})
    opt = AdamWOptimizer(WD, LR, B1, B2, EPS, lazy=lazy)
    w = helpers.initial_value(np.float64)
    m, v = np.zeros(shape), np.zeros(shape)
    for t, grad in enumerate(helpers.sparse_gradients(np.float32), start=1):
        opt.apply_gradients(state, {"w": grad})
        rows, values = helpers.summed_rows(grad)
        w[rows] -= WD * w[rows]
        lr_t = LR * np.sqrt(1 - B2**t) / (1 - B1**t)
        if lazy:
            m[rows] = B1 * m[rows] + (1 - B1) * values
            v[rows] = B2 * v[rows] + (1 - B2) * values**2
            w[rows] -= lr_t * m[rows] / (np.sqrt(v[rows]) + EPS)
        else:
            dense = np.zeros(shape)
            dense[rows] = values
            m = B1 * m + (1 - B1) * dense
            v = B2 * v + (1 - B2) * dense**2
            w -= lr_t * m / (np.sqrt(v) + EPS)
        np.testing.assert_allclose(state["w"], w, rtol=2e-5, atol=2e-6, err_msg=f"step {t}")
        np.testing.assert_allclose(state["w/AdamW/m"], m, rtol=2e-5, atol=2e-6)


def test_sparse_adam_moves_rows_without_gradient() -> None:
    """The dense-equivalent rule keeps moving rows whose moments are non-zero."""
    state = TrainState({"w": np.zeros((3, 2), dtype=np.float32)})
    opt = AdamOptimizer(0.1)
    one_row = IndexedSlices(np.ones((1, 2), dtype=np.float32), [0])
    other_row = IndexedSlices(np.ones((1, 2), dtype=np.float32), [1])
    opt.apply_gradients(state, {"w": one_row})
    after_first = state["w"][0].copy()
    opt.apply_gradients(state, {"w": other_row})
    assert np.all(state["w"][0] < after_first)  # row 0 moved again with no gradient
    assert np.all(state["w"][2] == 0)  # row 2 never had a moment
    lazy = TrainState({"w": np.zeros((3, 2), dtype=np.float32)})
    lazy_opt = LazyAdamOptimizer(0.1)
    lazy_opt.apply_gradients(lazy, {"w": one_row})
    lazy_after_first = lazy["w"][0].copy()
    lazy_opt.apply_gradients(lazy, {"w": other_row})
    np.testing.assert_array_equal(lazy["w"][0], lazy_after_first)


def test_adamw_decay_var_list_limits_the_decay() -> None:
    zeros = np.zeros(3, dtype=np.float32)
    state = TrainState({"w": np.ones(3, dtype=np.float32), "b": np.ones(3, dtype=np.float32)})
    opt = AdamWOptimizer(0.5, learning_rate=0.0, decay_var_list=["w"])
    opt.apply_gradients(state, {"w": zeros, "b": zeros})
    np.testing.assert_array_equal(state["w"], np.full(3, 0.5, dtype=np.float32))
    np.testing.assert_array_equal(state["b"], np.ones(3, dtype=np.float32))


def test_adamw_weight_decay_may_follow_a_schedule() -> None:
    zeros = np.zeros(1)
    state = TrainState({"w": np.ones(1)})
    opt = AdamWOptimizer(lambda step: 0.5 if step == 0 else 0.0, learning_rate=0.0)
    opt.apply_gradients(state, {"w": zeros})
    opt.apply_gradients(state, {"w": zeros})
    np.testing.assert_array_equal(state["w"], [0.5])


def test_two_steps_of_the_seed_formula_by_hand() -> None:
    """The seed's lr_t form with TF1's defaults, two steps written out."""
    state = TrainState({"w": np.array([1.0])})
    opt = AdamOptimizer()
    g1, g2 = 0.5, -0.25
    opt.apply_gradients(state, {"w": np.array([g1])})
    opt.apply_gradients(state, {"w": np.array([g2])})
    m1, v1 = 0.1 * g1, 0.001 * g1**2
    w1 = 1.0 - 0.001 * np.sqrt(1 - 0.999) / (1 - 0.9) * m1 / (np.sqrt(v1) + 1e-8)
    m2, v2 = 0.9 * m1 + 0.1 * g2, 0.999 * v1 + 0.001 * g2**2
    w2 = w1 - 0.001 * np.sqrt(1 - 0.999**2) / (1 - 0.9**2) * m2 / (np.sqrt(v2) + 1e-8)
    np.testing.assert_allclose(state["w"], [w2], rtol=1e-13)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beta1": 1.0}, "beta1 must be < 1"),
        ({"beta2": -0.1}, "beta2 must be >= 0"),
        ({"epsilon": -1.0}, "epsilon"),
    ],
)
def test_hyperparameters_are_checked(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AdamOptimizer(**kwargs)


def test_lazy_and_decay_var_list_are_checked() -> None:
    with pytest.raises(TypeError, match="lazy"):
        AdamOptimizer(lazy=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decay_var_list"):
        AdamWOptimizer(0.1, decay_var_list="w")


def test_reprs() -> None:
    assert repr(AdamOptimizer()) == (
        "AdamOptimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08, lazy=False, "
        "name='Adam')"
    )
    assert repr(AdamWOptimizer(0.01, decay_var_list=["w"])).startswith(
        "AdamWOptimizer(weight_decay=0.01, learning_rate=0.001,"
    )


def test_adamw_reads_a_gradient_that_is_the_variable_before_decaying_it() -> None:
    import numpy as np

    from monitored import TrainState
    from monitored.train.optimizers import AdamWOptimizer

    for size in (10, 100_000):  # the plain and the chunked path
        aliased = TrainState({"w": np.full(size, 2.0, np.float32)})
        copied = TrainState({"w": np.full(size, 2.0, np.float32)})
        for state, grad_of in ((aliased, lambda s: s["w"]), (copied, lambda s: s["w"].copy())):
            opt = AdamWOptimizer(weight_decay=0.01, learning_rate=0.1)
            for _ in range(3):
                opt.apply_gradients(state, {"w": grad_of(state)})
        np.testing.assert_array_equal(aliased["w"], copied["w"])
