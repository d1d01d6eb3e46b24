"""One owner per capability: ``provides``, explicit owners, and the core's providers."""

from __future__ import annotations

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

def _path(directory, step):
    return os.path.join(directory, f"ckpt-{step}.json")

def save(state, directory):
    os.makedirs(directory, exist_ok=True)
    with open(_path(directory, state.global_step), "w") as f:
        json.dump({"step": state.global_step,
                   "arrays": {k: v.tolist() for k, v in state.items()}}, f)

def latest_checkpoint(checkpoint_dir):
    CALLS.append("latest_checkpoint")
    if not os.path.isdir(checkpoint_dir):
        return None
    steps = [int(n[5:-5]) for n in os.listdir(checkpoint_dir) if n.startswith("ckpt-")]
    return _path(checkpoint_dir, max(steps)) if steps else None

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

class Saver:
    def __init__(self, directory):
        self.directory = directory
    def restore_state(self, session):
        path = latest_checkpoint(self.directory)
        return None if path is None else restore_checkpoint(session.state, path)
    def end(self, session):
        save(session.state, self.directory)

def training_hooks(config):
    CALLS.append("training_hooks")
    if config.checkpoint_dir is None:
        return None
    return [Saver(config.checkpoint_dir)]

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
