"""SIGTERM to a real server process: a drain with contexts in flight, and
during start-up; both exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rtserver.bench.server_proc import free_port, http_get, rtserver_command

pytestmark = pytest.mark.slow


def test_sigterm_during_start_up_exits_0(tmp_path: Path) -> None:
    port = free_port()
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(rtserver_command(port, None), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while b"loading" not in (tmp_path / "server.log").read_bytes() \
                    and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert http_get(f"http://127.0.0.1:{port}/ready")[0] != 200
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    log_text = (tmp_path / "server.log").read_bytes()
    assert b"stopping during start-up" in log_text  # start-up was cut short, not finished
    assert b"ready on" not in log_text
