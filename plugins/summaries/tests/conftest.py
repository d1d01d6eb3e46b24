"""Fixtures shared by the monitored-summaries tests."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

import pytest

from monitored_summaries import FileWriterCache, summary_iterator


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _close_cached_writers() -> Iterator[None]:
    yield
    FileWriterCache.clear()


@pytest.fixture
def logdir(tmp_path: Any) -> str:
    """A log directory that does not exist yet."""
    return str(tmp_path / "logs")


def read_events(logdir: str) -> list[Any]:
    """Every event of every event file in ``logdir``, files in name order."""
    events: list[Any] = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        events.extend(summary_iterator(path))
    return events


@pytest.fixture
def events() -> Any:
    """``read_events`` as a fixture (test modules cannot import conftest)."""
    return read_events


def scalars_of(events: list[Any]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for event in events:
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


@pytest.fixture
def scalars() -> Any:
    return scalars_of
