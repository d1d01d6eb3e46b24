"""Gradient checking: right gradients pass, wrong ones are caught, TF1's Jacobian layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from monitored.train.gradient_checker import compute_gradient, compute_gradient_error
from monitored.train.optimizers import IndexedSlices

RNG = np.random.default_rng(0)


def _f(x: np.ndarray) -> np.ndarray:
    return np.sin(x) * x


def _grad(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return dy * (np.cos(x) * x + np.sin(x))


def test_correct_elementwise_gradient_passes() -> None:
    x = RNG.standard_normal((3, 2))
    assert compute_gradient_error(_f, x, _grad) < 1e-6
    assert compute_gradient_error(_f, x, _grad, delta=1e-5) < 1e-9


def test_wrong_gradient_is_caught() -> None:
    x = RNG.standard_normal(4)
    assert compute_gradient_error(_f, x, lambda x, dy: dy * np.cos(x) * x) > 0.1


def test_jacobian_layout_is_tf1s() -> None:
    a = RNG.standard_normal((3, 4))  # y = a @ x: dy_j/dx_i = a[j, i]
    x = RNG.standard_normal(4)
    theoretical, numerical = compute_gradient(lambda x: a @ x, x, lambda x, dy: a.T @ dy)
    assert theoretical.shape == numerical.shape == (4, 3)
    np.testing.assert_allclose(theoretical, a.T)
    np.testing.assert_allclose(numerical, a.T, rtol=1e-8)


def test_several_inputs_as_a_sequence() -> None:
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 2))
    found = compute_gradient(lambda a, b: a @ b, [a, b], lambda a, b, dy: (dy @ b.T, a.T @ dy))
    assert isinstance(found, list)
    assert len(found) == 2
    assert found[0][0].shape == found[1][0].shape == (6, 4)
    for theoretical, numerical in found:
        np.testing.assert_allclose(theoretical, numerical, atol=1e-8)
    assert (
        compute_gradient_error(
            lambda a, b: a @ b, (a, b), lambda a, b, dy: (dy @ b.T, 2 * a.T @ dy)
        )
        > 0.1
    )


def test_parameters_as_a_mapping_with_a_scalar_loss() -> None:
    params = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2), "unused": np.ones(2)}
    x = RNG.standard_normal((5, 3))

    def loss(p: dict[str, np.ndarray]) -> float:
        return float(np.sum(np.tanh(x @ p["w"] + p["b"]) ** 2))

    def grads(p: dict[str, np.ndarray], dy: np.ndarray) -> dict[str, Any]:
        h = np.tanh(x @ p["w"] + p["b"])
        dz = dy * 2 * h * (1 - h * h)
        return {"w": x.T @ dz, "b": dz.sum(axis=0), "unused": None}

    found = compute_gradient(loss, params, grads)
    assert list(found) == ["w", "b", "unused"]
    assert found["w"][0].shape == (6, 1)
    np.testing.assert_array_equal(found["unused"][0], np.zeros((2, 1)))
    assert compute_gradient_error(loss, params, grads, delta=1e-5) < 1e-8


def test_indexed_slices_gradients_are_densified() -> None:
    table = RNG.standard_normal((5, 2))
    ids = np.array([3, 1, 3])

    def lookup(t: np.ndarray) -> np.ndarray:
        return t[ids]

    def backward(t: np.ndarray, dy: np.ndarray) -> IndexedSlices:
        return IndexedSlices(dy, ids)

    assert compute_gradient_error(lookup, table, backward) < 1e-9


def test_float32_divides_by_the_step_actually_taken() -> None:
    # 1 +- 3e-7 rounds to a float32 step about 20% off the nominal one; a linear
    # function's difference quotient is exact only over the realized step.
    x = np.array([1.0, 2.0], np.float32)
    error = compute_gradient_error(lambda x: 2 * x, x, lambda x, dy: 2 * dy, delta=3e-7)
    assert error < 1e-6


def test_inputs_are_not_modified() -> None:
    x = RNG.standard_normal(3)
    kept = x.copy()
    compute_gradient(_f, x, _grad)
    np.testing.assert_array_equal(x, kept)


@pytest.mark.parametrize(
    ("f", "x", "grad_fn", "kwargs", "error", "match"),
    [
        (_f, np.ones(2), _grad, {"delta": 0.0}, ValueError, "delta must be positive"),
        (_f, np.ones(2), _grad, {"delta": "a"}, TypeError, "delta must be a number"),
        (_f, np.ones(2, np.int64), _grad, {}, TypeError, "input x must be a floating-point"),
        (lambda x: "y", np.ones(2), _grad, {}, TypeError, "f must return an array or a number"),
        (
            _f,
            np.ones(2),
            lambda x, dy: np.ones(3),
            {},
            ValueError,
            r"gradient of x has shape \(3,\)",
        ),
        (_f, np.ones(2), lambda x, dy: "g", {}, TypeError, "gradient of x must be an array"),
        (
            lambda a, b: a + b,
            [np.ones(2), np.ones(2)],
            lambda a, b, dy: (dy,),
            {},
            ValueError,
            "returned 1 gradients for 2 inputs",
        ),
        (
            lambda a, b: a + b,
            [np.ones(2), np.ones(2)],
            lambda a, b, dy: dy,
            {},
            TypeError,
            "must return a list or tuple",
        ),
        (
            lambda p: p["w"],
            {"w": np.ones(2)},
            lambda p, dy: dy,
            {},
            TypeError,
            "must return a mapping",
        ),
    ],
)
def test_errors_name_the_problem(
    f: Any, x: Any, grad_fn: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        compute_gradient(f, x, grad_fn, **kwargs)


def test_a_nan_jacobian_never_passes() -> None:
    import math

    import numpy as np

    from monitored.train.gradient_checker import compute_gradient_error

    x = np.array([0.5, 1.0, 2.0])
    error = compute_gradient_error(
        lambda x: np.sum(x**2), x, lambda x, dy: dy * np.full_like(x, np.nan)
    )
    assert math.isnan(error)


def test_a_step_that_rounds_away_is_a_clear_error() -> None:
    import numpy as np

    from monitored.train.gradient_checker import compute_gradient

    x = np.array([1e5], np.float32)
    with pytest.raises(ValueError, match="rounds away in that dtype"):
        compute_gradient(lambda x: x * 2, x, lambda x, dy: 2 * dy, delta=1e-3)
