"""Headless Chromium driven over the Chrome DevTools Protocol (no extra packages).

Starts Debian's ``/usr/bin/chromium`` with a fresh profile and
``--remote-debugging-port=0``, reads the port Chromium picked from the
profile's ``DevToolsActivePort`` file, and talks to the page target over the
``websockets`` synchronous client the project already depends on. Only what
the browser tests need: navigate, evaluate, wait for a JS condition, console
capture, screenshot. The browser is stopped by its own PID.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

# Flags from the issue: headless, no sandbox (root in CI containers), no
# network chatter of its own, and audio that starts without a user gesture.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--window-size=1280,1000",
)


def find_chromium() -> str | None:
    """The Chromium binary: ``$CHROMIUM`` or the first of chromium/chromium-browser on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(RuntimeError):
    """A DevTools command failed, or the page threw."""


class Page:
    """One page target: ``call(method, **params)`` plus helpers."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._next_id = 0
        self.console: list[str] = []
        self.exceptions: list[str] = []

    def _on_event(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        params = msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            parts = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.console.append(f"{params.get('type')}: {' '.join(parts)}")
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        my_id = self._next_id
        self._ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"CDP {method} got no reply in {timeout} s")
            msg = json.loads(self._ws.recv(timeout=left))
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise CdpError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self._on_event(msg)

    def pump(self) -> None:
        """Read pending events (console output) without blocking."""
        while True:
            try:
                raw = self._ws.recv(timeout=0)
            except TimeoutError:
                return
            self._on_event(json.loads(raw))

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        """Value of a JS expression (promises awaited; the result by value)."""
        res = self.call("Runtime.evaluate", timeout=timeout, expression=expression,
                        awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise CdpError(str(d.get("exception", {}).get("description") or d.get("text")))
        return res.get("result", {}).get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout: float, poll_s: float = 0.05) -> Any:
        """Poll a JS expression until it is truthy; its value, or TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except CdpError:  # the page is still loading (e.g. rtDemo not defined yet)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} not true after {timeout} s; console: "
                                   f"{self.console[-20:]} exceptions: {self.exceptions}")
            time.sleep(poll_s)

    def screenshot(self, path: Path) -> Path:
        """A full-page PNG."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        res = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": size["width"],
                              "height": size["height"], "scale": 1})
        path.write_bytes(base64.b64decode(res["data"]))
        return path


# The browser's niceness (0-19; the server runs at 0).
BROWSER_NICE = 10


def _devtools_port(profile: Path, proc: subprocess.Popen[bytes], timeout: float) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        if marker.exists():
            first = marker.read_text().splitlines()[:1]
            if first and first[0].strip().isdigit():
                return int(first[0])
        time.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")


@contextmanager
def chromium_page(binary: str, profile: Path, log_path: Path,
                  timeout: float = 30.0) -> Iterator[Page]:
    """Start Chromium with a fresh profile and yield its first page; stop it after."""
    profile.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    # nice: a listener's browser runs on another machine than the server; here both
    # share the test machine's cores, and the server, under test, goes first
    proc = subprocess.Popen(
        ["nice", "-n", str(BROWSER_NICE), binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port = _devtools_port(profile, proc, timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        with connect(page_url, max_size=64 * 1024 * 1024, open_timeout=timeout) as ws:
            page = Page(ws)
            page.call("Page.enable")
            page.call("Runtime.enable")
            yield page
    finally:
        if proc.poll() is None:
            # Chromium's own process group (start_new_session): its renderer and
            # utility children go with it.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
