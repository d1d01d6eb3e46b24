"""The Getting started page opens with the install command and an example that runs as written.

The example is taken from docs/index.md itself and run in a fresh interpreter,
outside the source tree, with the installed plugins loaded as a user's would be.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
PAGE = ROOT / "docs" / "index.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def test_the_page_leads_with_installing_everything_then_a_short_example() -> None:
    text = PAGE.read_text()
    first_block = re.search(r"```(\w+)\n(.*?)```", text, flags=re.DOTALL)
    assert first_block is not None
    assert first_block.groups() == ("bash", 'pip install "monitored[all]"\n')
    example = _blocks("python")[0]
    assert text.index(example) < text.index("\n## ")  # above the first section
    lines = [line for line in example.splitlines() if line.strip()]
    assert len(lines) <= 12, f"the first example has {len(lines)} lines"


def test_the_first_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(_blocks("python")[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_PROGRESS"] = "0"  # no bar in captured output; the plugins still load
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    values = [float(v) for v in line.removeprefix("w = [").rstrip("]").split()]
    assert len(values) == 3
    assert all(abs(v - 1.0) < 1e-3 for v in values), line
