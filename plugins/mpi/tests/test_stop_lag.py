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


def test_input_ending_on_every_rank_at_once_stops_the_job_cleanly(run_mpi: Any) -> None:
    # 21 batches over 3 ranks: 7 each. Every rank finds its input ended in the extra
    # step and meets the others at the close.
    proc, results = run_mpi(3, "uneven.py", "feed", env={**LAG, "NUM_BATCHES": "21"})
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in results.values()] == [7] * 3


def test_input_ending_on_one_rank_first_fails_saying_to_keep_exact_stops(run_mpi: Any) -> None:
    # 7, 7 and 6 batches: rank 2 has no batch for the step after the agreed stop.
    proc, results = run_mpi(3, "uneven.py", "feed", env={**LAG, "MONITORED_MPI_TIMEOUT": "3"})
    assert proc.returncode != 0
    assert results == {}
    assert "CollectiveTimeoutError" in proc.stderr
    assert (
        "with MONITORED_MPI_STOP_LAG=1 every rank runs one more step after a stop is agreed, "
        "which a rank whose input ended first cannot: with input that ends unevenly keep "
        "MONITORED_MPI_STOP_LAG=0" in proc.stderr
    )
