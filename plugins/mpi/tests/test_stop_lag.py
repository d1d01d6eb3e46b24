"""``MONITORED_MPI_STOP_LAG=1``: the stop agreement overlapped with the next step.

Every rank still stops after one and the same step (one step after the one a
stop was asked at), and the ranks' weights stay bitwise equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from monitored_mpi import MPIError
from monitored_mpi._cluster import stop_lag_from_env

LAG = {"MONITORED_MPI_STOP_LAG": "1"}


@pytest.mark.parametrize("n", [2, 3])
def test_a_stop_on_one_rank_ends_every_rank_one_step_later(run_mpi: Any, n: int) -> None:
    proc, results = run_mpi(n, "train.py", "stop7", "20", env=LAG)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in results.values()] == [8] * n


def test_every_rank_ends_with_the_same_bits(run_mpi: Any) -> None:
    proc, results = run_mpi(3, "train.py", "plain", "10", env=LAG)
    assert proc.returncode == 0, proc.stderr
    # StopAtStepHook(last_step=10) asks after step 10: every rank ends after step 11.
    assert [r["step"] for r in results.values()] == [11] * 3
    for name in ("w", "b", "fortran", "transposed"):
        assert all(r[name] == results[0][name] for r in results.values()), name


def test_a_finished_job_started_again_still_takes_no_step(run_mpi: Any, tmp_path: Path) -> None:
    # The agreement before the first step stays exact.
    env = {**LAG, "CKPT_DIR": str(tmp_path / "ckpt")}
    first, done = run_mpi(2, "train.py", "plain", "6", env=env)
    assert first.returncode == 0, first.stderr
    again, results = run_mpi(2, "train.py", "plain", "6", env=env)
    assert again.returncode == 0, again.stderr
    assert [r["step"] for r in results.values()] == [r["step"] for r in done.values()]


def test_sigterm_on_rank_1_stops_every_rank_at_one_step(run_mpi: Any, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    proc, results = run_mpi(2, "train.py", "sigterm", "50", env={**LAG, "CKPT_DIR": str(ckpt)})
    assert proc.returncode == 0, proc.stderr
    steps = {r["step"] for r in results.values()}
    assert len(steps) == 1
    (step,) = steps
    assert 5 <= step < 50
    # The chief's checkpoint of the step it was asked at, and of the last step.
    saved = {p.name for p in ckpt.glob("model.ckpt-*.json")}
    assert f"model.ckpt-{step}.json" in saved


def test_the_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_MPI_STOP_LAG", raising=False)
    assert stop_lag_from_env() is False
    monkeypatch.setenv("MONITORED_MPI_STOP_LAG", "1")
    assert stop_lag_from_env() is True
    monkeypatch.setenv("MONITORED_MPI_STOP_LAG", "yes")
    with pytest.raises(MPIError, match="MONITORED_MPI_STOP_LAG='yes': give 0"):
        stop_lag_from_env()
