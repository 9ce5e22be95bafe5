"""Start and stop a server subprocess for ``--spawn``; tiny HTTP GETs.

The server runs as ``python -m rtserver serve --host 127.0.0.1 --port P
--voice V`` on a free port, is waited for on ``GET /ready`` and is stopped by
its own PID (SIGTERM, then SIGKILL after a grace period). Its output goes to
a log file in the results folder.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_base(ws_url: str) -> str:
    """``ws://h:p/v1/stream`` -> ``http://h:p``."""
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def http_get(url: str, timeout: float = 5.0, token: str | None = None) -> tuple[int, bytes]:
    """Blocking GET; ``(status, body)``, status 0 when nothing answered."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


async def aget(url: str, limit_s: float = 5.0, token: str | None = None
               ) -> tuple[int, bytes]:
    return await asyncio.to_thread(http_get, url, limit_s, token)


@dataclass
class SpawnedServer:
    """A server subprocess this harness started and must stop."""

    process: subprocess.Popen[bytes]
    url: str  # ws://127.0.0.1:P/v1/stream
    log_path: Path
    _log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM to our own child's PID, SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self._log.close()
        return self.process.returncode


def spawn(command: Sequence[str], port: int, log_path: Path, *, ready_timeout_s: float = 120.0,
          progress: Callable[[str], None] = lambda m: None,
          env: dict[str, str] | None = None) -> SpawnedServer:
    """Run ``command`` (which must listen on 127.0.0.1:``port``) until /ready is 200."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")  # closed by SpawnedServer.stop
    proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    server = SpawnedServer(proc, f"ws://127.0.0.1:{port}/v1/stream", log_path, log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    progress(f"started server pid {proc.pid}; waiting for {base}/ready")
    while True:
        if proc.poll() is not None:
            server.stop()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"server exited with {proc.returncode} before ready:\n{tail}")
        status, _ = http_get(base + "/ready", timeout=1.0)
        if status == 200:
            return server
        if time.monotonic() > deadline:
            server.stop()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"server not ready after {ready_timeout_s:.0f} s; its log:\n{tail}")
        time.sleep(0.2)


def rtserver_command(port: int, voice: str | None, extra: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "rtserver", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if voice:
        cmd += ["--voice", voice]
    return [*cmd, *extra]
