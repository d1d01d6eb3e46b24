"""Run ownership (``_core/_ownership``): claims, stale claims, fencing, with real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import monitored
from monitored import (
    MonitoredSession,
    RunOwnedError,
    RunOwnershipLostError,
    RunOwnershipWarning,
    RunTakenOverWarning,
    TrainState,
    check_run_owner,
    claim_run,
)
from monitored._core import _ownership
from monitored._core._ownership import OWNER_FOLDER, lease_secs_from_env, resolve_run_directory

#: A process that claims ``argv[1]``, prints ``claimed <epoch>`` and waits for stdin.
HOLDER = textwrap.dedent(
    """
    import sys
    import monitored
    owner = monitored.claim_run(sys.argv[1])
    print("claimed", owner.epoch, flush=True)
    sys.stdin.readline()
    try:
        monitored.check_run_owner(sys.argv[1] + "/file")
    except monitored.RunOwnershipLostError as exc:
        print("LOST", exc, flush=True)
        sys.exit(4)
    owner.release()
    print("released", flush=True)
    """
)


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _hold(procs: list[subprocess.Popen[str]], directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("claimed"), proc.stderr.read() if proc.stderr else ""
    return proc


def _record(directory: Path, epoch: int, **fields: object) -> Path:
    folder = directory / OWNER_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch-{epoch:012d}.json"
    path.write_text(json.dumps(fields))
    return path


def test_a_live_owner_in_another_process_refuses_a_claim(
    tmp_path: Path, holder: list[subprocess.Popen[str]]
) -> None:
    proc = _hold(holder, tmp_path)
    with pytest.raises(RunOwnedError) as info:
        claim_run(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert f"process {proc.pid}" in message
    assert socket.gethostname() in message
    assert "give this training another directory" in message
    assert info.value.directory == str(tmp_path)
    # Its release frees the directory at once, with a higher epoch and no warning.
    out, _ = proc.communicate("\n", timeout=60)
    assert "released" in out
    owner = claim_run(tmp_path)
    try:
        assert owner is not None
        assert owner.epoch == 2
    finally:
        assert owner is not None
        owner.release()


def test_a_dead_owner_is_taken_over_with_a_warning(
    tmp_path: Path, holder: list[subprocess.Popen[str]]
) -> None:
    proc = _hold(holder, tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    with pytest.warns(RunTakenOverWarning, match=f"process {proc.pid} is gone"):
        owner = claim_run(tmp_path)
    assert owner is not None
    owner.release()


def test_a_reused_pid_is_not_mistaken_for_the_owner(tmp_path: Path) -> None:
    # The recorded pid is alive (this process) but started at another time.
    _record(
        tmp_path,
        3,
        host=socket.gethostname(),
        pid=os.getpid(),
        started="1",
        since=time.time(),
    )
    with pytest.warns(RunTakenOverWarning, match="belongs to another process"):
        owner = claim_run(tmp_path)
    assert owner is not None
    assert owner.epoch == 4
    assert [p.name for p in (tmp_path / OWNER_FOLDER).iterdir()] == ["epoch-000000000004.json"]
    owner.release()


def test_another_hosts_claim_holds_until_its_lease_lapses(tmp_path: Path) -> None:
    record = _record(tmp_path, 1, host="elsewhere", pid=1, since=time.time())
    with pytest.raises(RunOwnedError, match="host 'elsewhere', process 1"):
        claim_run(tmp_path, lease_secs=30)
    old = time.time() - 31
    os.utime(record, (old, old))
    with pytest.warns(RunTakenOverWarning, match="lease was not renewed"):
        owner = claim_run(tmp_path, lease_secs=30)
    assert owner is not None
    owner.release()


def test_a_malformed_record_is_an_unknown_owner(tmp_path: Path) -> None:
    folder = tmp_path / OWNER_FOLDER
    folder.mkdir()
    (folder / "epoch-000000000001.json").write_bytes(b"\xff" * 10000)
    with pytest.raises(RunOwnedError, match=r"host '\?'"):
        claim_run(tmp_path, lease_secs=30)
    (folder / "epoch-000000000002.json").mkdir()  # not a file: unknown too
    with pytest.raises(RunOwnedError):
        claim_run(tmp_path, lease_secs=30)


def test_fencing_after_a_takeover(tmp_path: Path, holder: list[subprocess.Popen[str]]) -> None:
    # The child's claim is replaced by a newer epoch (as a takeover would): its
    # next commit check fails, naming the new owner.
    proc = _hold(holder, tmp_path)
    _record(tmp_path, 2, host="newhost", pid=77, since=time.time())
    out, _ = proc.communicate("\n", timeout=60)
    assert proc.returncode == 4
    assert "no longer owns the run directory" in out
    assert "host 'newhost', process 77" in out


def test_check_run_owner_outside_claims_is_a_no_op(tmp_path: Path) -> None:
    check_run_owner(tmp_path / "x")
    owner = claim_run(tmp_path)
    assert owner is not None
    try:
        check_run_owner(tmp_path / "model.ckpt-1.json")
        check_run_owner(tmp_path)
        _record(tmp_path, owner.epoch + 1, host="h", pid=1, since=time.time())
        with pytest.raises(RunOwnershipLostError):
            check_run_owner(tmp_path / "model.ckpt-1.json")
    finally:
        owner.release()


def test_a_second_claim_in_this_process_is_refused(tmp_path: Path) -> None:
    owner = claim_run(tmp_path / "d")
    try:
        with pytest.raises(RunOwnedError, match="another session of this process"):
            claim_run(str(tmp_path / "d") + "/")
    finally:
        assert owner is not None
        owner.release()


def test_memory_is_claimed_in_process_and_other_stores_warn() -> None:
    owner = claim_run("memory://ownership-test")
    try:
        with pytest.raises(RunOwnedError):
            claim_run("memory://ownership-test")
    finally:
        assert owner is not None
        owner.release()
    with pytest.warns(RunOwnershipWarning, match="cannot hold ownership"):
        assert claim_run("s3://bucket/run-ownership-test") is None


def test_relative_directories_are_resolved_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_run_directory("rel/ck") == str(tmp_path / "rel" / "ck")
    assert resolve_run_directory(f"file://{tmp_path}/x") == str(tmp_path / "x")
    assert resolve_run_directory("memory://a/b") == "memory://a/b"


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_lease_setting_is_named(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONITORED_RUN_LEASE_SECS", raw)
    with pytest.raises(ValueError, match="MONITORED_RUN_LEASE_SECS"):
        lease_secs_from_env()


def test_the_lease_is_renewed_while_held(tmp_path: Path) -> None:
    owner = claim_run(tmp_path, lease_secs=0.2)
    assert owner is not None
    try:
        record = next((tmp_path / OWNER_FOLDER).iterdir())
        first = record.stat().st_mtime
        deadline = time.monotonic() + 60
        while record.stat().st_mtime == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert record.stat().st_mtime > first
    finally:
        owner.release()


class _Writes:
    """A hook that writes to a directory: the session claims it before ``begin``."""

    def __init__(self, directory: Path, log: list[str]) -> None:
        self.directory, self.log = directory, log

    def run_directories(self, session: MonitoredSession) -> list[str]:
        return [str(self.directory)]

    def begin(self, session: MonitoredSession) -> None:
        self.log.append("begin")


@pytest.mark.anyio
async def test_a_session_claims_before_begin_and_releases_on_close(tmp_path: Path) -> None:
    log: list[str] = []
    async with MonitoredSession(TrainState(), hooks=[_Writes(tmp_path, log)]):
        assert log == ["begin"]
        with pytest.raises(RunOwnedError):
            claim_run(tmp_path)
        second = MonitoredSession(TrainState(), hooks=[_Writes(tmp_path, log)])
        with pytest.raises(RunOwnedError):
            async with second:
                pass
        assert log == ["begin"]  # the refused session began nothing
    owner = claim_run(tmp_path)  # released on close
    assert owner is not None
    owner.release()


@pytest.mark.anyio
async def test_a_sessions_claim_and_release_are_written_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each syncs a record to disk: other sessions of the loop go on meanwhile."""
    writers: list[int] = []
    write_new = _ownership._write_new

    def recording(path: str, body: bytes) -> None:
        writers.append(threading.get_ident())
        write_new(path, body)

    monkeypatch.setattr(_ownership, "_write_new", recording)
    log: list[str] = []
    async with MonitoredSession(TrainState(), hooks=[_Writes(tmp_path, log)]):
        assert len(writers) == 1  # the claim, made before begin
    assert len(writers) == 2  # and the release, done when the close returns
    assert threading.get_ident() not in writers
    record = json.loads(next((tmp_path / OWNER_FOLDER).glob("epoch-*.json")).read_text())
    assert record["released"] is True


@pytest.mark.anyio
async def test_a_bad_run_directories_answer_is_named(tmp_path: Path) -> None:
    class Bad:
        def run_directories(self) -> str:
            return str(tmp_path)

    with pytest.raises(monitored.PluginError, match="run_directories"):
        async with MonitoredSession(TrainState(), hooks=[Bad()]):
            pass


def test_the_owners_own_lease_decides_not_the_claimants(tmp_path: Path) -> None:
    # The owner renews every quarter of its 60 s lease: a claimant set to 1 s must
    # not take it over after 5 s of silence.
    record = _record(tmp_path, 1, host="elsewhere", pid=1, since=time.time(), lease=60.0)
    old = time.time() - 5
    os.utime(record, (old, old))
    with pytest.raises(RunOwnedError, match="host 'elsewhere'"):
        claim_run(tmp_path, lease_secs=1.0)


def test_a_claim_another_process_wrote_is_printed_escaped(tmp_path: Path) -> None:
    """Issue 34 §2: the host of a claim is whatever its writer put there (OSC 52 to set
    the reader's clipboard, a newline to forge a line): refusals, takeovers and fencing
    errors name it escaped, on one line."""
    from _hostile import HOSTILE, assert_safe_line

    record = _record(tmp_path, 1, host=HOSTILE, pid=1, since=time.time(), lease=30.0)
    with pytest.raises(RunOwnedError) as refused:
        claim_run(tmp_path, lease_secs=30)
    assert_safe_line(str(refused.value))
    assert_safe_line(refused.value.owner)
    old = time.time() - 31
    os.utime(record, (old, old))
    with pytest.warns(RunTakenOverWarning) as taken:
        owner = claim_run(tmp_path, lease_secs=30)
    assert owner is not None
    assert_safe_line(str(taken[0].message))
    try:
        # A newer claim written meanwhile by the hostile host: this writer is fenced off.
        _record(tmp_path, owner.epoch + 1, host=HOSTILE, pid=1, since=time.time())
        with pytest.raises(RunOwnershipLostError) as lost:
            check_run_owner(tmp_path / "model.ckpt-1.json")
        assert_safe_line(str(lost.value))
    finally:
        owner.release()


def test_the_ownership_log_names_a_crafted_run_directory_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from _hostile import HOSTILE_NAME, assert_safe_line

    directory = tmp_path / HOSTILE_NAME
    with caplog.at_level("WARNING", logger="monitored.ownership"):
        owner = claim_run(directory, lease_secs=0.2)
        assert owner is not None
        try:
            for record in (directory / OWNER_FOLDER).iterdir():
                record.unlink()  # taken over: the renewal finds its record gone
            deadline = time.monotonic() + 60
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            owner.release()
    (warning,) = caplog.records
    assert "was taken over" in warning.getMessage()
    assert_safe_line(warning.getMessage())


def test_a_live_owner_on_a_host_named_with_osc_52_is_named_escaped(
    tmp_path: Path, holder: list[subprocess.Popen[str]]
) -> None:
    """The claim written by a real process that holds the directory (its host name
    set to OSC 52 and a forged line): the refusal names it escaped, on one line."""
    from _hostile import HOSTILE, assert_safe_line

    script = textwrap.dedent(
        f"""
        import sys
        import monitored._core._ownership as ownership
        ownership._HOST = {HOSTILE!r}  # what its host name may be, as read by others
        owner = ownership.claim_run(sys.argv[1])
        print("claimed", owner.epoch, flush=True)
        sys.stdin.readline()
        owner.release()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    holder.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("claimed"), proc.stderr
    with pytest.raises(RunOwnedError) as refused:
        claim_run(tmp_path)
    assert_safe_line(str(refused.value))
    assert f"process {proc.pid}" in str(refused.value)
    proc.communicate("\n", timeout=60)
