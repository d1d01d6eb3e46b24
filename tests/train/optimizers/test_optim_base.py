"""The Optimizer API over a TrainState: slots, gradients in, errors out, resuming."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

from monitored._core._state import TrainState
from monitored.train.moving_averages import ExponentialMovingAverage
from monitored.train.optimizers import (
    SGD,
    AdadeltaOptimizer,
    AdagradDAOptimizer,
    AdagradOptimizer,
    Adam,
    AdamOptimizer,
    AdamWOptimizer,
    FtrlOptimizer,
    GradientDescentOptimizer,
    IndexedSlices,
    LazyAdamOptimizer,
    MomentumOptimizer,
    Optimizer,
    ProximalAdagradOptimizer,
    ProximalGradientDescentOptimizer,
    RMSPropOptimizer,
    trainable_variables,
)

F32 = np.float32

ALL: list[Callable[[], Optimizer]] = [
    lambda: GradientDescentOptimizer(0.1),
    lambda: MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    lambda: AdagradOptimizer(0.1),
    lambda: AdagradDAOptimizer(0.1, l1_regularization_strength=0.001),
    lambda: AdadeltaOptimizer(1.0),
    lambda: AdamOptimizer(0.01),
    lambda: LazyAdamOptimizer(0.01),
    lambda: AdamWOptimizer(0.01, 0.01),
    lambda: RMSPropOptimizer(0.01, momentum=0.5, centered=True),
    lambda: FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    lambda: ProximalGradientDescentOptimizer(0.1, 0.01, 0.01),
    lambda: ProximalAdagradOptimizer(0.1, 0.1, 0.01, 0.01),
]


def _state(**arrays: Any) -> TrainState:
    return TrainState(arrays or {"w": np.ones((2, 3), F32), "b": np.zeros(3, F32)})


def _grads(state: TrainState, scale: float = 0.5) -> dict[str, np.ndarray]:
    return {name: np.full(state[name].shape, scale, state[name].dtype) for name in ("w", "b")}


# -- gradients in -----------------------------------------------------------------------


def test_mapping_and_tf_pairs_give_the_same_update() -> None:
    a, b = _state(), _state()
    opt = AdamOptimizer(0.1)
    opt.apply_gradients(a, _grads(a))
    opt.apply_gradients(b, [(g, name) for name, g in _grads(b).items()])
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_none_gradients_are_skipped_and_get_no_slots() -> None:
    state = _state()
    opt = MomentumOptimizer(0.1, 0.9)
    opt.apply_gradients(state, [(None, "w"), (np.ones(3, F32), "b")])
    np.testing.assert_array_equal(state["w"], np.ones((2, 3), F32))
    assert opt.get_slot(state, "w", "momentum") is None
    assert opt.get_slot(state, "b", "momentum") is not None


def test_all_none_is_an_error_naming_the_variables() -> None:
    state = _state()
    with pytest.raises(ValueError, match=r"no gradients provided for any variable: \['w', 'b'\]"):
        SGD(0.1).apply_gradients(state, {"w": None, "b": None})
    assert state.global_step == 0


def test_unknown_variable_is_named_with_suggestions() -> None:
    with pytest.raises(KeyError, match=r"no variable 'ww'.*did you mean 'w'"):
        SGD(0.1).apply_gradients(_state(), {"ww": np.ones(3, F32)})


@pytest.mark.parametrize(
    ("grad", "match"),
    [
        (
            np.ones((3, 2), F32),
            r"gradient of 'w' is numpy float32 \(3, 2\), but the variable is "
            r"numpy float32 \(2, 3\)",
        ),
        (
            np.ones((2, 3), np.float64),
            r"gradient of 'w' is numpy float64 \(2, 3\), but the "
            r"variable is numpy float32 \(2, 3\)",
        ),
    ],
)
def test_shape_or_dtype_mismatch_names_variable_shapes_and_dtypes(grad: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SGD(0.1).apply_gradients(_state(), {"w": grad})


def test_a_bad_gradient_leaves_everything_untouched() -> None:
    state = _state()
    before = {name: state[name].copy() for name in state}
    opt = AdamOptimizer(0.1)
    with pytest.raises(ValueError, match="'b'"):
        opt.apply_gradients(state, [(np.ones((2, 3), F32), "w"), (np.ones(4, F32), "b")])
    assert state.global_step == 0
    assert sorted(state) == ["b", "w"]  # not even slots were created
    for name, value in before.items():
        np.testing.assert_array_equal(state[name], value)


@pytest.mark.parametrize(
    ("grads_and_vars", "error", "match"),
    [
        (
            {"w": [1.0, 2.0]},
            TypeError,
            "must be a NumPy or CuPy array or an IndexedSlices, got list",
        ),
        ([("w", np.ones(3, F32))], TypeError, r"pairs are \(gradient, name\), TF1's order"),
        ([(np.ones(3, F32), 3)], TypeError, "variable names must be strings"),
        ({3: np.ones(3, F32)}, TypeError, "variable names must be strings"),
        ([np.ones(3, F32)], TypeError, r"expected \(gradient, name\) pairs"),
        ([(np.ones(3, F32), "b"), (np.ones(3, F32), "b")], ValueError, "more than one gradient"),
        ("w", TypeError, "must be a mapping name -> gradient or a list"),
        (np.ones(3, F32), TypeError, "must be a mapping name -> gradient or a list"),
        (42, TypeError, "must be a mapping name -> gradient or a list"),
    ],
)
def test_malformed_gradients_are_rejected(grads_and_vars: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SGD(0.1).apply_gradients(_state(), grads_and_vars)


def test_integer_variables_cannot_be_trained() -> None:
    state = TrainState({"count": np.zeros(3, np.int64)})
    with pytest.raises(TypeError, match="'count' is numpy int64 .* only floating-point"):
        SGD(0.1).apply_gradients(state, {"count": np.ones(3, np.int64)})


def test_global_step_increments_unless_false() -> None:
    state = _state()
    opt = SGD(0.1)
    opt.apply_gradients(state, _grads(state))
    opt.apply_gradients(state, _grads(state), global_step=False)
    assert state.global_step == 1
    with pytest.raises(TypeError, match="global_step must be True"):
        opt.apply_gradients(state, _grads(state), global_step=1)  # type: ignore[arg-type]


def test_variables_of_different_dtypes_in_one_step() -> None:
    state = TrainState({"a": np.ones(2, np.float32), "b": np.ones(2, np.float64)})
    AdamOptimizer(0.1).apply_gradients(state, {"a": np.ones(2, np.float32), "b": np.ones(2)})
    assert state["a"].dtype == np.float32
    assert state["b"].dtype == np.float64
    np.testing.assert_allclose(state["a"], state["b"], rtol=1e-6)


# -- sparse gradients -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grad", "error", "match"),
    [
        (IndexedSlices(np.ones((1, 3), F32), [2]), IndexError, "row index 2 is out of range for 2"),
        (IndexedSlices(np.ones((1, 3), F32), [-1]), IndexError, "row index -1 is out of range"),
        (IndexedSlices(np.ones((1, 2), F32), [0]), ValueError, r"rows of float32 \(2,\), but"),
        (IndexedSlices(np.ones((1, 3)), [0]), ValueError, r"rows of float64 \(3,\)"),
        (
            IndexedSlices(np.ones((1, 3), F32), [0], dense_shape=(5, 3)),
            ValueError,
            r"dense_shape \(5, 3\)",
        ),
    ],
)
def test_bad_sparse_gradients_are_rejected(grad: IndexedSlices, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        MomentumOptimizer(0.1, 0.9).apply_gradients(_state(), {"w": grad})


def test_sparse_gradient_of_a_scalar_is_rejected() -> None:
    state = TrainState({"s": np.zeros((), F32)})
    with pytest.raises(ValueError, match="'s' is a scalar"):
        SGD(0.1).apply_gradients(state, {"s": IndexedSlices(np.ones((1,), F32), [0])})


def test_empty_sparse_gradient_changes_nothing_but_the_step() -> None:
    state = _state()
    opt = MomentumOptimizer(0.1, 0.9)
    opt.apply_gradients(state, {"w": IndexedSlices(np.zeros((0, 3), F32), [])})
    np.testing.assert_array_equal(state["w"], np.ones((2, 3), F32))
    assert state.global_step == 1


def test_sparse_gradient_is_not_modified() -> None:
    state = TrainState({"w": np.zeros((3, 2), F32)})
    values = np.ones((2, 2), F32)
    AdagradOptimizer(0.1).apply_gradients(state, {"w": IndexedSlices(values, [2, 0])})
    np.testing.assert_array_equal(values, np.ones((2, 2), F32))


# -- slots ------------------------------------------------------------------------------


def test_slot_names_and_keys() -> None:
    opt = AdamOptimizer(name="Adam")
    assert opt.get_slot_names() == ["m", "v"]
    assert opt.slot_key("layer/w", "m") == "layer/w/Adam/m"
    assert opt.non_slot_keys() == ["Adam/beta1_power", "Adam/beta2_power"]
    assert opt.get_name() == opt.name == "Adam"
    with pytest.raises(ValueError, match=r"has no slot 'mm'; its slots are \['m', 'v'\]"):
        opt.slot_key("w", "mm")


def test_get_slot_returns_the_state_entry() -> None:
    state = _state()
    opt = AdagradOptimizer(0.1, initial_accumulator_value=0.5)
    assert opt.get_slot(state, "w", "accumulator") is None
    opt.create_slots(state, ["w"])
    slot = opt.get_slot(state, "w", "accumulator")
    assert slot is state["w/Adagrad/accumulator"]
    np.testing.assert_array_equal(slot, np.full((2, 3), 0.5, F32))


def test_create_slots_is_idempotent_and_keeps_restored_values() -> None:
    state = _state()
    opt = MomentumOptimizer(0.1, 0.9)
    opt.create_slots(state)
    state["w/Momentum/momentum"][...] = 7.0
    opt.create_slots(state)
    np.testing.assert_array_equal(state["w/Momentum/momentum"], np.full((2, 3), 7.0, F32))


def test_create_slots_refuses_a_clashing_entry() -> None:
    state = _state()
    state["w/Momentum/momentum"] = np.zeros(4, F32)
    with pytest.raises(ValueError, match=r"'w/Momentum/momentum' is numpy float32 \(4,\), but it"):
        MomentumOptimizer(0.1, 0.9).create_slots(state, ["w"])


def test_slots_after_the_state_is_finalized() -> None:
    state = _state()
    opt = AdamOptimizer(0.1)
    state.finalize()
    with pytest.raises(RuntimeError) as raised:
        opt.apply_gradients(state, _grads(state))
    message = str(raised.value)
    assert "'w/Adam/m' does not exist and the state is finalized" in message
    assert "call AdamOptimizer.create_slots(state) before the session is created" in message
    assert "Scaffold.init_fn" in message
    assert state.global_step == 0


def test_slots_created_up_front_work_on_a_finalized_state() -> None:
    state = _state()
    opt = RMSPropOptimizer(0.1, centered=True)
    opt.create_slots(state)
    state.finalize()
    opt.apply_gradients(state, _grads(state))
    assert state.global_step == 1


def test_var_list_none_means_the_trainable_variables() -> None:
    state = TrainState(
        {
            "w": np.ones(2, F32),
            "layer/b": np.ones(2, F32),
            "steps": np.zeros((), np.int64),
            "temperature": np.ones((), F32),
        }
    )
    AdamOptimizer(0.1).create_slots(state)
    ExponentialMovingAverage(0.9).apply(state)
    MomentumOptimizer(0.1, 0.9).create_slots(state)
    assert trainable_variables(state) == ["w", "layer/b", "temperature"]
    assert "w/Momentum/momentum" in state
    assert "w/Adam/m/Momentum/momentum" not in state
    assert "Adam/beta1_power/Momentum/momentum" not in state
    assert "w/ExponentialMovingAverage/Momentum/momentum" not in state


def test_var_list_is_checked() -> None:
    opt = SGD(0.1)
    with pytest.raises(TypeError, match="not the string 'w'"):
        opt.create_slots(_state(), "w")
    with pytest.raises(ValueError, match="'w' is listed twice"):
        opt.create_slots(_state(), ["w", "w"])
    with pytest.raises(TypeError, match="names must be strings"):
        opt.create_slots(_state(), [1])  # type: ignore[list-item]
    with pytest.raises(KeyError, match="no variable 'x'"):
        opt.create_slots(_state(), ["x"])


# -- compute_gradients and minimize -----------------------------------------------------


def _quadratic(state: TrainState) -> tuple[float, dict[str, np.ndarray]]:
    w = state["w"]
    return float(0.5 * np.sum(w * w)), {"w": w.copy()}


def test_compute_gradients_returns_the_loss_and_tf_pairs() -> None:
    state = _state()
    loss, pairs = SGD(0.1).compute_gradients(state, _quadratic)
    assert loss == 3.0
    assert [name for _, name in pairs] == ["w"]
    _, with_b = SGD(0.1).compute_gradients(state, _quadratic, var_list=["w", "b"])
    assert with_b[1] == (None, "b")


@pytest.mark.parametrize(
    ("fn", "error", "match"),
    [
        (lambda s: 1.0, TypeError, r"must return a \(loss, grads\) tuple, got float"),
        (lambda s: (1.0, [1.0]), TypeError, "grads a mapping"),
        (lambda s: (1.0, {"nope": np.ones(3)}), KeyError, "no variable 'nope'"),
    ],
)
def test_compute_gradients_checks_what_fn_returns(fn: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SGD(0.1).compute_gradients(_state(), fn)


def test_minimize_descends_and_returns_the_loss() -> None:
    state = _state()
    opt = GradientDescentOptimizer(0.5)
    losses = [opt.minimize(state, _quadratic) for _ in range(5)]
    assert losses == sorted(losses, reverse=True)
    assert state.global_step == 5
    np.testing.assert_allclose(state["w"], np.full((2, 3), 0.5**5), rtol=1e-6)


# -- hyperparameters --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: SGD(-0.1), ValueError, "learning_rate must be >= 0"),
        (lambda: SGD(float("nan")), ValueError, "learning_rate must be finite"),
        (lambda: SGD("0.1"), TypeError, "learning_rate must be a real number"),  # type: ignore[arg-type]
        (lambda: SGD(True), TypeError, "learning_rate must be a real number"),  # type: ignore[arg-type]
        (lambda: SGD(0.1, name="a/b"), ValueError, "without '/'"),
        (lambda: SGD(0.1, name=""), ValueError, "non-empty"),
        (lambda: MomentumOptimizer(0.1, -0.5), ValueError, "momentum must be >= 0"),
    ],
)
def test_hyperparameters_are_checked(make: Callable[[], Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("bad", [float("nan"), -1.0, "fast"])
def test_a_schedule_returning_nonsense_fails_at_that_step(bad: Any) -> None:
    state = _state()
    state.global_step = 7

    def schedule(step: int) -> Any:
        return bad

    with pytest.raises(ValueError, match="returned .* at global step 7"):
        AdamOptimizer(schedule).apply_gradients(state, _grads(state))
    np.testing.assert_array_equal(state["w"], np.ones((2, 3), F32))
    assert sorted(state) == ["b", "w"]
    assert state.global_step == 7


def test_learning_rate_property_and_repr() -> None:
    def schedule(step: int) -> float:
        return 0.1

    assert SGD(schedule).learning_rate is schedule
    assert repr(SGD(0.5)) == "GradientDescentOptimizer(learning_rate=0.5, name='GradientDescent')"
    assert "use_nesterov=True" in repr(MomentumOptimizer(0.1, 0.9, use_nesterov=True))


def test_short_aliases() -> None:
    assert SGD is GradientDescentOptimizer
    assert Adam is AdamOptimizer


# -- resuming ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", ALL)
@pytest.mark.parametrize("sparse", [False, True])
def test_resumed_run_continues_bit_for_bit(make: Callable[[], Optimizer], sparse: bool) -> None:
    rng = np.random.default_rng(3)
    grads: list[Any] = []
    for _ in range(20):
        if sparse:
            grads.append(IndexedSlices(rng.standard_normal((3, 3)).astype(F32), [0, 3, 0]))
        else:
            grads.append(rng.standard_normal((4, 3)).astype(F32))
    state = TrainState({"w": rng.standard_normal((4, 3)).astype(F32)})
    opt = make()
    for g in grads[:10]:
        opt.apply_gradients(state, {"w": g})
    # What a checkpoint holds: every entry and the global step.
    resumed = TrainState(
        {name: state[name].copy() for name in state}, global_step=state.global_step
    )
    fresh_opt = make()
    for g in grads[10:]:
        opt.apply_gradients(state, {"w": g})
        fresh_opt.apply_gradients(resumed, {"w": g})
    assert sorted(resumed) == sorted(state)
    for name in state:
        np.testing.assert_array_equal(resumed[name], state[name], err_msg=name)
    assert resumed.global_step == state.global_step == 20


@pytest.mark.parametrize("make", ALL)
def test_every_optimizer_lowers_a_quadratic(make: Callable[[], Optimizer]) -> None:
    target = np.array([1.0, -2.0, 0.5], F32)
    state = TrainState({"w": np.zeros(3, F32)})
    opt = make()

    def loss_and_grads(s: TrainState) -> tuple[float, dict[str, np.ndarray]]:
        diff = s["w"] - target
        return float(np.sum(diff * diff)), {"w": 2 * diff}

    first = opt.minimize(state, loss_and_grads)
    for _ in range(60):
        last = opt.minimize(state, loss_and_grads)
    assert last < first


def test_a_read_only_variable_is_named_before_anything_changes() -> None:
    import numpy as np

    from monitored import TrainState
    from monitored.train.optimizers import AdamOptimizer

    state = TrainState({"a": np.ones(3, np.float32), "b": np.broadcast_to(np.float32(1), (3,))})
    opt = AdamOptimizer(0.1)
    with pytest.raises(ValueError, match="variable 'b' is a read-only array"):
        opt.apply_gradients(state, {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    np.testing.assert_array_equal(state["a"], np.ones(3, np.float32))
    assert state.global_step == 0


# -- learning-rate feeding (issue 17, gap 6) and non-trainable entries (gap 7) ----------------


def test_learning_rate_is_settable_between_steps() -> None:
    from monitored.train.optimizers import GradientDescentOptimizer

    state = TrainState({"w": np.zeros(2)})
    opt = GradientDescentOptimizer(0.1)
    grads = {"w": np.ones(2)}
    opt.apply_gradients(state, grads)
    opt.learning_rate = 0.5  # what a TF1 learning-rate hook fed each step
    assert opt.learning_rate == 0.5
    opt.apply_gradients(state, grads)
    np.testing.assert_allclose(state["w"], [-0.6, -0.6])
    opt.learning_rate = lambda step: 0.01 * step  # a schedule works too
    opt.apply_gradients(state, grads)  # global step 2
    np.testing.assert_allclose(state["w"], [-0.62, -0.62])
    with pytest.raises(ValueError, match="learning_rate must be >= 0.0, got -1.0"):
        opt.learning_rate = -1.0
    with pytest.raises(TypeError, match="learning_rate must be a real number"):
        opt.learning_rate = "0.1"  # type: ignore[assignment]
    assert "learning_rate=" in repr(opt)


def test_a_fed_learning_rate_overrides_the_rate_for_one_call() -> None:
    from monitored.train.optimizers import AdamOptimizer, GradientDescentOptimizer

    state = TrainState({"w": np.zeros(2)})
    opt = GradientDescentOptimizer(0.1)
    opt.apply_gradients(state, {"w": np.ones(2)}, learning_rate=1.0)
    np.testing.assert_allclose(state["w"], [-1.0, -1.0])
    opt.minimize(state, lambda s: (0.0, {"w": np.ones(2)}))  # back to the optimizer's rate
    np.testing.assert_allclose(state["w"], [-1.1, -1.1])
    opt.minimize(state, lambda s: (0.0, {"w": np.ones(2)}), learning_rate=0.0)
    np.testing.assert_allclose(state["w"], [-1.1, -1.1])
    assert state.global_step == 3
    with pytest.raises(ValueError, match=r"apply_gradients: learning_rate must be finite"):
        opt.apply_gradients(state, {"w": np.ones(2)}, learning_rate=float("nan"))
    assert state.global_step == 3
    # A fed rate goes through each optimizer's own per-step scalars (Adam's bias correction).
    fed, set_ = TrainState({"w": np.ones(2)}), TrainState({"w": np.ones(2)})
    adam_fed, adam_set = AdamOptimizer(0.1), AdamOptimizer(0.3)
    adam_fed.apply_gradients(fed, {"w": np.ones(2)}, learning_rate=0.3)
    adam_set.apply_gradients(set_, {"w": np.ones(2)})
    np.testing.assert_array_equal(fed["w"], set_["w"])


def test_optimizers_skip_and_refuse_non_trainable_entries() -> None:
    from monitored.train.optimizers import MomentumOptimizer

    state = TrainState(
        {"w": np.ones(2), "bn/mean": np.zeros(2), "loss_avg": np.zeros(())},
        non_trainable=["bn/mean", "loss_avg"],
    )
    opt = MomentumOptimizer(0.1, 0.9)
    opt.create_slots(state)  # var_list=None: only the trainable "w"
    assert "w/Momentum/momentum" in state
    assert "bn/mean/Momentum/momentum" not in state
    assert "loss_avg/Momentum/momentum" not in state
    ema = ExponentialMovingAverage(0.9)
    ema.apply(state)
    assert "w/ExponentialMovingAverage" in state
    assert "bn/mean/ExponentialMovingAverage" not in state
    ema.apply(state, ["bn/mean"])  # an explicit var_list may average anything, as in TF1
    assert "bn/mean/ExponentialMovingAverage" in state
    for call in (
        lambda: opt.apply_gradients(state, {"w": np.ones(2), "bn/mean": np.ones(2)}),
        lambda: opt.compute_gradients(state, lambda s: (0.0, {}), ["bn/mean"]),
        lambda: opt.create_slots(state, ["loss_avg"]),
    ):
        with pytest.raises(ValueError, match=r"'(bn/mean|loss_avg)' is marked trainable=False"):
            call()
    np.testing.assert_array_equal(state["w"], [1.0, 1.0])  # nothing changed
    assert state.global_step == 0


async def test_a_hook_sets_or_feeds_the_learning_rate_in_a_session() -> None:
    """ResNet's TF1 learning-rate hook, ported both ways, equals the schedule."""
    import monitored
    from monitored.train.optimizers import MomentumOptimizer

    def rate_at(step: int) -> float:
        return 0.1 if step < 3 else 0.01

    class Setter(monitored.SessionRunHook):
        def __init__(self, opt: MomentumOptimizer) -> None:
            self.opt = opt

        def before_run(self, run_context: monitored.SessionRunContext) -> None:
            self.opt.learning_rate = rate_at(run_context.session.state.global_step)

    class Feeder(monitored.SessionRunHook):
        def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
            step = run_context.session.state.global_step
            return monitored.SessionRunArgs(feeds={"learning_rate": rate_at(step)})

    async def run(opt: MomentumOptimizer, hooks: list[object]) -> TrainState:
        state = TrainState({"w": np.ones(2)})

        def step(state: TrainState, learning_rate: float | None = None) -> None:
            opt.apply_gradients(state, {"w": state["w"] * 2}, learning_rate=learning_rate)

        async with monitored.MonitoredSession(
            state,
            hooks=[monitored.StopAtStepHook(last_step=6), *hooks],
            scaffold=monitored.Scaffold(init_fn=opt.create_slots),
        ) as sess:
            while not sess.should_stop():
                await sess.run(step)
        return state

    scheduled = await run(MomentumOptimizer(rate_at, 0.9), [])
    opt = MomentumOptimizer(1.0, 0.9)
    set_ = await run(opt, [Setter(opt)])
    fed = await run(MomentumOptimizer(1.0, 0.9), [Feeder()])
    assert opt.learning_rate == 0.01
    for state in (set_, fed):
        np.testing.assert_array_equal(state["w"], scheduled["w"])
        np.testing.assert_array_equal(
            state["w/Momentum/momentum"], scheduled["w/Momentum/momentum"]
        )
    assert not np.array_equal(scheduled["w"], (await run(MomentumOptimizer(0.1, 0.9), []))["w"])


# -- NumPy scalar gradients (issue 22) ----------------------------------------------------
@pytest.mark.parametrize("make", ALL)
def test_optimizer_accepts_a_numpy_scalar_gradient_for_a_0d_entry(
    make: Callable[[], Optimizer],
) -> None:
    """``err.mean()`` is an ``np.float32``: a 0-d entry takes it as TF1 took a 0-d tensor."""
    err = np.array([0.5, -1.5, 2.25], F32)
    scalar = err.mean()
    assert isinstance(scalar, np.float32)
    assert not isinstance(scalar, np.ndarray)
    given, reference = (TrainState({"t": np.array(1.0, F32)}) for _ in range(2))
    opt_given, opt_reference = make(), make()
    for _ in range(3):
        opt_given.apply_gradients(given, {"t": scalar})
        opt_reference.apply_gradients(reference, [(np.asarray(scalar), "t")])
    assert given.global_step == reference.global_step == 3
    for name in reference:
        assert given[name].shape == reference[name].shape
        np.testing.assert_array_equal(given[name], reference[name], err_msg=name)
    assert given["t"] != np.float32(1.0)


def test_optimizer_numpy_scalar_gradient_is_checked_like_an_array() -> None:
    state = _state()
    with pytest.raises(ValueError, match=r"gradient of 'b' is numpy float32 \(\), but the "):
        SGD(0.1).apply_gradients(state, {"b": np.float32(0.5)})
    scalar_state = TrainState({"t": np.array(1.0, F32)})
    with pytest.raises(ValueError, match=r"gradient of 't' is numpy float64 \(\)"):
        SGD(0.1).apply_gradients(scalar_state, {"t": np.float64(0.5)})
    assert state.global_step == scalar_state.global_step == 0


def test_a_python_float_gradient_says_to_wrap_it_with_numpy_asarray() -> None:
    state = TrainState({"t": np.array(1.0, F32)})
    with pytest.raises(TypeError) as info:
        SGD(0.1).apply_gradients(state, {"t": 0.5})
    assert str(info.value) == (
        "GradientDescentOptimizer.apply_gradients: the gradient of 't' must be a NumPy or CuPy "
        "array or an IndexedSlices, got float; wrap it with numpy.asarray(...)"
    )
    assert state.global_step == 0
    np.testing.assert_array_equal(state["t"], 1.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: GradientDescentOptimizer(0.1),
        lambda: AdamOptimizer(0.1),
        lambda: MomentumOptimizer(0.1, 0.9, use_nesterov=True),
        lambda: RMSPropOptimizer(0.1, momentum=0.5, centered=True),
    ],
)
def test_dense_updates_of_cupy_variables_never_read_the_host(
    standin_cupy: StandinCupy, make: Any
) -> None:
    """float16 takes the ufunc path the stand-in CuPy runs (fused kernels need a GPU)."""
    cupy = standin_cupy.module
    start = np.linspace(-1, 1, 12).reshape(4, 3).astype(np.float16)
    device, host = TrainState({"w": cupy.asarray(start)}), TrainState({"w": start.copy()})
    on_device, on_host = make(), make()
    for step in range(3):
        grad = np.full((4, 3), step + 1, np.float16)
        standin_cupy.transfers.reset()
        on_device.apply_gradients(device, {"w": cupy.asarray(grad)})
        assert standin_cupy.transfers.to_host == 0
        on_host.apply_gradients(host, {"w": grad})
    np.testing.assert_allclose(device["w"].get(), host["w"], rtol=1e-3)
