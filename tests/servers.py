"""Real servers a test starts on 127.0.0.1: a free port, a process group that is stopped after, a MLflow server."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(command: list[str], ready_url: str, log: Path, **env: str) -> Iterator[subprocess.Popen]:
    """Start `command` (with `env` added to the environment) in its own process group, wait until `ready_url`
    answers 200, stop the group after."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **env})
    try:
        for _ in range(600):  # up to 2 minutes: MLflow migrates its SQLite database first
            if process.poll() is not None:
                pytest.fail(f"{command[:3]} exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(ready_url, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                try:
                    process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        else:
            pytest.fail(f"{ready_url} did not answer: {log.read_text()[-2000:]}")
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """A real `mlflow server` with a SQLite backend under `root` on a free port; yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
               "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]
    # the tracking server alone: no background job runner (MLflow 3 starts seven worker processes for it)
    with server(command, f"http://127.0.0.1:{port}/health", root / "server.log",
                MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"):
        yield f"http://127.0.0.1:{port}"
