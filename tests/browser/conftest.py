"""Fixtures for the browser tests: a real rtserver subprocess and headless Chromium.

The server runs ``python -m rtserver serve`` with the embedded Piper voice on a
free loopback port and one API key (so the demo's ``?token=`` path is used);
it is stopped by its PID. Each test gets a fresh Chromium profile. Set
``RTSERVER_TEST_OUTPUT`` to a directory to also keep the screenshots there.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rtserver.testing.wait import wait_until

from .cdp import Page, chromium_page, find_chromium

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 120.0  # loading and warming the Piper voice on a slow CI core


@dataclass(frozen=True)
class DemoServer:
    http: str
    token: str
    log: Path

    def url(self, query: str = "") -> str:
        """The demo page with ``token`` added to ``query``."""
        sep = "&" if query else ""
        return f"{self.http}/?{query}{sep}token={self.token}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http}/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# [hints] jitter_ms for the server the browser tests talk to (the default is 40).
BROWSER_HOST_JITTER_MS = 120


@pytest.fixture(scope="session")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium not installed (scripts/install_browser.sh installs it)")
    return binary


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    port = _free_port()
    token = secrets.token_urlsafe(12)
    log = tmp_path_factory.mktemp("rtserver") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVER_")}
    env["RTSERVER_SERVER_API_KEYS"] = token
    # The hints' allowance for scheduling noise, as an operator sets it for this host:
    # the server shares the test machine's 2 cores with Chromium, and at the default
    # 40 ms a first context's second chunk came 5 ms and 26.5 ms past its hint
    # (fresh clones, 2026-12-06). A dedicated server keeps the default.
    env["RTSERVER_HINTS_JITTER_MS"] = str(BROWSER_HOST_JITTER_MS)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rtserver", "serve", "--host", "127.0.0.1",
             "--port", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    http = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until(lambda: _ready(http) or proc.poll() is not None, "rtserver is ready",
                       READY_TIMEOUT_S)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{log.read_text()[-3000:]}") from None
        if proc.poll() is not None:
            raise RuntimeError(f"rtserver exited with {proc.returncode}:\n"
                               f"{log.read_text()[-3000:]}")
        yield DemoServer(http=http, token=token, log=log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the server drains, then exits
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def page(chromium: str, tmp_path: Path) -> Iterator[Page]:
    with chromium_page(chromium, tmp_path / "profile", tmp_path / "chromium.log") as p:
        yield p


@pytest.fixture
def output_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Where a test keeps its artefacts (screenshots)."""
    out = tmp_path / "output"
    out.mkdir()
    extra = os.environ.get("RTSERVER_TEST_OUTPUT")
    if extra:
        # Copied after the test, so that CI can keep them.
        def keep() -> None:
            dest = Path(extra) / "browser"
            dest.mkdir(parents=True, exist_ok=True)
            for f in out.iterdir():
                shutil.copy2(f, dest / f"{request.node.name}-{f.name}")
        request.addfinalizer(keep)
    return out
