"""One owner per capability: ``provides``, explicit owners, and the core's providers."""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import counting_step

import monitored
from monitored import TrainState
from monitored._core._capabilities import provider
from monitored.evaluation import evaluate_once
from monitored.metrics import Mean
from monitored.train import warm_start

#: An installed guard of the "nan_guard" kind that records the steps it saw.
GUARD_PLUGIN = """
provides = {"nan_guard"}
SEEN = []

def after_run(run_context):
    SEEN.append(run_context.session.state.global_step)
"""


class ExplicitGuard:
    """A hook object of the same kind, passed in ``hooks=[...]``."""

    provides = frozenset({"nan_guard"})

    def __init__(self) -> None:
        self.seen: list[int] = []

    def after_run(self, run_context: Any) -> None:
        self.seen.append(run_context.session.state.global_step)


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_an_explicit_hook_takes_the_capability_over_and_the_plugin_says_so_once(
    fake_plugin: Any, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib

    module = importlib.import_module(fake_plugin("guard", GUARD_PLUGIN, dist="third-guard"))
    caplog.set_level(logging.INFO, logger="monitored")
    mine = ExplicitGuard()
    async with monitored.MonitoredSession(state, hooks=[mine]) as sess:
        for _ in range(3):
            await sess.run(counting_step)
        assert [p.name for p in sess.plugins] == ["hooks[0]:ExplicitGuard"]
        [aside] = sess.stepped_aside
    assert mine.seen == [1, 2, 3]
    assert module.SEEN == [], "the installed plugin did not act"
    assert (aside.plugin.name, aside.capability) == ("guard", "nan_guard")
    assert said(caplog, "steps aside") == [
        "plugin 'guard' (third-guard 1.0) steps aside: ExplicitGuard in hooks[0] provides "
        "'nan_guard'"
    ]
    async with monitored.MonitoredSession(TrainState({"w": np.zeros(3)})) as sess:  # alone
        await sess.run(counting_step)
        assert sess.stepped_aside == ()
    assert module.SEEN == [1]


async def test_the_loaded_plugins_line_lists_a_plugin_that_stepped_aside_as_such(
    fake_plugin: Any, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    """An installed plugin left out of the line would read as one that is missing."""
    fake_plugin("guard", GUARD_PLUGIN, dist="third-guard")
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredSession(state, hooks=[ExplicitGuard()]):
        pass
    [line] = said(caplog, "Loaded plugins")
    assert (
        "guard (third-guard 1.0; stepped aside: ExplicitGuard in hooks[0] provides 'nan_guard')"
        in line
    )


async def test_plugins_of_other_capabilities_stay(fake_plugin: Any, state: TrainState) -> None:
    fake_plugin("guard", GUARD_PLUGIN)
    fake_plugin("other", "provides = ['progress']\ndef before_run(): pass\n")
    async with monitored.MonitoredSession(state, hooks=[ExplicitGuard()]) as sess:
        assert [p.name for p in sess.plugins] == ["hooks[0]:ExplicitGuard", "other"]


async def test_the_cluster_argument_takes_the_cluster_over(
    fake_plugin: Any, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    fake_plugin("engine", "provides = {'cluster'}\ndef cluster(session):\n    raise AssertionError")
    caplog.set_level(logging.INFO, logger="monitored")
    given = monitored.LocalCluster(is_chief=True)
    async with monitored.MonitoredSession(state, cluster=given) as sess:
        assert sess.cluster is given
    [line] = said(caplog, "steps aside")
    assert "the cluster= argument provides 'cluster'" in line


async def test_two_installed_providers_of_one_capability_are_an_error(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("guard", GUARD_PLUGIN, dist="guard-one")
    fake_plugin("guard2", GUARD_PLUGIN, dist="guard-two")
    with pytest.raises(monitored.PluginError) as info:
        async with monitored.MonitoredSession(state):
            pass
    assert str(info.value) == (
        "plugin 'guard' (distribution guard-one 1.0) and plugin 'guard2' (distribution "
        "guard-two 1.0) both provide 'nan_guard'; a capability has one owner: disable one of "
        "them (disable_plugins=['guard2'] or MONITORED_DISABLE_PLUGINS=guard2), or uninstall it"
    )
    async with monitored.MonitoredSession(TrainState(), disable_plugins=["guard2"]) as sess:
        assert [p.name for p in sess.plugins] == ["guard"]


@pytest.mark.parametrize("declared", ["'nan_guard'", "{'': 1}", "[1]", "42"])
async def test_provides_must_be_a_set_of_names(
    fake_plugin: Any, state: TrainState, declared: str
) -> None:
    fake_plugin("bad", f"provides = {declared}\ndef before_run(): pass\n", dist="monitored-bad")
    with pytest.raises(monitored.PluginValidationError) as info:
        async with monitored.MonitoredSession(state):
            pass
    assert str(info.value).startswith(
        "plugin 'bad' (distribution monitored-bad 1.0): provides must be a set of capability "
        "names such as {'checkpoint'}, got "
    )


async def test_a_hook_with_a_bad_provides_is_named(state: TrainState) -> None:
    class Bad:
        provides = "checkpoint"

        def end(self) -> None:
            pass

    with pytest.raises(monitored.PluginValidationError, match=r"hook 'hooks\[0\]:Bad'"):
        async with monitored.MonitoredSession(state, hooks=[Bad()]):
            pass


# -- a third-party checkpoint provider stands in for monitored-checkpoint ----------------------
#: A small "checkpoint" provider: one JSON file per checkpoint, ``<dir>/ckpt-<step>.json``.
FAKE_CHECKPOINTS = """
import json, os
import numpy as np

provides = {"checkpoint"}
chief_only = True
training_only = True
CALLS = []

def _path(directory, step, basename="ckpt"):
    return os.path.join(directory, f"{basename}-{step}.json")

def _steps(directory, basename="ckpt"):
    prefix = basename + "-"
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(int(n[len(prefix):-5]) for n in names if n.startswith(prefix))

def save(state, directory, plugin_states=None, basename="ckpt", step=None):
    os.makedirs(directory, exist_ok=True)
    step = state.global_step if step is None else step
    with open(_path(directory, step, basename), "w") as f:
        json.dump({"step": step, "arrays": {k: v.tolist() for k, v in state.items()},
                   "plugins": plugin_states or {}}, f)
    return _path(directory, step, basename)

def latest_checkpoint(checkpoint_dir):
    CALLS.append("latest_checkpoint")
    steps = _steps(checkpoint_dir)
    return _path(checkpoint_dir, steps[-1]) if steps else None

def list_checkpoints(checkpoint_dir):
    CALLS.append("list_checkpoints")
    listed = []
    for step in _steps(checkpoint_dir):
        with open(_path(checkpoint_dir, step)) as f:
            listed.append((_path(checkpoint_dir, step), step, json.load(f)["plugins"]))
    return listed

def save_checkpoint(state, checkpoint_dir, basename, step, plugin_states, max_to_keep):
    CALLS.append("save_checkpoint")
    path = save(state, checkpoint_dir, plugin_states, basename, step)
    if max_to_keep:
        for old in _steps(checkpoint_dir, basename)[:-max_to_keep]:
            os.remove(_path(checkpoint_dir, old, basename))
    return path

def read_checkpoint(path):
    CALLS.append("read_checkpoint")
    if os.path.isdir(path):
        path = latest_checkpoint(path)
    with open(path) as f:
        saved = json.load(f)
    return path, {k: np.asarray(v, np.float32) for k, v in saved["arrays"].items()}

def restore_checkpoint(state, path):
    CALLS.append("restore_checkpoint")
    with open(path) as f:
        saved = json.load(f)
    for name, value in saved["arrays"].items():
        if name in state:
            state[name][...] = value
        else:
            state[name] = np.asarray(value, np.float32)
    state.global_step = saved["step"]
    return path

class Saver:  # restores on start; saves every `every` steps (with the plugin states) and at the end
    def __init__(self, directory, every=None):
        self.directory, self.every = directory, every
    def restore_state(self, session):
        path = latest_checkpoint(self.directory)
        return None if path is None else restore_checkpoint(session.state, path)
    async def after_run(self, run_context):
        session = run_context.session
        if self.every and session.state.global_step % self.every == 0:
            save(session.state, self.directory, await session.plugin_states())
    def end(self, session):
        save(session.state, self.directory)

def training_hooks(config):
    CALLS.append("training_hooks")
    if config.checkpoint_dir is None:
        return None
    return [Saver(config.checkpoint_dir, config.save_checkpoint_steps)]

class Follower:  # new checkpoints as they appear, with reject() for unusable ones
    def __init__(self, checkpoint_dir, timeout):
        self.checkpoint_dir, self.timeout, self.seen = checkpoint_dir, timeout, set()
    def __aiter__(self):
        return self
    async def __anext__(self):
        path = latest_checkpoint(self.checkpoint_dir)
        if path is None or path in self.seen:
            raise StopAsyncIteration  # timeout=0 in these tests: one look
        self.seen.add(path)
        return path
    def reject(self, path, reason):
        CALLS.append("reject")

def checkpoints_iterator(checkpoint_dir, min_interval_secs, timeout, timeout_fn, poll_secs):
    CALLS.append("checkpoints_iterator")
    return Follower(checkpoint_dir, timeout)

def checkpoint_saver(saver):
    CALLS.append("checkpoint_saver")
    if saver is not None:
        raise TypeError("got a saver of another kind; pass None")
    return "the fake saver"

def checkpoint_hooks(checkpoint_dir, save_secs, saver, checkpoint_basename):
    CALLS.append("checkpoint_hooks")
    return [Saver(checkpoint_dir)]
"""


@pytest.fixture
def fake_checkpoints(fake_plugin: Any) -> Any:
    """A third-party provider of "checkpoint", the only one installed."""
    import importlib

    return importlib.import_module(fake_plugin("ckpt", FAKE_CHECKPOINTS, dist="fake-ckpt"))


def stepping(state: TrainState) -> None:
    state["w"] += 1
    state.global_step += 1


async def test_a_third_party_checkpoint_provider_serves_monitored_training_session(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    tmp_path = tmp_path / "checkpoints"
    for _ in range(2):  # the second run restores the first's checkpoint
        state = TrainState({"w": np.zeros(2, np.float32)})
        async with monitored.MonitoredTrainingSession(
            state, checkpoint_dir=str(tmp_path), hooks=[monitored.StopAtStepHook(num_steps=3)]
        ) as sess:
            while not sess.should_stop():
                await sess.run(stepping)
    assert state.global_step == 6
    np.testing.assert_array_equal(state["w"], [6, 6])
    assert sorted(os.listdir(tmp_path)) == ["ckpt-3.json", "ckpt-6.json"]


async def test_a_third_party_checkpoint_provider_serves_the_evaluation_and_warm_start(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    tmp_path = tmp_path / "checkpoints"
    state = TrainState({"w": np.full(2, 4.0, np.float32)})
    state.global_step = 7
    fake_checkpoints.save(state, str(tmp_path))

    def eval_step(state: TrainState, batch: Any, metrics: Any) -> None:
        metrics["w"].update(state["w"].sum() * batch)

    result = await evaluate_once(eval_step, {"w": Mean()}, input=[1.0], checkpoint_dir=tmp_path)
    assert (result.global_step, result.metrics["w"]) == (7, 8.0)
    fresh = TrainState({"w": np.zeros(2, np.float32)})
    assert warm_start(fresh, str(tmp_path), ["w"]) == {"w": "w"}
    np.testing.assert_array_equal(fresh["w"], [4, 4])
    assert {
        "checkpoints_iterator",
        "latest_checkpoint",
        "restore_checkpoint",
        "read_checkpoint",
    } <= set(fake_checkpoints.CALLS)


async def test_a_third_party_checkpoint_provider_serves_the_supervisor(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    tmp_path = tmp_path / "checkpoints"
    state = TrainState({"w": np.zeros(2, np.float32)})
    sv = monitored.Supervisor(state, logdir=tmp_path, summary_op=None, save_summaries_secs=0)
    assert sv.saver == "the fake saver"
    async with sv.managed_session() as sess:
        for _ in range(2):
            await sess.run(stepping)
    assert os.listdir(tmp_path) == ["ckpt-2.json"]
    with pytest.raises(monitored.UnsupportedArgumentError, match="got a saver of another kind"):
        monitored.Supervisor(state, logdir=tmp_path, saver=object())


class Counts:
    """A hook whose state (steps seen) is saved in checkpoints and restored with them."""

    plugin_name = "counts"

    def __init__(self) -> None:
        self.steps = 0
        self.loaded: list[int] = []

    def after_run(self) -> None:
        self.steps += 1

    def plugin_state(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_plugin_state(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]
        self.loaded.append(self.steps)


async def test_a_third_party_checkpoint_provider_serves_a_nan_rollback(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    """The NaN guard lists and restores checkpoints through the provider, plugin states too."""
    from monitored_nan_guard import NanTensorHook, Rollback

    seen: list[Rollback] = []
    guard = NanTensorHook("loss", on_nan="rollback", on_rollback=seen.append)
    counts = Counts()
    poisoned = {7}

    def step(state: TrainState) -> dict[str, Any]:
        stepping(state)
        if state.global_step in poisoned:
            poisoned.discard(state.global_step)
            return {"loss": np.float32(np.nan)}
        return {"loss": state["w"].sum()}

    state = TrainState({"w": np.zeros(2, np.float32)})
    async with monitored.MonitoredTrainingSession(
        state,
        checkpoint_dir=str(tmp_path),
        save_checkpoint_secs=None,
        save_checkpoint_steps=3,
        hooks=[guard, counts, monitored.StopAtStepHook(last_step=10)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    [rollback] = seen
    assert (rollback.failed_step, rollback.restored_step) == (7, 6)
    assert rollback.path == os.path.join(tmp_path, "ckpt-6.json")
    assert state.global_step == 10
    np.testing.assert_array_equal(state["w"], [10, 10])  # w follows the global step again
    assert counts.loaded == [6], "its state went back to step 6 with the checkpoint"
    assert {"list_checkpoints", "restore_checkpoint"} <= set(fake_checkpoints.CALLS)


async def test_a_third_party_checkpoint_provider_serves_early_stoppings_best_checkpoint(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    from monitored_early_stopping import EarlyStoppingHook

    losses = [5.0, 4.0, 3.0, 3.5, 3.6, 3.7, 3.8]
    best = tmp_path / "best"
    hook = EarlyStoppingHook("loss", patience=2, restore_best=True, best_checkpoint_dir=best)

    def step(state: TrainState) -> dict[str, Any]:
        stepping(state)
        return {"loss": np.float32(losses[state.global_step - 1])}

    state = TrainState({"w": np.zeros(2, np.float32)})
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert hook.best_checkpoint == os.path.join(best, "best-3.json")
    assert os.listdir(best) == ["best-3.json"], "max_to_keep=1: the older bests are gone"
    assert state.global_step == 5, "the step count stays"
    np.testing.assert_array_equal(state["w"], [3, 3])  # the arrays of step 3, the best
    assert fake_checkpoints.CALLS.count("save_checkpoint") == 3


async def test_rollback_and_best_checkpoints_without_a_provider_name_the_package(
    fake_plugin: Any, tmp_path: Path
) -> None:
    from monitored_early_stopping import EarlyStoppingHook
    from monitored_nan_guard import NanTensorHook

    fake_plugin("other", "def before_run(): pass")
    hint = (
        "with a 'checkpoint' plugin, but no installed plugin provides it (pip install "
        "monitored-checkpoint, or from a clone of monitored: pip install ./plugins/checkpoint)"
    )
    for hook, needs in [
        (
            NanTensorHook("loss", on_nan="rollback", checkpoint_dir=tmp_path),
            "NanTensorHook: on_nan='rollback' restores checkpoints",
        ),
        (
            EarlyStoppingHook("loss", restore_best=True, best_checkpoint_dir=tmp_path),
            "EarlyStoppingHook: best_checkpoint_dir saves and restores checkpoints",
        ),
    ]:
        with pytest.raises(monitored.MissingPluginError) as info:
            async with monitored.MonitoredSession(TrainState(), hooks=[hook]):
                pass
        assert str(info.value) == f"{needs} {hint}"


@pytest.mark.parametrize(
    ("hook", "lacks"),
    [("nan", "list_checkpoints"), ("early", "save_checkpoint")],
)
async def test_a_provider_without_the_hooks_a_plugin_needs_fails_when_the_session_starts(
    fake_plugin: Any, tmp_path: Path, hook: str, lacks: str
) -> None:
    from monitored_early_stopping import EarlyStoppingHook
    from monitored_nan_guard import NanTensorHook

    fake_plugin("partial", "provides = {'checkpoint'}\ndef restore_checkpoint(state, path): pass")
    made = (
        NanTensorHook("loss", on_nan="rollback", checkpoint_dir=tmp_path)
        if hook == "nan"
        else EarlyStoppingHook("loss", restore_best=True, best_checkpoint_dir=tmp_path)
    )
    with pytest.raises(monitored.PluginError, match=f"does not implement the '{lacks}' hook"):
        async with monitored.MonitoredSession(TrainState(), hooks=[made]):
            pass


async def test_a_provider_that_answers_with_the_wrong_shape_is_named(
    fake_plugin: Any, tmp_path: Path
) -> None:
    from monitored_early_stopping import EarlyStoppingHook
    from monitored_nan_guard import NanTensorHook, RollbackError

    fake_plugin(
        "odd",
        "provides = {'checkpoint'}\n"
        "def restore_checkpoint(state, path): return path\n"
        "def list_checkpoints(checkpoint_dir): return ['ckpt-1']\n"
        "def save_checkpoint(state, checkpoint_dir, basename, step): return None\n",
        dist="odd-ckpt",
    )

    def nan_at_two(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(np.nan if state.global_step == 2 else 1.0)}

    guard = NanTensorHook("loss", on_nan="rollback", checkpoint_dir=tmp_path)
    with pytest.raises(monitored.PluginError) as info:
        async with monitored.MonitoredSession(TrainState(), hooks=[guard]) as sess:
            for _ in range(2):
                await sess.run(nan_at_two)
    assert str(info.value) == (
        "hook 'list_checkpoints' of plugin 'odd' (distribution odd-ckpt 1.0) returned "
        "['ckpt-1']; a sequence of (path, global step, plugin states) was expected"
    )
    assert not isinstance(info.value, RollbackError)
    stopper = EarlyStoppingHook("loss", restore_best=True, best_checkpoint_dir=tmp_path)
    with pytest.raises(monitored.PluginError, match="returned None; the path of the checkpoint"):
        async with monitored.MonitoredSession(TrainState(), hooks=[stopper]) as sess:
            await sess.run(nan_at_two)


async def test_a_rollback_passes_over_a_checkpoint_gone_before_it_is_restored(
    fake_checkpoints: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Listed, then deleted (a saver's rotation): the next older one is restored."""
    from monitored_nan_guard import NanTensorHook

    for step in (2, 4):
        saved = TrainState({"w": np.full(2, float(step), np.float32)})
        saved.global_step = step
        fake_checkpoints.save(saved, str(tmp_path))
    real = fake_checkpoints.list_checkpoints

    def listed_then_gone(checkpoint_dir: str) -> Any:
        listing = real(checkpoint_dir)
        os.remove(os.path.join(checkpoint_dir, "ckpt-4.json"))
        return listing

    fake_checkpoints.list_checkpoints = listed_then_gone
    guard = NanTensorHook("loss", on_nan="rollback", checkpoint_dir=tmp_path)
    state = TrainState({"w": np.zeros(2, np.float32)})
    state.global_step = 4

    def nan_once(state: TrainState) -> dict[str, Any]:
        stepping(state)
        return {"loss": np.float32(np.nan if not guard.rollbacks else 1.0)}

    async with monitored.MonitoredSession(state, hooks=[guard]) as sess:
        await sess.run(nan_once)
    [rollback] = guard.rollbacks
    assert (rollback.failed_step, rollback.restored_step) == (5, 2)
    [warned] = [r.getMessage() for r in caplog.records if "cannot roll back" in r.getMessage()]
    assert "ckpt-4.json" in warned


async def test_a_rollback_with_every_older_checkpoint_gone_is_a_rollback_error(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    from monitored_nan_guard import NanLossDuringTrainingError, NanTensorHook, RollbackError

    saved = TrainState({"w": np.zeros(2, np.float32)})
    saved.global_step = 2
    fake_checkpoints.save(saved, str(tmp_path))
    real = fake_checkpoints.list_checkpoints

    def listed_then_gone(checkpoint_dir: str) -> Any:
        listing = real(checkpoint_dir)
        os.remove(os.path.join(checkpoint_dir, "ckpt-2.json"))
        return listing

    fake_checkpoints.list_checkpoints = listed_then_gone
    guard = NanTensorHook("loss", on_nan="rollback", checkpoint_dir=tmp_path)
    state = TrainState({"w": np.zeros(2, np.float32)})
    state.global_step = 4

    def nan(state: TrainState) -> dict[str, Any]:
        stepping(state)
        return {"loss": np.float32(np.nan)}

    with pytest.raises(RollbackError) as info:
        async with monitored.MonitoredSession(state, hooks=[guard]) as sess:
            await sess.run(nan)
    assert str(info.value) == (
        f"NanTensorHook: loss = nan at step 5, and none of the checkpoints of {tmp_path} "
        "older than step 5 could be restored"
    )
    assert isinstance(info.value.__cause__, NanLossDuringTrainingError)


async def test_the_sessions_own_checkpoint_owner_serves_first(
    fake_checkpoints: Any, tmp_path: Path
) -> None:
    """An explicit hook that provides "checkpoint" and implements its hooks serves the
    session (a rollback there uses it), even with the installed provider disabled."""

    class Mine:
        provides = frozenset({"checkpoint"})

        @staticmethod
        def list_checkpoints(checkpoint_dir: str) -> list[Any]:
            return []

    async with monitored.MonitoredSession(TrainState(), hooks=[Mine()]) as sess:
        assert monitored.provider("checkpoint", session=sess).info.name == "hooks[0]:Mine"
        assert monitored.provider("checkpoint").info.name == "ckpt"
    async with monitored.MonitoredSession(TrainState()) as sess:
        assert monitored.provider("checkpoint", session=sess).info.name == "ckpt"

    class Plain:  # provides it, but serves no capability hook: the installed one does
        provides = frozenset({"checkpoint"})

        def end(self) -> None:
            pass

    async with monitored.MonitoredSession(TrainState(), hooks=[Plain()]) as sess:
        assert monitored.provider("checkpoint", session=sess).info.name == "ckpt"


async def test_a_provider_without_a_needed_capability_hook_is_named(
    fake_plugin: Any, tmp_path: Path
) -> None:
    fake_plugin("partial", "provides = {'checkpoint'}\n", dist="partial-ckpt")
    with pytest.raises(monitored.PluginError) as info:
        warm_start(TrainState({"w": np.zeros(2)}), str(tmp_path), ["w"])
    assert str(info.value) == (
        "plugin 'partial' (distribution partial-ckpt 1.0) provides 'checkpoint' but does not "
        "implement the 'read_checkpoint' hook, which a checkpoint provider needs here"
    )
    assert info.value.hook == "read_checkpoint"


def test_no_provider_names_the_package_to_install(fake_plugin: Any) -> None:
    fake_plugin("other", "def before_run(): pass")
    with pytest.raises(monitored.MissingPluginError) as info:
        provider("checkpoint", "the test reads checkpoints", "; or do without")
    assert str(info.value) == (
        "the test reads checkpoints with a 'checkpoint' plugin, but no installed plugin "
        "provides it (pip install monitored-checkpoint, or from a clone of monitored: pip "
        "install ./plugins/checkpoint); or do without"
    )
    assert info.value.distribution == "monitored-checkpoint"


def test_no_provider_without_a_reason_still_names_the_package(fake_plugin: Any) -> None:
    fake_plugin("other", "def before_run(): pass")
    with pytest.raises(monitored.MissingPluginError) as info:
        monitored.provider("checkpoint")
    assert str(info.value) == (
        "a 'checkpoint' plugin is needed, but no installed plugin provides it (pip install "
        "monitored-checkpoint, or from a clone of monitored: pip install ./plugins/checkpoint)"
    )


def test_a_disabled_provider_is_named_as_disabled(
    fake_checkpoints: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "checkpoint")
    assert provider("checkpoint", "x").info.name == "ckpt", "ours is disabled, not this one"
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "ckpt,checkpoint")
    with pytest.raises(monitored.MissingPluginError, match="'checkpoint' plugin, which provides"):
        provider("checkpoint", "x")


def test_a_capability_hook_must_be_synchronous(fake_plugin: Any, tmp_path: Path) -> None:
    fake_plugin(
        "async-ckpt",
        "provides = {'checkpoint'}\nasync def read_checkpoint(path):\n    return None\n",
    )
    with pytest.raises(monitored.PluginError, match="capability hooks are called synchronously"):
        warm_start(TrainState({"w": np.zeros(2)}), str(tmp_path), ["w"])


def test_the_core_never_imports_a_plugin_package_by_name() -> None:
    core = Path(monitored.__file__).parent
    plugin_packages = [
        "monitored_checkpoint",
        "monitored_summaries",
        "monitored_nan_guard",
        "monitored_early_stopping",
        "monitored_progress",
        "monitored_mpi",
    ]
    for path in core.rglob("*.py"):
        code = [
            line.strip()
            for line in path.read_text().splitlines()
            if line.strip().startswith(("import ", "from "))
        ]
        for name in plugin_packages:
            assert not any(name in line for line in code), f"{path} imports {name}"
    assert not hasattr(monitored._core._errors, "import_plugin")


def test_no_plugin_package_imports_another_plugin_package_by_name() -> None:
    """Only a plugin package imports itself: another's capability is reached through
    ``monitored.provider`` and the capability hooks, so a third party can stand in."""
    plugins = Path(__file__).parents[2] / "plugins"
    packages = {
        package.name: package
        for package in plugins.glob("*/src/*")
        if (package / "__init__.py").is_file()
    }
    assert {"monitored_checkpoint", "monitored_nan_guard"} <= set(packages)
    for name, package in packages.items():
        others = set(packages) - {name}
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imported = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    imported = [node.module or ""] if node.level == 0 else []
                elif (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", getattr(node.func, "id", None))
                    in {"import_module", "__import__"}
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    imported = [str(node.args[0].value)]
                else:
                    continue
                for module in imported:
                    assert module.partition(".")[0] not in others, (
                        f"{path.relative_to(plugins)}:{node.lineno} imports {module}"
                    )


async def test_a_takeover_by_the_plugins_own_hook_is_no_news_another_packages_is(
    fake_plugin: Any, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin's own hook passed in hooks=[...] (``SummarySaverHook`` for the summaries
    plugin) is a takeover asked for: DEBUG; a hook from elsewhere, or an argument: INFO."""
    import importlib

    module_name = fake_plugin("guard", GUARD_PLUGIN + HOOK_CLASS, dist="third-guard")
    own_hook = importlib.import_module(module_name).OwnGuard()
    caplog.set_level(logging.DEBUG, logger="monitored")
    async with monitored.MonitoredSession(state, hooks=[own_hook]) as sess:
        [aside] = sess.stepped_aside
    assert aside.asked
    [record] = [r for r in caplog.records if "steps aside" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert "OwnGuard in hooks[0] provides 'nan_guard'" in record.getMessage()
    caplog.clear()
    async with monitored.MonitoredSession(TrainState({"w": np.zeros(3)}), hooks=[ExplicitGuard()]):
        pass
    [record] = [r for r in caplog.records if "steps aside" in r.getMessage()]
    assert record.levelno == logging.INFO


HOOK_CLASS = """
class OwnGuard:
    provides = frozenset({"nan_guard"})

    def after_run(self, run_context):
        pass
"""
