"""warm_start: copy a subset of another run's checkpoint into a state, or change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from _helpers import hide_plugins

import monitored
from monitored import MissingPluginError, Supervisor, UnsupportedArgumentError
from monitored.train import AdamOptimizer, WarmStartError, warm_start
from monitored_checkpoint import CheckpointNotFoundError, CorruptCheckpointError, Saver


@pytest.fixture
def pretrained(tmp_path: Path) -> Path:
    """A directory with two checkpoints of a "pre-trained" run (steps 10 and 20)."""
    state = monitored.TrainState(
        {
            "encoder/w": np.full((2, 3), 1.0, np.float32),
            "encoder/b": np.full(3, 2.0, np.float32),
            "head/w": np.full((3, 4), 3.0, np.float32),
            "old_name": np.arange(4, dtype=np.int64),
        },
        seed=0,
    )
    saver = Saver()
    state.global_step = 10
    saver.save(state, tmp_path / "pre" / "model.ckpt", global_step=10)
    state["encoder/w"] += 1
    state.global_step = 20
    saver.save(state, tmp_path / "pre" / "model.ckpt", global_step=20)
    return tmp_path / "pre"


def new_state() -> monitored.TrainState:
    return monitored.TrainState(
        {
            "encoder/w": np.zeros((2, 3), np.float32),
            "encoder/b": np.zeros(3, np.float32),
            "head/w": np.zeros((3, 5), np.float32),  # a new head: another shape
            "new_name": np.zeros(4, np.int64),
            "step_size": np.full((), 0.5, np.float32),
        },
        seed=1,
    )


def snapshot(state: monitored.TrainState) -> dict[str, bytes]:
    return {name: state[name].tobytes() for name in state}


def test_a_regex_selects_entries_from_the_newest_checkpoint_in_place(pretrained: Path) -> None:
    state = new_state()
    encoder_w = state["encoder/w"]
    copied = warm_start(state, pretrained, "encoder/.*")
    assert copied == {"encoder/w": "encoder/w", "encoder/b": "encoder/b"}
    np.testing.assert_array_equal(state["encoder/w"], np.full((2, 3), 2.0))
    np.testing.assert_array_equal(state["encoder/b"], np.full(3, 2.0))
    assert state["encoder/w"] is encoder_w, "filled in place: references stay valid"
    np.testing.assert_array_equal(state["head/w"], 0)
    assert state.global_step == 0, "the global step is not warm-started"


def test_the_regex_matches_at_the_start_of_names_as_tf_does(pretrained: Path) -> None:
    state = new_state()
    assert sorted(warm_start(state, pretrained, "encoder")) == ["encoder/b", "encoder/w"]


def test_a_checkpoint_path_names_that_checkpoint(pretrained: Path) -> None:
    state = new_state()
    warm_start(state, pretrained / "model.ckpt-10", ["encoder/w"])
    np.testing.assert_array_equal(state["encoder/w"], np.full((2, 3), 1.0))


def test_name_map_copies_renamed_entries(pretrained: Path) -> None:
    state = new_state()
    copied = warm_start(state, pretrained, ["new_name"], name_map={"old_name": "new_name"})
    assert copied == {"new_name": "old_name"}
    np.testing.assert_array_equal(state["new_name"], np.arange(4))


def test_none_selects_the_trainable_entries(pretrained: Path) -> None:
    state = monitored.TrainState({"encoder/w": np.zeros((2, 3), np.float32)}, seed=0)
    state.add("encoder/b", np.zeros(3, np.float32), trainable=False)
    assert warm_start(state, pretrained, None) == {"encoder/w": "encoder/w"}


def adam_state(value: float) -> monitored.TrainState:
    """A model with Adam's slots and counters, a non-trainable statistic and an int."""
    state = monitored.TrainState({"w": np.full(2, value, np.float32)}, seed=0)
    AdamOptimizer(0.1).create_slots(state)
    state.add("bn/moving_mean", np.full(2, value, np.float32), trainable=False)
    state.add("count", np.full(2, value, np.int64))
    for name in state:
        state[name][...] = value
    return state


@pytest.fixture
def pretrained_with_slots(tmp_path: Path) -> Path:
    Saver().save(adam_state(7.0), tmp_path / "adam" / "model.ckpt", global_step=100)
    return tmp_path / "adam"


@pytest.mark.parametrize("wanted", [".*", "w", None])
def test_a_regex_or_none_leaves_slots_counters_and_non_trainable_entries_fresh(
    pretrained_with_slots: Path, wanted: str | None
) -> None:
    """TF1: a regex considers only TRAINABLE_VARIABLES, so a fine-tune gets fresh slots."""
    state = adam_state(0.0)
    assert warm_start(state, pretrained_with_slots, wanted) == {"w": "w"}
    np.testing.assert_array_equal(state["w"], 7.0)
    for name in ("w/Adam/m", "w/Adam/v", "Adam/beta1_power", "bn/moving_mean", "count"):
        np.testing.assert_array_equal(state[name], 0, err_msg=name)


def test_a_list_of_names_copies_slots_and_non_trainable_entries(
    pretrained_with_slots: Path,
) -> None:
    state = adam_state(0.0)
    wanted = ["w/Adam/m", "Adam/beta1_power", "bn/moving_mean", "count"]
    assert sorted(warm_start(state, pretrained_with_slots, wanted)) == sorted(wanted)
    for name in wanted:
        np.testing.assert_array_equal(state[name], 7, err_msg=name)
    np.testing.assert_array_equal(state["w"], 0)
    np.testing.assert_array_equal(state["w/Adam/v"], 0)


def test_a_listed_name_is_exact_not_a_tf1_scope(pretrained_with_slots: Path) -> None:
    state = adam_state(0.0)
    assert warm_start(state, pretrained_with_slots, ["w"]) == {"w": "w"}
    np.testing.assert_array_equal(state["w/Adam/m"], 0)


def test_a_regex_matching_only_slots_says_to_list_them(pretrained_with_slots: Path) -> None:
    state = adam_state(0.0)
    with pytest.raises(WarmStartError, match=r"it matches \['w/Adam/m', 'w/Adam/v'\].*list"):
        warm_start(state, pretrained_with_slots, "w/Adam")
    np.testing.assert_array_equal(state["w/Adam/m"], 0)


@pytest.mark.parametrize(
    ("wanted", "name_map", "match"),
    [
        (".*", None, r"no entries \['step_size'\].*shape \(3, 4\).*\(3, 5\)"),
        (["head/w"], None, r"'head/w' has shape \(3, 4\) in the checkpoint and \(3, 5\)"),
        (["new_name"], {"encoder/b": "new_name"}, r"'new_name' \(from 'encoder/b'\) has shape"),
        (["new_name"], {"encoder/w": "new_name"}, "dtype float32 in the checkpoint and int64"),
        (["missing"], None, r"the state has no entries \['missing'\]"),
        ("nothing.*", None, r"matches no trainable entry of the state \(its trainable"),
        ("new_name", None, r"it matches \['new_name'\], which are not trainable"),
        ("(", None, "not a regular expression"),
        (["encoder/w", "encoder/w"], None, "names an entry twice"),
        ([], None, "empty"),
        (["encoder/w"], {"a": "nope"}, r"name_map targets \['nope'\], which the state"),
        (["encoder/w"], {"a": "encoder/b"}, "vars_to_warm_start does not select"),
        (".*", {"a": "encoder/b", "b": "encoder/b"}, "maps both 'a' and 'b'"),
    ],
)
def test_problems_are_named_and_change_nothing(
    pretrained: Path, wanted: Any, name_map: Any, match: str
) -> None:
    state = new_state()
    before = snapshot(state)
    with pytest.raises(WarmStartError, match=match):
        warm_start(state, pretrained, wanted, name_map=name_map)
    assert snapshot(state) == before


def test_a_damaged_checkpoint_is_the_plugins_error_and_changes_nothing(pretrained: Path) -> None:
    data = pretrained / "model.ckpt-20.safetensors"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    state = new_state()
    before = snapshot(state)
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        warm_start(state, pretrained, "encoder/.*")
    assert snapshot(state) == before


def test_no_checkpoint_there_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="empty"):
        warm_start(new_state(), tmp_path / "empty", "encoder/.*")


def test_bad_arguments(pretrained: Path) -> None:
    with pytest.raises(UnsupportedArgumentError, match="vocabulary"):
        warm_start(new_state(), pretrained, var_name_to_vocab_info={"a": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TrainState"):
        warm_start({"w": 1}, pretrained)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must hold names"):
        warm_start(new_state(), pretrained, [1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="mapping"):
        warm_start(new_state(), pretrained, name_map=[("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="names to names"):
        warm_start(new_state(), pretrained, name_map={"a": 1})  # type: ignore[dict-item]
    state = monitored.TrainState({"i": np.zeros(2, np.int64)})
    with pytest.raises(WarmStartError, match="no trainable entries"):
        warm_start(state, pretrained, None)


def test_without_the_checkpoint_plugin_the_package_is_named(
    pretrained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide_plugins(monkeypatch, "checkpoint")
    with pytest.raises(MissingPluginError, match="pip install monitored-checkpoint"):
        warm_start(new_state(), pretrained, "encoder/.*")


def test_the_pretrained_model_scenario_end_to_end(pretrained: Path, tmp_path: Path) -> None:
    """init_fn warm-starts a new run; its restart restores its own checkpoint instead."""
    calls: list[int] = []

    def init_fn(state: monitored.TrainState) -> None:
        calls.append(1)
        warm_start(state, pretrained, "encoder/.*")

    def step(state: monitored.TrainState) -> None:
        state["head/w"] += 1
        state.global_step += 1

    async def run(steps: int) -> monitored.TrainState:
        state = new_state()
        sv = Supervisor(state, logdir=tmp_path / "new", init_fn=init_fn)
        async with sv.managed_session() as sess:
            while state.global_step < steps:
                await sess.run(step)
        return state

    first = anyio.run(run, 3)
    assert calls == [1]
    np.testing.assert_array_equal(first["encoder/w"], np.full((2, 3), 2.0))
    second = anyio.run(run, 5)
    assert calls == [1], "a run with its own checkpoint is not warm-started again"
    np.testing.assert_array_equal(second["head/w"], np.full((3, 5), 5.0))
    np.testing.assert_array_equal(second["encoder/w"], np.full((2, 3), 2.0))


def test_a_directory_beside_a_same_named_config_file_is_the_directory(pretrained: Path) -> None:
    """``runs/pretrained/`` and its config ``runs/pretrained.json`` side by side."""
    (pretrained.parent / f"{pretrained.name}.json").write_text('{"layers": 2}')
    state = new_state()
    assert warm_start(state, pretrained, ["encoder/w"]) == {"encoder/w": "encoder/w"}
    np.testing.assert_array_equal(state["encoder/w"], np.full((2, 3), 2.0))


def test_the_checkpoint_found_in_a_directory_is_named_escaped(
    pretrained: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34 §2: the newest checkpoint of a directory (whose name holds control
    characters, a newline and bytes that are not UTF-8) is named escaped, on one line."""
    import logging
    import os

    from _hostile import HOSTILE_NAME, assert_safe_line

    directory = tmp_path / HOSTILE_NAME
    os.rename(pretrained, directory)
    with caplog.at_level(logging.INFO, logger="monitored"):
        warm_start(new_state(), directory, "encoder/")
    (line,) = [r.getMessage() for r in caplog.records if "Warm-started" in r.getMessage()]
    assert_safe_line(line)
    with pytest.raises(WarmStartError) as info:
        warm_start(new_state(), directory, "head/")  # another shape
    assert_safe_line(str(info.value))
