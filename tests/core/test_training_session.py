"""MonitoredTrainingSession: TF1's defaults, plugin-provided features, clear errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from _helpers import counting_step

import monitored
from monitored import TrainState

CONTRIBUTING_PLUGIN = """
CONFIGS = []
provides = {"checkpoint"}

class Saver:
    def __init__(self, config):
        self.config = config
        self.steps = []
    def after_run(self, run_context):
        self.steps.append(run_context.session.state.global_step)

def training_hooks(config):
    CONFIGS.append(config)
    return [Saver(config)] if config.wants_checkpoints else None
"""


async def test_defaults_add_a_step_counter_on_the_chief(state: TrainState) -> None:
    async with monitored.MonitoredTrainingSession(state, hooks=[]) as sess:
        names = [p.name for p in sess.plugins]
        config = sess.training_config
    assert names == ["hooks[0]:StepCounterHook"]
    assert config is not None
    assert config.save_checkpoint_secs == 600
    assert config.save_checkpoint_steps is None
    assert config.save_summaries_steps == 100
    assert config.explicit == frozenset()


async def test_hook_order_is_chief_only_then_hooks_then_defaults(state: TrainState) -> None:
    a, b = monitored.StopAtStepHook(last_step=1), monitored.StopAtStepHook(last_step=2)
    async with monitored.MonitoredTrainingSession(state, hooks=[a], chief_only_hooks=[b]) as sess:
        plugins = [p.plugin for p in sess.plugins]
    assert plugins[:2] == [b, a]
    assert isinstance(plugins[2], monitored.StepCounterHook)


async def test_workers_get_no_chief_only_or_default_hooks(state: TrainState) -> None:
    state.initialized = True  # the chief made it ready
    chief_only = monitored.StopAtStepHook(last_step=1)
    async with monitored.MonitoredTrainingSession(
        state, is_chief=False, chief_only_hooks=[chief_only], hooks=[]
    ) as sess:
        assert sess.plugins == ()
        assert not sess.is_chief


def test_steps_switch_off_the_default_secs() -> None:
    sess = monitored.MonitoredTrainingSession(save_checkpoint_steps=10, save_summaries_secs=5)
    config = sess.training_config
    assert config is not None
    assert (config.save_checkpoint_secs, config.save_checkpoint_steps) == (None, 10)
    assert (config.save_summaries_steps, config.save_summaries_secs) == (None, 5)
    assert config.explicit == {"save_checkpoint_steps", "save_summaries_secs"}


def test_summary_dir_defaults_to_checkpoint_dir() -> None:
    config = monitored.MonitoredTrainingSession(checkpoint_dir="runs/a").training_config
    assert config is not None
    assert config.summary_dir == "runs/a"


def test_a_remote_master_is_refused() -> None:
    with pytest.raises(ValueError, match="remote masters are not supported"):
        monitored.MonitoredTrainingSession(master="grpc://host:2222")


async def test_checkpoint_dir_without_the_checkpoint_plugin_names_the_package(
    fake_plugin: Any, state: TrainState
) -> None:
    # fake_plugin turns autoloading on and shows only fake distributions: none here.
    sess = monitored.MonitoredTrainingSession(state, checkpoint_dir="runs/a")
    with pytest.raises(
        monitored.MissingPluginError,
        match=r"pip install monitored-checkpoint, or from a clone of monitored: "
        r"pip install \./plugins/checkpoint\)",
    ) as info:
        async with sess:
            pytest.fail("must fail at session start")
    assert info.value.plugin == "checkpoint"
    assert info.value.distribution == "monitored-checkpoint"


async def test_autoload_off_is_named_when_a_feature_plugin_is_missing(state: TrainState) -> None:
    with pytest.raises(
        monitored.MissingPluginError,
        match="is not loaded: MONITORED_DISABLE_PLUGIN_AUTOLOAD is set",
    ):
        async with monitored.MonitoredTrainingSession(state, checkpoint_dir="runs/a"):
            pass


async def test_checkpoints_switched_off_need_no_plugin(state: TrainState) -> None:
    async with monitored.MonitoredTrainingSession(
        state, checkpoint_dir="runs/a", save_checkpoint_secs=None
    ):
        pass


async def test_explicit_summaries_without_a_summaries_plugin_are_an_error(
    fake_plugin: Any, state: TrainState
) -> None:
    sess = monitored.MonitoredTrainingSession(
        state, summary_dir="runs/s", save_summaries_steps=10, save_checkpoint_secs=None
    )
    with pytest.raises(monitored.MissingPluginError, match="pip install monitored-summaries"):
        async with sess:
            pass


async def test_default_summaries_without_a_plugin_are_skipped(state: TrainState) -> None:
    async with monitored.MonitoredTrainingSession(
        state, summary_dir="runs/s", save_checkpoint_secs=None
    ):
        pass


async def test_a_disabled_feature_plugin_is_named_as_disabled(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("checkpoint", CONTRIBUTING_PLUGIN)
    sess = monitored.MonitoredTrainingSession(
        state, checkpoint_dir="runs/a", disable_plugins=["checkpoint"]
    )
    with pytest.raises(
        monitored.MissingPluginError, match="'checkpoint' plugin provides, but it is disabled"
    ):
        async with sess:
            pass


async def test_plugins_contribute_hooks_for_the_config(fake_plugin: Any, state: TrainState) -> None:
    module = fake_plugin("checkpoint", CONTRIBUTING_PLUGIN)
    async with monitored.MonitoredTrainingSession(
        state,
        checkpoint_dir="runs/a",
        save_checkpoint_steps=2,
        hooks=[monitored.StopAtStepHook(last_step=3)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
        names = [p.name for p in sess.plugins]
    import importlib

    [config] = importlib.import_module(module).CONFIGS
    assert config.checkpoint_dir == "runs/a"
    assert config.save_checkpoint_steps == 2
    assert names == [
        "hooks[0]:StopAtStepHook",
        "hooks[1]:StepCounterHook",
        "hooks[2]:Saver<checkpoint>",
        "checkpoint",
    ]
    saver = sess.plugins[2].plugin
    assert saver.steps == [1, 2, 3]  # type: ignore[attr-defined]


async def test_training_hooks_must_return_a_list(fake_plugin: Any, state: TrainState) -> None:
    fake_plugin(
        "checkpoint",
        "provides = {'checkpoint'}\ndef training_hooks(config):\n    return 'saver'\n",
    )
    with pytest.raises(monitored.PluginError, match="returned str; it must return a list of hooks"):
        async with monitored.MonitoredTrainingSession(state, checkpoint_dir="runs/a"):
            pass


async def test_step_counter_logs_steps_per_second(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredTrainingSession(
        state, log_step_count_steps=2, hooks=[monitored.StopAtStepHook(last_step=5)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
    rates = [r for r in caplog.records if r.getMessage().startswith("global_step/sec")]
    assert len(rates) == 2  # steps 3 and 5 (step 1 starts the timer)


async def test_training_hooks_may_be_async(fake_plugin: Any, state: TrainState) -> None:
    fake_plugin(
        "checkpoint",
        """
        provides = {"checkpoint"}

        class Saver:
            def end(self):
                pass

        async def training_hooks(config):
            return [Saver()]
        """,
    )
    async with monitored.MonitoredTrainingSession(state, checkpoint_dir="runs/a") as sess:
        assert "hooks[1]:Saver<checkpoint>" in [p.name for p in sess.plugins]


# -- TF1 habits ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argument",
    [
        "save_summaries_steps",
        "save_summaries_secs",
        "save_checkpoint_secs",
        "save_checkpoint_steps",
    ],
)
async def test_zero_switches_a_feature_off_as_in_tf1(argument: str, state: TrainState) -> None:
    """resnet_main.py passes save_summaries_steps=0; no summaries plugin is needed then."""
    async with monitored.MonitoredTrainingSession(
        state, summary_dir="runs/s", **{argument: 0}
    ) as sess:
        config = sess.training_config
        assert config is not None
        assert not config.wants_summaries or argument.startswith("save_checkpoint")
        assert getattr(config, argument) is None


async def test_log_step_count_steps_zero_adds_no_step_counter(state: TrainState) -> None:
    async with monitored.MonitoredTrainingSession(state, log_step_count_steps=0) as sess:
        assert not any(isinstance(i.plugin, monitored.StepCounterHook) for i in sess.plugins)


@pytest.mark.parametrize("value", [-1, "100", True])
def test_a_bad_interval_is_named(value: Any) -> None:
    with pytest.raises(
        ValueError, match=r"save_summaries_steps=.*give a positive number, or 0 or None"
    ):
        monitored.MonitoredTrainingSession(save_summaries_steps=value)


@pytest.mark.parametrize(
    ("argument", "advice"),
    [
        ("config", r"config=\.\.\.\): there is no tf.Session to configure: drop config="),
        ("master", r"master=\.\.\.\): remote masters are not supported: drop master="),
        ("save_graph_def", r"no graph to save: drop save_graph_def="),
    ],
)
def test_tf1_only_arguments_say_what_to_do_instead(argument: str, advice: str) -> None:
    with pytest.raises(monitored.UnsupportedArgumentError, match=advice) as info:
        monitored.MonitoredTrainingSession(**{argument: object()})
    assert isinstance(info.value, TypeError)


def test_monitored_session_refuses_a_session_creator_and_config() -> None:
    with pytest.raises(
        TypeError, match=r"MonitoredSession\(session_creator=\.\.\.\).*is_chief=False"
    ):
        monitored.MonitoredSession(session_creator=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"SingularMonitoredSession\(config=\.\.\.\)"):
        monitored.SingularMonitoredSession(config=object())  # type: ignore[arg-type]


def test_recovery_wait_secs_reaches_the_session_manager() -> None:
    sess = monitored.MonitoredTrainingSession(is_chief=False, recovery_wait_secs=0.25)
    assert sess._session_manager.recovery_wait_secs == 0.25
