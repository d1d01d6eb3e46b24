"""One owner per capability: an explicit ``SummarySaverHook`` and the installed ``summaries``."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored_summaries as summaries
from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState
from monitored_summaries import SummarySaverHook


@pytest.fixture(autouse=True)
def only_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,nan_guard,early_stopping")


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    summaries.scalar("loss", 1.0 / state.global_step)
    return {"loss": np.float32(1.0)}


async def train(directory: Path, hooks: list[object]) -> Any:
    async with MonitoredTrainingSession(
        TrainState(),
        summary_dir=str(directory),
        save_checkpoint_secs=None,
        save_summaries_steps=5,
        log_step_count_steps=5,
        hooks=[*hooks, StopAtStepHook(last_step=20)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    return sess


async def test_user_summary_saver_hook_next_to_the_default_writes_each_point_once(
    tmp_path: Path, events: Any, caplog: Any
) -> None:
    """The demo's case: global_step/sec at (6, ...) twice. TF1 wrote it once."""
    caplog.set_level(logging.DEBUG, "monitored")
    mine = SummarySaverHook(save_steps=5, output_dir=str(tmp_path))
    sess = await train(tmp_path, [mine])
    points = Counter(
        (value.tag, event.step) for event in events(str(tmp_path)) for value in event.summary.value
    )
    doubled = {point: n for point, n in points.items() if n > 1}
    assert not doubled, doubled
    assert {step for tag, step in points if tag == "global_step/sec"} == {6, 11, 16}
    assert [step for tag, step in points if tag == "loss"] == [1, 6, 11, 16]
    hooks = [info.plugin for info in sess.plugins if isinstance(info.plugin, SummarySaverHook)]
    assert hooks == [mine], "only the user's hook writes"
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert "plugin 'summaries'" in line
    assert "SummarySaverHook" in line


async def test_a_private_summary_saver_subclass_is_named_by_its_public_class(
    tmp_path: Path, caplog: Any
) -> None:
    """``SummarySaverHook(scalars=...)`` is a private subclass; messages name the public one."""
    caplog.set_level(logging.DEBUG, "monitored")
    mine = SummarySaverHook(save_steps=5, output_dir=str(tmp_path), scalars=["loss"])
    assert type(mine).__name__.startswith("_"), "the case this test is about"
    sess = await train(tmp_path, [mine])
    [name] = [info.name for info in sess.plugins if info.plugin is mine]
    assert name.endswith("]:SummarySaverHook"), name
    position = name.split(":")[0]
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert line == (
        "plugin 'summaries' (monitored-summaries 0.1.0) steps aside: SummarySaverHook in "
        f"{position} provides 'summaries'"
    )


async def test_without_an_explicit_hook_the_installed_plugin_writes(
    tmp_path: Path, events: Any
) -> None:
    sess = await train(tmp_path, [])
    assert sess.stepped_aside == ()
    tags = Counter(value.tag for event in events(str(tmp_path)) for value in event.summary.value)
    assert tags["global_step/sec"] == 3
    assert tags["loss"] == 4
