"""The digits demo (examples/demo.py), given a checkpoint_dir, resumes when run twice."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from monitored_checkpoint import latest_checkpoint, read_manifest
from monitored_checkpoint._store import open_store

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.py"


def _load_demo() -> Any:
    spec = importlib.util.spec_from_file_location("monitored_demo_for_checkpoints", DEMO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_demo_resumes_from_its_checkpoint_when_run_twice(
    ckpt_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("sklearn")
    demo = _load_demo()
    caplog.set_level(logging.INFO, logger="monitored.checkpoint")
    await demo.train(300, 0, ckpt_dir)
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-300")
    assert "No checkpoint in" in caplog.text
    caplog.clear()

    await demo.train(600, 0, ckpt_dir)
    assert f"Restored {os.path.join(ckpt_dir, 'model.ckpt-300')} (step 300)" in caplog.text
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-600")
    manifest = read_manifest(open_store(ckpt_dir), "model.ckpt-600")
    assert manifest.step == 600
    rule = manifest.plugins["early_stopping:accuracy"]["state"]["rule"]
    # Held-out evaluations at 100, ..., 600, each in the checkpoint of its step:
    # the early-stopping hook's checks from the first run went through the resume.
    assert rule["index"] == 6
    assert rule["best"] > 0.5
