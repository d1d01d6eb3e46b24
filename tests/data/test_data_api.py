"""The public surface of monitored.data."""

from __future__ import annotations

import inspect

import numpy as np

import monitored
from monitored import data


def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in vars(data) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(data, name))}
    assert set(data.__all__) == public - modules
    assert len(data.__all__) == len(set(data.__all__))


def test_every_public_name_is_documented() -> None:
    for name in data.__all__:
        assert inspect.getdoc(getattr(data, name)), name


def test_the_main_names_are_also_in_monitored() -> None:
    for name in ["prefetch", "shuffle_batch", "QueueRunner", "start_queue_runners"]:
        assert getattr(monitored, name) is getattr(data, name)
    assert not hasattr(monitored, "batch")  # monitored.data.batch is its only home


async def test_a_pipeline_registers_as_a_hook_under_its_plugin_name() -> None:
    pipeline = data.prefetch([np.zeros(1)], name="digits")
    async with monitored.MonitoredSession(hooks=[data.prefetch([], name="x"), pipeline]) as sess:
        assert [info.name for info in sess.plugins] == ["input:x", "input:digits"]
        assert data.pipelines(sess)[1] is pipeline
