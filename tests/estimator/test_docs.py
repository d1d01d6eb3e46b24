"""docs/estimator.md's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).parents[2] / "docs" / "estimator.md"


def test_the_example_trains_evaluates_and_predicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from monitored._core._plugins import installed_plugin_names

    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv(
        "MONITORED_DISABLE_PLUGINS",
        ",".join(sorted(installed_plugin_names() - {"checkpoint", "summaries"})),
    )
    monkeypatch.chdir(tmp_path)
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[0]
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_estimator"})
    accuracy = re.fullmatch(r"accuracy (\S+) after 100 steps\n", capsys.readouterr().out)
    assert accuracy is not None
    assert float(accuracy.group(1)) > 0.75
    assert sorted(p.name for p in (tmp_path / "runs" / "estimator").glob("*.json"))
