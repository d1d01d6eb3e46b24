"""A lost rank, told apart from a slow one: the heartbeat (``_heartbeat.py``).

Two faults, both with real processes: a rank frozen by SIGSTOP (from the other
rank, a host that vanished and a process that hangs look the same: no message
arrives), which runs everywhere; and, where this runs as root with network
namespaces, two ranks on two simulated hosts (a namespace and a host name
each, joined by a virtual Ethernet link that MPI's traffic crosses) whose link
is cut mid-training.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitored_mpi import MPIError
from monitored_mpi._heartbeat import heartbeat_timeout_from_env, watched

SCRIPTS = Path(__file__).parent / "scripts"
#: Seconds after which MPICH's launcher kills the whole job (as in conftest.py).
JOB_LIMIT = 90

#: Collectives may wait far longer than a lost rank goes unnoticed: only the
#: heartbeat can end these jobs in time, and the tests say which error did.
SLOW_COLLECTIVES = {"MONITORED_MPI_TIMEOUT": "80", "MONITORED_MPI_HEARTBEAT_TIMEOUT": "3"}


@pytest.mark.parametrize("n", [2, 3])
def test_a_frozen_rank_ends_the_job_naming_the_rank_and_host(run_mpi: Any, n: int) -> None:
    proc, results = run_mpi(n, "train.py", "frozen", "1000000", env=SLOW_COLLECTIVES)
    assert proc.returncode != 0
    assert results == {}
    # Rank 1 froze after step 5; a rank watching it (0, or 2 of 3) tells first.
    assert re.search(
        rf"rank [02] of {n} failed at step 5 with PeerLostError: rank 1 of {n} \(host '",
        proc.stderr,
    ), proc.stderr
    assert "sent no heartbeat for 3s" in proc.stderr
    assert "MONITORED_MPI_HEARTBEAT_TIMEOUT sets the limit" in proc.stderr
    assert "CollectiveTimeoutError" not in proc.stderr


def test_a_rank_busy_longer_than_the_heartbeat_timeout_is_not_lost(run_mpi: Any) -> None:
    # Rank 0 holds the interpreter in pure Python for 8 s (a long save) while
    # rank 1 waits in the stop decision: its heartbeat thread keeps beating.
    env = {**SLOW_COLLECTIVES, "MONITORED_MPI_HEARTBEAT_TIMEOUT": "2", "BUSY_SECS": "8"}
    proc, results = run_mpi(2, "train.py", "busy", "6", env=env)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in results.values()] == [6, 6]
    assert "PeerLostError" not in proc.stderr


def test_each_rank_is_watched_by_its_neighbours_and_watches_them() -> None:
    assert watched(0, 2) == [1]
    assert watched(1, 3) == [0, 2]
    assert watched(0, 5) == [1, 2, 3, 4]
    assert watched(0, 10) == [1, 2, 8, 9]
    assert watched(5, 10) == [3, 4, 6, 7]
    for size in range(2, 12):
        for rank in range(size):
            assert rank not in watched(rank, size)
            assert all(rank in watched(peer, size) for peer in watched(rank, size))


def test_the_heartbeat_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_MPI_HEARTBEAT_TIMEOUT", raising=False)
    assert heartbeat_timeout_from_env() == 30.0
    monkeypatch.setenv("MONITORED_MPI_HEARTBEAT_TIMEOUT", "0")
    assert heartbeat_timeout_from_env() == 0.0
    for bad in ("-1", "soon", "inf", "nan"):
        monkeypatch.setenv("MONITORED_MPI_HEARTBEAT_TIMEOUT", bad)
        with pytest.raises(MPIError, match="MONITORED_MPI_HEARTBEAT_TIMEOUT="):
            heartbeat_timeout_from_env()


# -- two simulated hosts: network namespaces joined by a veth link -----------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[list[str]]:
    """Two network namespaces joined by a veth pair; yields [namespace A, namespace B]."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs ip (iproute2) and unshare (util-linux)")
    tag = f"mh{os.getpid() % 100000}"
    names = [f"{tag}a", f"{tag}b"]
    try:
        _ip("netns", "add", names[0])
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create a network namespace here: {exc}")
    try:
        _ip("netns", "add", names[1])
        _ip("link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb")
        for i, (ns, side) in enumerate(zip(names, "ab", strict=True)):
            _ip("link", "set", f"{tag}v{side}", "netns", ns)
            _ip(
                "-n",
                ns,
                "addr",
                "add",
                f"10.231.{os.getpid() % 200}.{i + 1}/24",
                "dev",
                f"{tag}v{side}",
            )
            _ip("-n", ns, "link", "set", f"{tag}v{side}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _wait_for(paths: list[Path], proc: subprocess.Popen[str], limit: float) -> None:
    deadline = time.monotonic() + limit
    while not all(p.exists() for p in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the job did not start training:\n{out}\n{err}")
        time.sleep(0.05)


def test_a_host_whose_link_is_cut_ends_every_rank_naming_the_lost_one(
    two_hosts: list[str], tmp_path: Path
) -> None:
    beside = Path(sys.executable).parent / "mpiexec"
    launcher = str(beside) if beside.exists() else shutil.which("mpiexec")
    if launcher is None:  # pragma: no cover - the dev group installs the mpich wheel
        pytest.skip("no mpiexec: install the mpich wheel (the dev group does)")
    script = str(SCRIPTS / "train.py")
    command = [launcher]
    for i, ns in enumerate(two_hosts):
        if i:
            command.append(":")
        # Each rank in its namespace, with a host name of its own.
        command += [
            "-n",
            "1",
            "ip",
            "netns",
            "exec",
            ns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            f'hostname host-{"ab"[i]} && exec "$0" "$@"',
            sys.executable,
            script,
            "paced",
            "1000000",
            str(tmp_path),
        ]
    env = {
        **os.environ,
        **SLOW_COLLECTIVES,
        "MPIEXEC_TIMEOUT": str(JOB_LIMIT),
        "PYTHONUNBUFFERED": "1",
        # Every byte between the ranks crosses the link (no shared memory, TCP).
        "MPIR_CVAR_NOLOCAL": "1",
        "UCX_TLS": "tcp,self",
    }
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for([tmp_path / "running0", tmp_path / "running1"], proc, JOB_LIMIT)
    _ip("-n", two_hosts[1], "link", "set", f"{two_hosts[1][:-1]}vb", "down")
    try:
        out, err = proc.communicate(timeout=JOB_LIMIT + 30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert not list(tmp_path.glob("rank*.json"))
    # Each side sees the other go silent; the first to tell ends the job.
    assert (
        "rank 0 of 2 failed at step" in err
        and "PeerLostError: rank 1 of 2 (host 'host-b') sent no heartbeat for 3s, seen from "
        "rank 0 (host 'host-a')"
        in err
    ) or (
        "rank 1 of 2 failed at step" in err
        and "PeerLostError: rank 0 of 2 (host 'host-a') sent no heartbeat for 3s, seen from "
        "rank 1 (host 'host-b')"
        in err
    ), out + err
    assert "CollectiveTimeoutError" not in err


def test_without_mpi_thread_multiple_there_is_no_heartbeat_and_a_warning_says_so(
    run_mpi: Any,
) -> None:
    proc, results = run_mpi(2, "thread_level.py")
    assert proc.returncode == 0, proc.stderr
    assert sorted(results) == [0, 1]
    for result in results.values():
        assert result["heartbeat"] is False
        (message,) = result["warnings"]
        assert "initialized without MPI_THREAD_MULTIPLE" in message
        assert "MONITORED_MPI_HEARTBEAT_TIMEOUT=0" in message
