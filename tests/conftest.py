"""Shared fixtures for the core tests.

Installed plugins are not loaded by default (``MONITORED_DISABLE_PLUGIN_AUTOLOAD``),
so a plugin installed in the test environment cannot change what a core test
sees; the discovery tests install fake distributions with :func:`fake_plugin`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from _standin_device import standin_cupy

import monitored

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture (tests/_standin_device.py)


@pytest.fixture(autouse=True)
def _no_installed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("MONITORED_DISABLE_PLUGINS", raising=False)


@pytest.fixture
def log() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros(3, dtype=np.float32)}, seed=0)


@pytest.fixture
def fake_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Install a fake distribution with a ``monitored`` entry point.

    ``fake_plugin(name, source, dist="monitored-x", version="1.0", value=None)``
    writes module ``source`` and a ``.dist-info`` whose entry point ``name``
    points at it (or at ``value``), the way pip would, and turns plugin
    autoloading back on. Returns the module name.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    # Only the fake distributions count: plugins really installed in the test
    # environment must not change what these tests see.
    monkeypatch.setattr(
        "monitored._core._plugins.installed_entry_points",
        lambda: tuple(
            ep
            for dist in importlib.metadata.distributions(path=[str(site)])
            for ep in dist.entry_points
            if ep.group == "monitored"
        ),
    )
    modules: list[str] = []

    def install(
        name: str,
        source: str,
        dist: str | None = None,
        version: str = "1.0",
        value: str | None = None,
    ) -> str:
        dist = dist or f"monitored-{name}"
        module = f"fake_{name.replace('-', '_')}_plugin"
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[monitored]\n{name} = {value or module}\n")
        modules.append(module)
        importlib.invalidate_caches()
        return module

    yield install
    for module in modules:
        sys.modules.pop(module, None)
