"""pytest plugin: the ``monitored_run`` fixture for testing hooks and plugins.

Registered through the ``pytest11`` entry point, the way pytest ships
``pytester``. An ``async def`` test that uses ``monitored_run`` runs as written,
on asyncio, even in a project with no async test plugin; where pytest-asyncio or
anyio's plugin already runs the test (its marker, or pytest-asyncio's auto mode),
they do.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from .testing import run_session

__all__ = ["monitored_run", "pytest_pyfunc_call"]

#: Markers of the plugins that run async tests themselves.
_ASYNC_MARKERS = ("asyncio", "anyio", "trio")


@pytest.fixture
def monitored_run() -> Callable[..., Any]:
    """:func:`monitored.testing.run_session`: run a real session around hooks."""
    return run_session


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test that uses ``monitored_run`` when nothing else would."""
    function = pyfuncitem.obj
    if not inspect.iscoroutinefunction(function) or "monitored_run" not in pyfuncitem.fixturenames:
        return None
    if any(pyfuncitem.get_closest_marker(name) for name in _ASYNC_MARKERS):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    anyio.run(functools.partial(function, **arguments))
    return True
