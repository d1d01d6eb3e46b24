"""Checkpoints in an S3-protocol store: a real server on 127.0.0.1, killed and silenced.

``moto_server`` (moto's stand-alone S3 server) runs in a subprocess; s3fs talks to
it through a TCP proxy of this module, which forwards bytes until the save under
test sends the request for its manifest, and then either dies (every connection
reset, the port closed: a server killed mid-save) or goes silent (connections
accepted and read, nothing forwarded or answered). Another test stops the server
itself with SIGSTOP. Each time the save must fail within its bounds with a
``CheckpointWriteError`` naming the store and the step, and the newest good
checkpoint must be the one a restore finds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import fsspec
import numpy as np
import pytest
import s3fs  # type: ignore[import-untyped]  # the s3 extra; in the dev group

import monitored
import monitored_checkpoint as checkpoint
from monitored_checkpoint import CheckpointStoreTimeoutError, CheckpointWriteError
from monitored_checkpoint._store import open_store

#: A training on s3:// is told once that ownership cannot be held there (docs/checkpoint.md,
#: "One writer per run"; tests/core/test_ownership.py checks that warning): not what these
#: tests are about.
pytestmark = pytest.mark.filterwarnings("ignore::monitored.RunOwnershipWarning")

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
BUCKET = "runs"
#: Generous: the error must come from the bounds below, never from this.
TEST_TIMEOUT = 120.0
#: The bounds under test, small so that the tests are quick.
BOUNDS = {
    "MONITORED_CHECKPOINT_CONNECT_TIMEOUT": "2",
    "MONITORED_CHECKPOINT_READ_TIMEOUT": "2",
    "MONITORED_CHECKPOINT_RETRIES": "2",
    "MONITORED_CHECKPOINT_SAVE_TIMEOUT": "6",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError("moto_server did not listen within 60 s")


@pytest.fixture
def moto() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real S3-protocol server on 127.0.0.1: its URL and its process."""
    port = free_port()
    process = subprocess.Popen(
        [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}", process
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Credentials for the test server, the bounds, and no s3fs instance kept between tests."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name, value in BOUNDS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {})
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def use_endpoint(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """Point s3fs at ``url`` through fsspec's configuration (see docs/checkpoint.md)."""
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": url})
    s3fs.S3FileSystem.clear_instance_cache()


def make_bucket(url: str) -> None:
    fs = s3fs.S3FileSystem(endpoint_url=url, skip_instance_cache=True)
    fs.mkdir(BUCKET)


class Proxy:
    """A TCP proxy to ``target``, which fails on demand when a request names ``trigger``.

    ``mode`` is what happens then: ``"kill"`` resets every connection and closes
    the port (a server killed), ``"silence"`` keeps accepting and reading but
    forwards and answers nothing (a server that stopped answering).
    """

    def __init__(self, target_port: int, trigger: bytes, mode: str) -> None:
        self.target_port = target_port
        self.trigger = trigger
        self.mode = mode
        self.failed = threading.Event()
        self.failed_at: float | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self._track(client)
            if self.failed.is_set():
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self._track(server)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _swallow(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass

    def _pipe(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if upstream and not self.failed.is_set() and self.trigger in data:
                    self._fail()
                if self.failed.is_set():
                    self._swallow(source)  # silence: read on, answer nothing
                    return
                sink.sendall(data)

    def _fail(self) -> None:
        self.failed_at = time.monotonic()
        self.failed.set()
        if self.mode == "kill":
            self.close()

    def close(self) -> None:
        """Reset every connection and close the port."""
        self.listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                sock.close()


def step(state: monitored.TrainState) -> dict[str, Any]:
    state["w"] = state["w"] + 1.0
    state.global_step += 1
    return {}


async def train(directory: str, last_step: int, listeners: list[object] | None = None) -> None:
    state = monitored.TrainState({"w": np.zeros(64, np.float32)})
    saver = checkpoint.CheckpointSaverHook(
        directory,
        save_steps=2,
        asynchronous=False,
        handle_signals=False,
        listeners=listeners,
    )
    stop = monitored.StopAtStepHook(last_step=last_step)
    async with monitored.MonitoredSession(state, hooks=[saver, stop]) as sess:
        while not sess.should_stop():
            await sess.run(step)


def restored_step(url: str, directory: str) -> tuple[int, np.ndarray]:
    s3fs.S3FileSystem.clear_instance_cache()
    fsspec.config.conf["s3"] = {"endpoint_url": url}
    state = monitored.TrainState({"w": np.zeros(64, np.float32)})
    manifest = checkpoint.restore_latest(state, directory)
    assert manifest is not None
    return manifest.step, np.asarray(state["w"])


async def test_save_and_restore_through_a_real_s3_server(
    moto: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = moto
    make_bucket(url)
    use_endpoint(monkeypatch, url)
    directory = f"s3://{BUCKET}/run"
    with anyio.fail_after(TEST_TIMEOUT):
        await train(directory, 5)
    step_, w = restored_step(url, directory)
    assert step_ == 5
    np.testing.assert_array_equal(w, np.full(64, 5.0, np.float32))
    assert checkpoint.latest_checkpoint(directory) == f"{directory}/model.ckpt-5"


def test_the_endpoint_may_come_from_aws_endpoint_url(
    moto: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = moto
    make_bucket(url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    state = monitored.TrainState({"w": np.ones(4, np.float32)})
    state.global_step = 3
    checkpoint.Saver().save(state, f"s3://{BUCKET}/env/model.ckpt")
    assert checkpoint.latest_checkpoint(f"s3://{BUCKET}/env") == f"s3://{BUCKET}/env/model.ckpt-3"


def test_the_bounds_reach_the_s3_client_and_a_users_setting_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store: Any = open_store(f"s3://{BUCKET}/x")
    config = store._fs.config_kwargs
    assert config["connect_timeout"] == 2.0
    assert config["read_timeout"] == 2.0
    assert config["retries"] == {"max_attempts": 2, "mode": "standard"}
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"read_timeout": 7}})
    s3fs.S3FileSystem.clear_instance_cache()
    store = open_store(f"s3://{BUCKET}/x")
    assert store._fs.config_kwargs["read_timeout"] == 7
    assert store._fs.config_kwargs["connect_timeout"] == 2.0
    monkeypatch.setenv("MONITORED_CHECKPOINT_SAVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="MONITORED_CHECKPOINT_SAVE_TIMEOUT='soon'"):
        open_store(f"s3://{BUCKET}/x")


@pytest.mark.parametrize("mode", ["kill", "silence"])
async def test_a_server_lost_mid_save_is_a_bounded_write_error_and_the_last_checkpoint_stays(
    moto: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    url, _ = moto
    make_bucket(url)
    port = int(url.rsplit(":", 1)[1])
    # The save of step 4 fails when it sends its manifest: its data file is written.
    proxy = Proxy(port, trigger=b"model.ckpt-4.json", mode=mode)
    use_endpoint(monkeypatch, proxy.url)
    directory = f"s3://{BUCKET}/run"
    try:
        with anyio.fail_after(TEST_TIMEOUT), pytest.raises(CheckpointWriteError) as raised:
            await train(directory, 10)
        failed_at = proxy.failed_at
        assert failed_at is not None
        elapsed = time.monotonic() - failed_at
    finally:
        proxy.close()
    message = str(raised.value)
    assert f"{directory}/model.ckpt-4" in message
    assert "(step 4)" in message
    if mode == "silence":
        cause = raised.value.__cause__
        assert isinstance(cause, CheckpointStoreTimeoutError)
        assert f"checkpoint store {directory} did not answer" in str(cause)
        assert "MONITORED_CHECKPOINT_SAVE_TIMEOUT=6" in str(cause)
    # The newest good checkpoint is untouched; step 4's data file is no checkpoint.
    step_, w = restored_step(url, directory)
    assert step_ == 2
    np.testing.assert_array_equal(w, np.full(64, 2.0, np.float32))
    names = s3fs.S3FileSystem(endpoint_url=url, skip_instance_cache=True).ls(f"{BUCKET}/run")
    assert f"{BUCKET}/run/model.ckpt-4.json" not in names
    print(f"{mode}: CheckpointWriteError {elapsed:.1f}s after the server was lost")


async def test_a_stopped_server_process_is_a_bounded_write_error(
    moto: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP on the server process mid-run: its port still accepts connections
    (the kernel does), nothing answers."""
    url, process = moto
    make_bucket(url)
    use_endpoint(monkeypatch, url)
    directory = f"s3://{BUCKET}/run"
    stopped: list[float] = []

    class StopTheServer:
        def before_save(self, session: monitored.MonitoredSession, step: int) -> None:
            if step == 4:
                os.kill(process.pid, signal.SIGSTOP)
                stopped.append(time.monotonic())

    try:
        with anyio.fail_after(TEST_TIMEOUT), pytest.raises(CheckpointWriteError) as raised:
            await train(directory, 10, listeners=[StopTheServer()])
        elapsed = time.monotonic() - stopped[0]
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert "(step 4)" in str(raised.value)
    assert isinstance(raised.value.__cause__, CheckpointStoreTimeoutError)
    step_, _ = restored_step(url, directory)
    assert step_ == 2
    print(f"SIGSTOP: CheckpointWriteError {elapsed:.1f}s after the server stopped")


def test_the_endpoint_and_credentials_may_come_from_fsspecs_environment_variables(
    moto: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """``FSSPEC_S3_ENDPOINT_URL``, ``FSSPEC_S3_KEY``, ``FSSPEC_S3_SECRET``, read by
    fsspec when it is imported (so in a process of its own)."""
    url, _ = moto
    make_bucket(url)
    script = (
        "import numpy as np, monitored, monitored_checkpoint as c\n"
        "s = monitored.TrainState({'w': np.ones(64, np.float32)}); s.global_step = 7\n"
        f"c.Saver().save(s, 's3://{BUCKET}/fsspec-env/model.ckpt')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "FSSPEC_S3_ENDPOINT_URL": url,
        "FSSPEC_S3_KEY": "testing",
        "FSSPEC_S3_SECRET": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=TEST_TIMEOUT)
    step_, _ = restored_step(url, f"s3://{BUCKET}/fsspec-env")
    assert step_ == 7


def test_a_restore_from_a_store_that_stopped_answering_is_an_error_not_a_skip(
    moto: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that does not answer says nothing about its checkpoints: the restore
    fails naming the store, rather than taking the newest for damaged and
    falling back to an older one."""
    url, process = moto
    make_bucket(url)
    use_endpoint(monkeypatch, url)
    directory = f"s3://{BUCKET}/run"
    state = monitored.TrainState({"w": np.ones(64, np.float32)})
    checkpoint.Saver().save(state, f"{directory}/model.ckpt")
    monkeypatch.setenv("MONITORED_CHECKPOINT_OPERATION_TIMEOUT", "3")
    s3fs.S3FileSystem.clear_instance_cache()  # no listing cached from the save
    os.kill(process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(CheckpointStoreTimeoutError) as raised:
            checkpoint.restore_latest(state, directory)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert f"checkpoint store {directory} did not answer" in str(raised.value)
    assert "MONITORED_CHECKPOINT_OPERATION_TIMEOUT=3" in str(raised.value)
