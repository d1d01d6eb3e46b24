"""The trajectory harness of the optimizer tests.

``check_trajectory`` runs an optimizer for 25 steps on a (6, 3) variable, dense or
with row-sparse gradients (duplicate indices included), and after every step
compares the variable and every slot with an independent float64 reference
written in the test module: ``reference(w, slots, g, t)`` updates float64 arrays
in place by the published rule, ``t`` counting steps from 1.

Sparse modes: ``"rows"`` applies the reference to the touched rows only (TF1's
sparse Momentum/Adagrad/FTRL/...) and also requires every untouched row of the
variable and slots to stay bit-for-bit unchanged; ``"dense_equivalent"``
applies the dense reference to the densified gradient (TF1's sparse Adam).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.optimizers import IndexedSlices, Optimizer

SHAPE = (6, 3)
STEPS = 25


class Reference(Protocol):
    def __call__(
        self, w: np.ndarray, slots: dict[str, np.ndarray], g: np.ndarray, t: int
    ) -> None: ...


def dense_gradients(dtype: Any, seed: int = 1, steps: int = STEPS) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(dtype) for _ in range(steps)]


def sparse_gradients(dtype: Any, seed: int = 2, steps: int = STEPS) -> list[IndexedSlices]:
    rng = np.random.default_rng(seed)
    grads = []
    for _ in range(steps):
        rows = rng.integers(0, SHAPE[0], size=int(rng.integers(1, 4)))
        rows = np.concatenate([rows, rows[:1]])  # always one duplicate row
        values = rng.standard_normal((rows.size, SHAPE[1])).astype(dtype)
        grads.append(IndexedSlices(values, rows))
    return grads


def summed_rows(grad: IndexedSlices) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows and float64 sums of their duplicate values (written out plainly)."""
    sums: dict[int, np.ndarray] = {}
    for row, value in zip(grad.indices.tolist(), grad.values.astype(np.float64), strict=True):
        sums[row] = sums.get(row, 0.0) + value
    rows = sorted(sums)
    return np.array(rows, dtype=np.int64), np.array([sums[r] for r in rows])


def initial_value(dtype: Any) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)


def run_check(
    make_opt: Callable[[], Optimizer],
    reference: Reference,
    slot_init: dict[str, float],
    *,
    sparse: str | None = None,
    dtype: Any = np.float32,
    rtol: float | None = None,
    atol: float | None = None,
    steps: int = STEPS,
) -> TrainState:
    single = np.dtype(dtype) == np.float32
    rtol = rtol if rtol is not None else (2e-5 if single else 1e-11)
    atol = atol if atol is not None else (2e-6 if single else 1e-12)
    w0 = initial_value(dtype)
    state = TrainState({"w": w0.copy()})
    opt = make_opt()
    assert sorted(slot_init) == opt.get_slot_names()
    ref_w = w0.astype(np.float64)
    ref_slots = {name: np.full(SHAPE, value) for name, value in slot_init.items()}
    if sparse is None:
        grads: list[Any] = dense_gradients(dtype, steps=steps)
    else:
        grads = sparse_gradients(dtype, steps=steps)
    for t, grad in enumerate(grads, start=1):
        before = {name: np.array(state[name]) for name in state}
        opt.apply_gradients(state, {"w": grad})
        assert state.global_step == t
        if sparse is None:
            reference(ref_w, ref_slots, grad.astype(np.float64), t)
        elif sparse == "dense_equivalent":
            dense = np.zeros(SHAPE)
            rows, values = summed_rows(grad)
            dense[rows] = values
            reference(ref_w, ref_slots, dense, t)
        else:
            assert sparse == "rows"
            rows, values = summed_rows(grad)
            part_w = ref_w[rows]
            part_slots = {name: s[rows] for name, s in ref_slots.items()}
            reference(part_w, part_slots, values, t)
            ref_w[rows] = part_w
            for name, part in part_slots.items():
                ref_slots[name][rows] = part
            untouched = np.setdiff1d(np.arange(SHAPE[0]), rows)
            np.testing.assert_array_equal(state["w"][untouched], before["w"][untouched])
            for slot, fill in slot_init.items():
                key = opt.slot_key("w", slot)
                previous = before[key] if key in before else np.full(SHAPE, fill, dtype)
                np.testing.assert_array_equal(state[key][untouched], previous[untouched])
        assert state["w"].dtype == np.dtype(dtype)
        np.testing.assert_allclose(state["w"], ref_w, rtol=rtol, atol=atol, err_msg=f"w, step {t}")
        for name, expected in ref_slots.items():
            slot = opt.get_slot(state, "w", name)
            assert slot is not None
            assert slot.dtype == np.dtype(dtype)
            np.testing.assert_allclose(
                slot, expected, rtol=rtol, atol=atol, err_msg=f"slot {name}, step {t}"
            )
    return state


@pytest.fixture
def check_trajectory() -> Callable[..., TrainState]:
    """:func:`run_check`, as a fixture (test modules are not a package)."""
    return run_check


@pytest.fixture
def helpers() -> SimpleNamespace:
    """The data helpers above, for tests that write their own loop."""
    return SimpleNamespace(
        SHAPE=SHAPE,
        STEPS=STEPS,
        dense_gradients=dense_gradients,
        sparse_gradients=sparse_gradients,
        summed_rows=summed_rows,
        initial_value=initial_value,
    )
