"""TrainState: validation, finalization and RNG state."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from monitored import TrainState, decode_rng_state, encode_rng_state


def test_entries_must_be_arrays() -> None:
    with pytest.raises(TypeError, match="entry 'lr' must be a NumPy or CuPy array, got float"):
        TrainState({"lr": 0.1})
    with pytest.raises(TypeError, match="non-empty strings"):
        TrainState({"": np.zeros(1)})


def test_global_step_must_be_a_non_negative_int() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="global_step must be a non-negative integer"):
            TrainState(global_step=bad)  # type: ignore[arg-type]
    assert TrainState(global_step=np.int64(3)).global_step == 3


def test_seed_and_rng_are_exclusive() -> None:
    with pytest.raises(ValueError, match="either seed or rng"):
        TrainState(seed=1, rng=np.random.default_rng(1))


def test_missing_entry_lists_what_exists() -> None:
    state = TrainState({"w": np.zeros(1)})
    with pytest.raises(KeyError, match=r"no entry 'b'; it has \['w'\]"):
        state["b"]


def test_after_finalize_entries_keep_names_shapes_and_dtypes() -> None:
    state = TrainState({"w": np.zeros(3, np.float32)})
    state.finalize()
    state["w"] = np.ones(3, np.float32)  # same shape and dtype: fine
    with pytest.raises(
        ValueError,
        match=r"'w' is numpy float32 \(3,\); cannot replace it with numpy float64 \(3,\)",
    ):
        state["w"] = np.ones(3)
    with pytest.raises(ValueError, match=r"float32 \(4,\)"):
        state["w"] = np.ones(4, np.float32)
    with pytest.raises(KeyError, match="cannot add TrainState entry 'b'"):
        state["b"] = np.ones(1)
    with pytest.raises(KeyError, match="cannot delete TrainState entry 'w'"):
        del state["w"]


def test_mapping_protocol_and_repr() -> None:
    state = TrainState({"w": np.zeros(2), "b": np.zeros(1)})
    del state["b"]
    assert list(state) == ["w"]
    assert len(state) == 1
    assert "w" in state
    assert repr(state) == "TrainState(global_step=0, {w: numpy float64 (2,)})"


def test_rng_state_round_trips_through_json_and_resumes_exactly() -> None:
    state = TrainState(seed=42)
    state.rng.normal(size=5)
    saved = json.loads(json.dumps(state.rng_state))
    expected = state.rng.normal(size=5)
    other = TrainState(seed=0)
    other.rng_state = saved
    np.testing.assert_array_equal(other.rng.normal(size=5), expected)


def test_rng_state_of_another_bit_generator_is_refused() -> None:
    state = TrainState(rng=np.random.Generator(np.random.MT19937(0)))
    with pytest.raises(ValueError, match="'PCG64', but this TrainState uses 'MT19937'"):
        state.rng_state = TrainState(seed=0).rng_state


@pytest.mark.parametrize(
    "generator", [np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64]
)
def test_every_bit_generator_state_survives_json_encoded(generator: Any) -> None:
    state = TrainState(rng=np.random.Generator(generator(7)))
    state.rng.random(3)
    encoded = json.loads(json.dumps(encode_rng_state(state.rng_state)))
    other = TrainState(rng=np.random.Generator(generator(99)))
    other.rng_state = decode_rng_state(encoded)
    assert other.rng.random(5).tolist() == state.rng.random(5).tolist()


@pytest.mark.parametrize(
    ("array", "message"),
    [
        ({"__ndarray__": "S" + "9" * 100, "data": []}, r"the dtype 'S9{75}\.\.\.$"),
        ({"__ndarray__": "uint64", "data": [1] * 70_000}, "at most 65536 items"),
        ({"__ndarray__": "uint32", "data": "1234"}, "at most 65536 items"),
        ({"__ndarray__": "uint32", "data": [1, 2.5]}, "holds non-integers"),
        ({"__ndarray__": "uint32", "data": [True]}, "holds non-integers"),
    ],
)
def test_a_hostile_encoded_rng_state_is_refused_before_allocating(
    array: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        decode_rng_state({"bit_generator": "Philox", "state": {"key": [array]}})


def test_a_boolean_in_an_encoded_rng_state_is_refused() -> None:
    # NumPy would take `false` for the state 0 (found by the checkpoint fuzzer).
    state = TrainState(seed=1).rng_state
    state["state"]["state"] = False
    with pytest.raises(ValueError, match="holds the boolean False where integers belong"):
        decode_rng_state(encode_rng_state(state))


# -- the trainable marker (issue 17, gap 7) ---------------------------------------------------


def test_entries_are_trainable_unless_marked() -> None:
    from monitored.train.optimizers import trainable_variables

    state = TrainState(
        {"w": np.ones(2, np.float32), "bn/mean": np.zeros(2, np.float32)},
        non_trainable=["bn/mean"],
    )
    state.add("loss_avg", np.zeros((), np.float32), trainable=False)
    state.add("b", np.zeros(2, np.float32))
    assert [state.is_trainable(n) for n in ("w", "bn/mean", "loss_avg", "b")] == [
        True,
        False,
        False,
        True,
    ]
    assert trainable_variables(state) == ["w", "b"]
    assert state.non_trainable == {"bn/mean", "loss_avg"}
    state.set_trainable("loss_avg", True)
    state.set_trainable("w", False)
    assert trainable_variables(state) == ["loss_avg", "b"]


def test_marker_survives_replacing_and_restoring_an_entry() -> None:
    state = TrainState(non_trainable=["stat"])  # declared before the entry exists
    state["stat"] = np.zeros(3)  # what a checkpoint restore into an empty state does
    assert not state.is_trainable("stat")
    state["stat"] = np.ones(3)
    state.finalize()
    state["stat"] = np.full(3, 2.0)
    assert not state.is_trainable("stat")


def test_add_refuses_an_existing_entry_and_bad_flags() -> None:
    state = TrainState({"w": np.ones(2)})
    with pytest.raises(KeyError, match="already has an entry 'w'"):
        state.add("w", np.zeros(2))
    with pytest.raises(TypeError, match="trainable must be True or False, got 0"):
        state.add("v", np.zeros(2), trainable=0)  # type: ignore[arg-type]
    assert "v" not in state
    with pytest.raises(KeyError, match="no entry 'ww'; did you mean 'w'"):
        state.set_trainable("ww", False)
    with pytest.raises(TypeError, match="not the string 'w'"):
        TrainState(non_trainable="w")


def test_a_misspelled_non_trainable_name_fails_when_the_session_is_created() -> None:
    state = TrainState({"bn/mean": np.zeros(2)}, non_trainable=["bn/maen"])
    with pytest.raises(KeyError, match=r"'bn/maen' \(did you mean 'bn/mean'\?\)"):
        state.finalize()
    assert not state.finalized


def test_deleting_an_entry_drops_its_marker() -> None:
    state = TrainState({"stat": np.zeros(2)}, non_trainable=["stat"])
    del state["stat"]
    assert "stat" not in state.non_trainable
    state.finalize()  # nothing declared is missing


async def test_a_misspelled_non_trainable_name_fails_the_session_cleanly() -> None:
    import monitored

    state = TrainState(non_trainable=["input/maen"])

    def init_fn(state: TrainState) -> None:
        state["input/mean"] = np.zeros(2)

    with pytest.raises(KeyError, match=r"'input/maen' \(did you mean 'input/mean'\?\)"):
        async with monitored.MonitoredSession(state, scaffold=monitored.Scaffold(init_fn=init_fn)):
            pass  # pragma: no cover - never entered
    assert not state.finalized
