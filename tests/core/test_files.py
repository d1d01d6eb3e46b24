"""open_regular_file / read_regular_file: regular files only, bounded, confined, never hanging."""

from __future__ import annotations

import io
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import monitored
from monitored import UnsafeFileError, is_plain_name, open_regular_file, read_regular_file
from monitored._core import _files

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
needs_symlinks = pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges")


def finishes(fn: Callable[[], Any], seconds: float = 10.0) -> Any:
    """``fn()``'s result or exception, failing the test if it is still running after
    ``seconds`` (a hang in a daemon thread does not hang the test run)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(("value", fn()))
        except BaseException as exc:
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s: it hung"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def test_open_regular_file_opens_a_regular_file_at_its_start(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"0123456789")
    with open_regular_file(path) as file:
        assert os.fstat(file.fileno()).st_size == 10
        assert file.read(4) == b"0123"
        assert isinstance(file, io.BufferedReader)
    with open_regular_file("data.bin", within=tmp_path, buffering=0) as file:
        assert isinstance(file, io.FileIO)
        assert file.read() == b"0123456789"


@pytest.mark.skipif(not hasattr(os, "O_NONBLOCK"), reason="no O_NONBLOCK here")
def test_the_opened_file_reads_in_blocking_mode(tmp_path: Path) -> None:
    import fcntl

    path = tmp_path / "data.bin"
    path.write_bytes(b"x")
    with open_regular_file(path) as file:
        assert not fcntl.fcntl(file.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK


@needs_fifo
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match=r"events is a FIFO, not a regular file; refused"):
        finishes(lambda: open_regular_file(fifo))
    with pytest.raises(UnsafeFileError, match=r"events is a FIFO, not an event file; refused"):
        finishes(lambda: open_regular_file("events", within=tmp_path, what="an event file"))
    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        finishes(lambda: read_regular_file(fifo, max_bytes=100))


@needs_fifo
def test_an_entry_swapped_for_a_fifo_after_the_check_is_refused_on_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The type seen before opening may be stale: the descriptor is checked again, and
    opening (non-blocking) does not wait for a FIFO's writer meanwhile."""
    fifo = tmp_path / "swapped"
    os.mkfifo(fifo)
    regular = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    monkeypatch.setattr(_files.os, "stat", lambda path: regular)
    with pytest.raises(UnsafeFileError, match="swapped is a FIFO"):
        finishes(lambda: open_regular_file(fifo))


@needs_symlinks
def test_an_entry_swapped_for_a_symlink_after_the_check_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain entry of the directory when it was checked, a link when it is opened."""
    (tmp_path / "data").write_bytes(b"x")
    link = tmp_path / "swapped"
    link.symlink_to(tmp_path / "data")
    checked_as_plain = (str(link), str(link), True)
    monkeypatch.setattr(_files, "_locate", lambda path, within: checked_as_plain)
    with pytest.raises(UnsafeFileError, match="swapped became a symbolic link while being opened"):
        open_regular_file("swapped", within=tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_a_device_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError, match=r"/dev/zero is a device, not a regular file"):
        finishes(lambda: open_regular_file("/dev/zero"))
    with pytest.raises(UnsafeFileError, match="is a device"):
        finishes(lambda: read_regular_file("/dev/zero", max_bytes=1 << 30))


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets here")
def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        try:
            server.bind(str(path))
        except OSError as exc:  # pragma: no cover - a path too long for a socket
            pytest.skip(f"cannot bind a Unix socket here: {exc}")
        with pytest.raises(UnsafeFileError, match="is a socket"):
            finishes(lambda: open_regular_file(path))


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    with pytest.raises(UnsafeFileError, match="sub is a directory, not a regular file"):
        open_regular_file(tmp_path / "sub")
    with pytest.raises(UnsafeFileError, match="sub is a directory"):
        open_regular_file("sub", within=tmp_path)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_regular_file(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        read_regular_file("missing", within=tmp_path, max_bytes=10)
    with pytest.raises(FileNotFoundError):
        open_regular_file("file", within=tmp_path / "no-such-directory")


@needs_symlinks
def test_a_symlink_is_followed_to_a_regular_file_and_refused_to_anything_else(
    tmp_path: Path,
) -> None:
    (tmp_path / "real").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    assert read_regular_file(tmp_path / "link", max_bytes=3) == b"abc"
    with pytest.raises(FileNotFoundError):
        open_regular_file(tmp_path / "broken")
    if os.path.exists("/dev/zero"):
        (tmp_path / "zero").symlink_to("/dev/zero")
        with pytest.raises(UnsafeFileError, match="zero is a device"):
            finishes(lambda: open_regular_file(tmp_path / "zero"))
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
        with pytest.raises(UnsafeFileError, match="to-fifo is a FIFO"):
            finishes(lambda: open_regular_file(tmp_path / "to-fifo"))


@needs_symlinks
def test_within_a_directory_a_symlink_is_followed_only_if_it_stays_inside(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "data").write_bytes(b"inside")
    (tmp_path / "secret").write_bytes(b"outside")
    (directory / "inside").symlink_to(directory / "sub" / "data")
    (directory / "relative").symlink_to(Path("sub") / "data")
    (directory / "out").symlink_to(tmp_path / "secret")
    (directory / "dotdot").symlink_to(Path("..") / "secret")
    assert read_regular_file("inside", within=directory, max_bytes=10) == b"inside"
    assert read_regular_file("relative", within=directory, max_bytes=10) == b"inside"
    for name in ("out", "dotdot"):
        with pytest.raises(
            UnsafeFileError, match=f"{name} is a symbolic link to .*secret, outside"
        ):
            open_regular_file(name, within=directory)
    if os.path.exists("/dev/zero"):
        (directory / "zero").symlink_to("/dev/zero")
        with pytest.raises(UnsafeFileError, match="symbolic link to /dev/zero, outside"):
            finishes(lambda: open_regular_file("zero", within=directory))


@needs_symlinks
def test_within_a_linked_directory_its_own_files_are_inside(tmp_path: Path) -> None:
    """The directory itself may be a link (a run directory pointing at scratch space)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "data").write_bytes(b"ok")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "link").symlink_to(tmp_path / "real" / "data")
    assert read_regular_file("link", within=tmp_path / "alias", max_bytes=2) == b"ok"


@pytest.mark.parametrize(
    "name",
    [
        "../escape",
        "/etc/passwd",
        "sub/file",
        "sub\\file",
        "",
        ".",
        "..",
        "nul\0byte",
        "x" * 256,
        "é" * 128,
        "lone\udcffsurrogate",
    ],
)
def test_a_name_escaping_the_directory_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file").write_bytes(b"x")
    assert not is_plain_name(name)
    with pytest.raises(UnsafeFileError, match="is not a plain file name of the directory") as info:
        open_regular_file(name, within=tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(UnsafeFileError, match="not a plain file name"):
        read_regular_file(name, within=tmp_path, max_bytes=10)


def test_is_plain_name_accepts_plain_names_only() -> None:
    for name in ("model.ckpt-3.json", "events.out.tfevents.1.host", "x" * 255, "é" * 127):
        assert is_plain_name(name), name
    for name in (None, 3, b"bytes", "a/b", "..", "x" * 256):
        assert not is_plain_name(name), name


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    # A sparse file: 1 GiB claimed, no disk used, and nothing of it is read.
    with open(path, "wb") as file:
        file.truncate(1 << 30)
    with pytest.raises(
        UnsafeFileError,
        match=rf"manifest\.json has {1 << 30} bytes, more than the 1024 a manifest may have",
    ) as info:
        open_regular_file(path, max_bytes=1024, what="a manifest")
    assert info.value.path == str(path)
    with pytest.raises(UnsafeFileError, match="more than the 1024"):
        read_regular_file("manifest.json", within=tmp_path, max_bytes=1024)


def test_read_regular_file_reads_up_to_the_bound_exactly(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_regular_file(path, max_bytes=100) == b"x" * 100
    with pytest.raises(UnsafeFileError, match="has 100 bytes, more than the 99"):
        read_regular_file(path, max_bytes=99)
    path.write_bytes(b"")
    assert read_regular_file(path, max_bytes=0) == b""
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        read_regular_file(path, max_bytes=-1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc here")
def test_a_file_that_lies_about_its_size_is_read_no_further_than_the_bound() -> None:
    """``/proc`` files are regular files that claim 0 bytes and hold more."""
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(UnsafeFileError, match="grew past the 10 bytes a regular file may have"):
        read_regular_file("/proc/self/status", max_bytes=10)
    assert read_regular_file("/proc/self/status", max_bytes=1 << 20).startswith(b"Name:")


@pytest.mark.skipif(
    sys.platform == "win32" or os.geteuid() == 0, reason="root reads any file; POSIX modes"
)
def test_a_file_that_cannot_be_opened_raises_the_os_error(tmp_path: Path) -> None:
    path = tmp_path / "private"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(PermissionError):
        open_regular_file(path)


def test_unsafe_file_error_is_the_core_s_own_error() -> None:
    assert issubclass(UnsafeFileError, monitored.MonitoredError)
    assert UnsafeFileError.__module__ == "monitored"
    error = UnsafeFileError("refused", path="/x")
    assert error.path == "/x"
    assert str(error) == "refused"


@needs_fifo
@needs_symlinks
def test_refusals_name_files_from_disk_escaped_on_one_line(tmp_path: Path) -> None:
    """Issue 34 §2: a refused entry's name, and a link's target, hold what a crafted
    directory chose: the message escapes it; ``path`` stays exact."""
    from _hostile import HOSTILE_NAME, assert_safe_line

    directory = tmp_path / "run"
    directory.mkdir()
    fifo = os.path.join(directory, HOSTILE_NAME)  # bytes that are not UTF-8 too
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError) as info:
        finishes(lambda: open_regular_file(fifo))
    assert_safe_line(str(info.value))
    assert "FIFO" in str(info.value)
    assert str(info.value).endswith("\\xff\\xfe is a FIFO, not a regular file; refused")
    assert info.value.path == fifo
    os.remove(fifo)
    outside = tmp_path / HOSTILE_NAME
    outside.write_bytes(b"secret")
    os.symlink(outside, directory / "state.json")
    with pytest.raises(UnsafeFileError) as info:
        read_regular_file("state.json", within=directory, max_bytes=100)
    assert_safe_line(str(info.value))
    assert "is a symbolic link to" in str(info.value)
