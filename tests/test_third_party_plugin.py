"""A real third-party plugin, built as its own package and installed into a fresh
virtual environment, is discovered through its entry point and called in the
documented order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import uv_command

ROOT = Path(__file__).parent.parent
PLUGIN = Path(__file__).parent / "third_party_plugin"

SCRIPT = """
import anyio, numpy as np, monitored, monitored_hello

class UserHook:
    def begin(self):
        monitored_hello.EVENTS.append("user begin")
    def before_run(self):
        monitored_hello.EVENTS.append("user before_run")
    def end(self):
        monitored_hello.EVENTS.append("user end")

def step(state):
    state.global_step += 1
    return {"loss": np.float32(0.5)}

async def main():
    async with monitored.MonitoredSession(hooks=[UserHook()]) as sess:
        await sess.run(step)
        print([p.name for p in sess.plugins])

anyio.run(main)
print("\\n".join(monitored_hello.EVENTS))
"""


@pytest.mark.slow
def test_pip_installed_plugin_is_discovered_and_called_in_order(tmp_path: Path) -> None:
    uv = uv_command()
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    env.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run(
        [*uv, "pip", "install", "-q", "--python", str(python), str(ROOT), str(PLUGIN)],
        check=True,
        env=env,
    )
    listing = subprocess.run(
        [str(venv / "bin" / "monitored"), "plugins", "--verbose"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    assert "hello" in listing
    assert "monitored-hello" in listing
    assert "0.2.0" in listing
    assert "after_run, before_run, begin, end" in listing

    out = subprocess.run(
        [str(python), "-c", SCRIPT], check=True, capture_output=True, text=True, env=env
    ).stdout.splitlines()
    assert out == [
        "['hooks[0]:UserHook', 'hello']",
        "user begin",
        "plugin begin",
        "user before_run",
        "plugin before_run",
        "plugin after_run loss=0.5",
        "user end",
        "plugin end (trylast)",
    ]
