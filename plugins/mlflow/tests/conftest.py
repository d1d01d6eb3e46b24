"""Fixtures of the monitored-mlflow tests: real MLflow stores and a real ``mlflow server``.

A local store is a SQLite database in ``tmp_path``: MLflow's own default kind of
store. Creating one runs MLflow's schema migrations (seconds), so the database
is created once per test session and copied for each test. The server is the
full ``mlflow`` distribution's ``mlflow server`` on 127.0.0.1 and a free port,
with a SQLite backend, started by :func:`start_server` and stopped after.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracking URI in the developer's shell must not send the tests' runs anywhere."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MONITORED_PLUGIN_OPTIONS", raising=False)
    # MLflow's HTTP client retries a refused connection for minutes by default.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()  # creates the schema
    return path


@pytest.fixture
def tracking_uri(_template_db: Path, tmp_path: Path) -> str:
    """A fresh local SQLite store in ``tmp_path``."""
    path = tmp_path / "mlflow.db"
    shutil.copyfile(_template_db, path)
    return f"sqlite:///{path}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def nobody_listening() -> str:
    """The URI of a port on 127.0.0.1 where no server listens (connections are refused)."""
    return f"http://127.0.0.1:{free_port()}"


@dataclass
class Server:
    """A running ``mlflow server``."""

    uri: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """Stop it (SIGTERM to its process group, then SIGKILL) and wait for it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(20)


def start_server(directory: Path, template: Path) -> Server:
    """``mlflow server`` with a SQLite backend in ``directory``, once it answers /health."""
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "server.db"
    shutil.copyfile(template, database)
    port = free_port()
    log = directory / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{database}",
                "--artifacts-destination",
                str(directory / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=directory,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"mlflow server did not answer: {log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture
def mlflow_server(
    _template_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], Server]]:
    """Start real MLflow servers on demand; every one is stopped after the test."""
    started: list[Server] = []

    def start() -> Server:
        server = start_server(tmp_path_factory.mktemp("mlflow-server"), _template_db)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
