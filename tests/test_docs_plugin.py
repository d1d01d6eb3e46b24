"""The five-minute plugin of docs/plugins.md, installed as written, runs with the demo.

It once crashed the demo at its first evaluation (a ``FetchError`` for ``loss``
inside the evaluation session): the example now follows the rules it states.
The plugin is built from the docs' own code blocks and installed with uv.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import uv_command

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs" / "plugins.md"


def _block(text: str, language: str, first_line: str) -> str:
    """The code block of ``language`` whose first line is ``first_line``."""
    for match in re.finditer(rf"```{language}\n(.*?)```", text, flags=re.DOTALL):
        if match.group(1).startswith(first_line):
            return match.group(1)
    raise AssertionError(f"docs/plugins.md has no {language} block starting {first_line!r}")


@pytest.mark.slow
def test_the_docs_five_minute_plugin_runs_with_the_demo_and_its_evaluations(
    tmp_path: Path,
) -> None:
    text = DOCS.read_text()
    package = tmp_path / "monitored-hello"
    source = package / "src" / "monitored_hello"
    source.mkdir(parents=True)
    (package / "pyproject.toml").write_text(_block(text, "toml", "# pyproject.toml"))
    (source / "__init__.py").write_text(_block(text, "python", "# src/monitored_hello/__init__.py"))
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    subprocess.run(
        [*uv_command(), "pip", "install", "-q", "--no-deps", "--target", str(site), str(package)],
        check=True,
        env=env,
    )
    env.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("MONITORED_DISABLE_PLUGINS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "examples")])
    env["MONITORED_PROGRESS"] = "0"
    listing = subprocess.run(
        [sys.executable, "-m", "monitored", "plugins"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    ).stdout
    assert re.search(r"^hello +monitored-hello +0\.1\.0 +- +training only$", listing, re.M)
    # The demo: training with evaluations every 100 steps and one at the end.
    done = subprocess.run(
        [sys.executable, "-c", "import anyio, demo; anyio.run(demo.train, 300, 0, None, 100)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[0] == "hello at step 0"
    losses = [line for line in out if line.startswith("loss at step")]
    assert [line.split(":")[0] for line in losses] == [
        "loss at step 100",
        "loss at step 200",
        "loss at step 300",
    ]
    assert "bye" in out
    assert out[-1].startswith("held-out accuracy after 300 steps: ")
    assert out.count("hello at step 0") == 1, "not loaded in the evaluation sessions"


def test_the_commands_example_lives_in_the_module_the_entry_point_names() -> None:
    text = DOCS.read_text()
    [module] = re.findall(r'^hello = "([\w.]+)"', _block(text, "toml", "# pyproject.toml"), re.M)
    [commands] = [
        block
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
        if "def register_commands(" in block
    ]
    path = commands.splitlines()[0].removeprefix("# ").split(" ")[0]
    assert path == f"src/{module.replace('.', '/')}/__init__.py"


def test_the_readme_says_what_early_stopping_restores_by_default() -> None:
    import inspect

    from monitored_early_stopping import EarlyStoppingHook

    default = inspect.signature(EarlyStoppingHook).parameters["restore_best"].default
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert default is False
    assert "checkpointed, optionally restoring the best state (`restore_best=True`)" in readme
    assert ") and `monitored-progress`" not in readme, "one 'and' in the list of plugins"
