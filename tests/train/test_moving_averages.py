"""ExponentialMovingAverage: TF1's update and decay rule, shadows in the state, swapping."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train.moving_averages import ExponentialMovingAverage
from monitored.train.optimizers import AdamOptimizer

F32 = np.float32


def _state() -> TrainState:
    return TrainState({"w": np.ones((2, 3), F32), "b": np.zeros(3, F32)})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_num_updates", [False, True])
def test_trajectory_matches_tf1_rule(dtype: Any, with_num_updates: bool) -> None:
    rng = np.random.default_rng(0)
    state = TrainState({"w": rng.standard_normal(5).astype(dtype)})
    ema = ExponentialMovingAverage(
        0.99, num_updates=(lambda: state.global_step) if with_num_updates else None
    )
    ema.apply(state, ["w"])  # creates the shadow (a copy): no change
    shadow = state["w"].astype(np.float64)
    for step in range(25):
        state["w"][...] = rng.standard_normal(5).astype(dtype)
        decay = min(0.99, (1 + step) / (10 + step)) if with_num_updates else 0.99
        ema.apply(state, ["w"])
        shadow -= (1 - decay) * (shadow - state["w"].astype(np.float64))
        state.global_step += 1
        average = ema.average(state, "w")
        assert average is not None
        assert average.dtype == np.dtype(dtype)
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(average, shadow, rtol=rtol, atol=rtol)


def test_first_apply_creates_a_copy_and_changes_nothing() -> None:
    state = _state()
    ema = ExponentialMovingAverage(0.5)
    ema.apply(state, ["w"])
    shadow = state["w/ExponentialMovingAverage"]
    assert shadow is not state["w"]
    np.testing.assert_array_equal(shadow, state["w"])
    assert "b/ExponentialMovingAverage" not in state


def test_num_updates_int_and_decay_rule() -> None:
    assert ExponentialMovingAverage(0.999, num_updates=0).current_decay() == pytest.approx(0.1)
    assert ExponentialMovingAverage(0.999, num_updates=90).current_decay() == pytest.approx(
        91 / 100
    )
    assert ExponentialMovingAverage(0.9, num_updates=10**6).current_decay() == 0.9
    assert ExponentialMovingAverage(0.9).current_decay() == 0.9


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"decay": 1.5}, ValueError, "decay must be <= 1"),
        ({"decay": -0.1}, ValueError, "decay must be >= 0"),
        ({"decay": "0.9"}, TypeError, "decay must be a real number"),
        ({"decay": 0.9, "num_updates": -1}, ValueError, "num_updates must be a non-negative"),
        ({"decay": 0.9, "num_updates": 1.5}, ValueError, "num_updates must be a non-negative"),
        ({"decay": 0.9, "name": "a/b"}, ValueError, "without '/'"),
    ],
)
def test_arguments_are_checked(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ExponentialMovingAverage(**kwargs)


def test_num_updates_callable_returning_nonsense() -> None:
    ema = ExponentialMovingAverage(0.9, num_updates=lambda: -3)
    with pytest.raises(ValueError, match="num_updates must be a non-negative integer, got -3"):
        ema.apply(_state())


def test_default_var_list_is_the_trainable_variables() -> None:
    state = _state()
    state["count"] = np.zeros((), np.int64)
    AdamOptimizer(0.1).create_slots(state)
    ema = ExponentialMovingAverage(0.9)
    ema.apply(state)
    ema.apply(state)  # the shadows themselves are never averaged
    averaged = sorted(name for name in state if name.endswith("/ExponentialMovingAverage"))
    assert averaged == ["b/ExponentialMovingAverage", "w/ExponentialMovingAverage"]


def test_names_and_lookup() -> None:
    ema = ExponentialMovingAverage(0.9, name="EMA")
    assert ema.name == "EMA"
    assert ema.average_name("layer/w") == "layer/w/EMA"
    state = _state()
    assert ema.average(state, "w") is None
    ema.apply(state, ["w"])
    assert ema.average(state, "w") is state["w/EMA"]
    assert repr(ema) == "ExponentialMovingAverage(decay=0.9, num_updates=None, name='EMA')"


def test_finalized_state_needs_shadows_made_before() -> None:
    state = _state()
    ema = ExponentialMovingAverage(0.9)
    state.finalize()
    with pytest.raises(RuntimeError) as raised:
        ema.apply(state, ["w"])
    message = str(raised.value)
    assert "'w/ExponentialMovingAverage' does not exist and the state is finalized" in message
    assert "ema.apply(state, var_list) once before the session is created" in message
    assert "Scaffold.init_fn" in message

    ready = _state()
    ema.apply(ready, ["w"])
    ready.finalize()
    ready["w"][...] = 3.0
    ema.apply(ready, ["w"])
    np.testing.assert_allclose(ready["w/ExponentialMovingAverage"], 1.0 + 0.1 * 2.0)


def test_apply_checks_its_variables() -> None:
    state = _state()
    state["count"] = np.zeros(3, np.int64)
    ema = ExponentialMovingAverage(0.9)
    with pytest.raises(TypeError, match="only floating-point"):
        ema.apply(state, ["count"])
    with pytest.raises(KeyError, match="no variable 'x'"):
        ema.apply(state, ["x"])
    with pytest.raises(TypeError, match="not the string"):
        ema.apply(state, "w")


def test_averaged_swaps_in_and_back() -> None:
    state = _state()
    ema = ExponentialMovingAverage(0.5)
    ema.apply(state)
    state["w"][...] = 3.0
    ema.apply(state)  # shadow of w: 2.0
    w = state["w"]
    with ema.averaged(state):
        assert state["w"] is w
        np.testing.assert_array_equal(state["w"], np.full((2, 3), 2.0, F32))
        state["w"][...] = -1.0  # evaluation code must not leak changes
    np.testing.assert_array_equal(state["w"], np.full((2, 3), 3.0, F32))
    np.testing.assert_array_equal(state["w/ExponentialMovingAverage"], np.full((2, 3), 2.0, F32))


def test_averaged_restores_after_an_error_and_on_a_finalized_state() -> None:
    state = _state()
    ema = ExponentialMovingAverage(0.5)
    ema.apply(state, ["w"])
    state["w"][...] = 5.0
    ema.apply(state, ["w"])
    state.finalize()
    with pytest.raises(RuntimeError, match="boom"), ema.averaged(state, ["w"]):
        np.testing.assert_array_equal(state["w"], np.full((2, 3), 3.0, F32))
        raise RuntimeError("boom")
    np.testing.assert_array_equal(state["w"], np.full((2, 3), 5.0, F32))


def test_averaged_needs_a_shadow() -> None:
    with (
        pytest.raises(KeyError, match="'b' has no moving average"),
        ExponentialMovingAverage(0.5).averaged(_state(), ["b"]),
    ):
        pass  # pragma: no cover


def test_variables_to_restore_maps_checkpoint_names_to_entries() -> None:
    state = _state()
    opt = AdamOptimizer(0.1)
    opt.create_slots(state)
    ema = ExponentialMovingAverage(0.9)
    ema.apply(state, ["w"])
    mapping = ema.variables_to_restore(state, ["w"])
    assert mapping["w/ExponentialMovingAverage"] == "w"
    assert mapping["b"] == "b"
    assert mapping["w/Adam/m"] == "w/Adam/m"
    assert "w" not in mapping
    default = ema.variables_to_restore(TrainState({"w": np.ones(2), "b": np.ones(2)}))
    assert default == {"w/ExponentialMovingAverage": "w", "b/ExponentialMovingAverage": "b"}


# -- averages of values and zero debiasing (issue 17, gap 8) ----------------------------------


def test_average_of_a_value_starts_at_zero_and_is_non_trainable() -> None:
    from monitored.train.optimizers import trainable_variables

    state = _state()
    ema = ExponentialMovingAverage(0.9, name="avg")
    ema.create_averages(state, values={"loss": np.float32(0)})
    assert state["loss/avg"].dtype == F32
    assert state["loss/avg"].shape == ()
    assert not state.is_trainable("loss/avg")
    assert trainable_variables(state) == ["w", "b"]
    expected = 0.0
    for loss in (2.0, 1.5, np.float64(1.0)):
        ema.apply(state, values={"loss": loss})  # only the value: variables untouched
        expected -= 0.1 * (expected - float(loss))
        assert float(state["loss/avg"]) == pytest.approx(expected, rel=1e-6)
    assert "w/avg" not in state
    assert float(ema.average(state, "loss")) == pytest.approx(expected, rel=1e-6)  # type: ignore[arg-type]


def test_zero_debias_follows_the_kingma_ba_formula() -> None:
    state = TrainState()
    ema = ExponentialMovingAverage(0.9, zero_debias=True, name="avg")
    ema.create_averages(state, values={"loss": np.zeros(2)})
    assert sorted(state) == ["loss/avg", "loss/avg/biased", "loss/avg/local_step"]
    assert state.non_trainable == set(state)
    ema.apply(state, values={"loss": np.full(2, 3.0)})
    np.testing.assert_allclose(state["loss/avg"], [3.0, 3.0])  # a constant is exact at once
    biased, decay = np.full(2, 0.3), 0.9
    for t, value in enumerate([1.0, 5.0, 2.0], start=2):
        ema.apply(state, values={"loss": np.full(2, value)})
        biased -= (1 - decay) * (biased - value)
        np.testing.assert_allclose(state["loss/avg"], biased / (1 - decay**t))
        assert int(state["loss/avg/local_step"]) == t


def test_assign_moving_average_with_and_without_zero_debias() -> None:
    from monitored import assign_moving_average, ensure_zero_debias

    state = TrainState({"mean": np.zeros(3, F32), "var": np.ones(3, F32)})
    ensure_zero_debias(state, "mean")
    assert not state.is_trainable("mean/biased")
    for value in (2.0, 4.0):
        assign_moving_average(state, "mean", np.full(3, value, F32), 0.5)
        assign_moving_average(state, "var", np.full(3, value, F32), 0.5, zero_debias=False)
    # debiased: b = 0.5 * 1 + 0.5 * 4 after b = 1; t = 2: (0.5 + 2) / (1 - 0.25)
    np.testing.assert_allclose(state["mean"], np.full(3, 2.5 / 0.75, F32), rtol=1e-6)
    np.testing.assert_allclose(state["var"], np.full(3, 2.75, F32))  # 1 -> 1.5 -> 2.75
    assert state["mean"].dtype == F32
    with pytest.raises(
        KeyError, match=r"no zero-debias entry 'var/biased'; call ensure_zero_debias"
    ):
        assign_moving_average(state, "var", np.ones(3, F32), 0.5)
    with pytest.raises(ValueError, match="shapes must match"):
        assign_moving_average(state, "var", np.ones(2, F32), 0.5, zero_debias=False)
    with pytest.raises(ValueError, match="decay must be < 1 with zero_debias=True"):
        assign_moving_average(state, "mean", np.ones(3, F32), 1.0)
    state.finalize()
    with pytest.raises(
        RuntimeError, match="'var/biased' does not exist and the state is finalized"
    ):
        ensure_zero_debias(state, "var")


def test_values_are_checked() -> None:
    state = _state()
    ema = ExponentialMovingAverage(0.9)
    with pytest.raises(ValueError, match="'w' is a TrainState entry; average it through var_list"):
        ema.apply(state, values={"w": 1.0})
    with pytest.raises(TypeError, match="value 'n' is numpy int64"):
        ema.apply(state, values={"n": np.arange(2)})
    with pytest.raises(TypeError, match="value 'loss' must be a number or a NumPy or CuPy array"):
        ema.apply(state, values={"loss": "1.0"})
    with pytest.raises(ValueError, match="decay must be < 1 with zero_debias=True"):
        ExponentialMovingAverage(1.0, zero_debias=True)
    state.finalize()
    with pytest.raises(RuntimeError, match="call ema.create_averages"):
        ema.apply(state, values={"loss": 1.0})


def test_a_restored_value_average_gets_its_marker_back_before_the_variables_are_listed() -> None:
    # A resumed run creates the entries from the checkpoint: no markers, no init_fn.
    state = TrainState({"w": np.ones(2, F32), "loss/avg": np.zeros((), F32)})
    state["w/avg"] = np.ones(2, F32)
    state.finalize()
    ema = ExponentialMovingAverage(0.9, name="avg")
    ema.apply(state, values={"loss": 1.0})
    ema.apply(state)  # "loss/avg" is not mistaken for a variable to average
    assert not state.is_trainable("loss/avg")
