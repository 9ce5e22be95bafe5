"""The HTTP API in a browser. CORS: a page on another origin calls the OpenAI
speech API with `fetch`. `/docs`: Swagger UI renders the API from the
server's own files (this machine has no network, so a CDN would fail).

The page is served from `http://localhost:PORT`, the API called at
`http://127.0.0.1:PORT`: two origins to the browser, one server. The request
carries a JSON body and an `Authorization` header, so Chromium sends a real
preflight first; the server lists only the page's origin (`server.cors_origins`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from rtserver.testing.server_thread import ServerThread

from .cdp import Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

KEY = "cors-test-key"


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cors_server(port: int) -> Iterator[ServerThread]:
    srv = ServerThread.with_settings(server={"port": port, "api_keys": KEY,
                                             "cors_origins": f"http://localhost:{port}"}).start()
    yield srv
    srv.stop()


def fetch_speech(page: Page, url: str) -> str:
    """What a page's ``fetch`` of speech from ``url`` got: "STATUS BYTES" or
    "blocked: <error>"."""
    body = json.dumps({"model": "tts-1", "voice": "alloy", "response_format": "wav",
                       "input": "Hello from a page on another origin."})
    return str(page.evaluate(
        f"fetch({json.dumps(url)}, {{method: 'POST', body: {json.dumps(body)}, headers: "
        f"{{'Content-Type': 'application/json', 'Authorization': 'Bearer {KEY}'}}}})"
        ".then(async r => r.status + ' ' + (await r.arrayBuffer()).byteLength,"
        " e => 'blocked: ' + e.name)", timeout=60))


def test_a_listed_origin_fetches_speech_and_another_is_blocked(
        cors_server: ServerThread, port: int, page: Page) -> None:
    page.navigate(f"http://localhost:{port}/health")
    page.wait_for("document.readyState === 'complete' && location.host.startsWith('localhost')",
                  30)
    status, size = fetch_speech(page, f"http://127.0.0.1:{port}/v1/audio/speech").split()
    assert status == "200"
    assert int(size) > 24000 * 2  # over a second of 24 kHz 16-bit speech

    page.navigate(f"http://127.0.0.1:{port}/health")  # an origin the server does not list
    page.wait_for("document.readyState === 'complete' && location.host.startsWith('127.')",
                  30)
    assert fetch_speech(page, f"http://localhost:{port}/v1/audio/speech") == \
        "blocked: TypeError"


def test_docs_render_from_the_servers_own_files(cors_server: ServerThread, port: int,
                                                page: Page) -> None:
    page.navigate(f"http://127.0.0.1:{port}/docs")
    title = page.wait_for("document.querySelector('.swagger-ui .info .title')?.innerText", 60)
    assert "rtserver" in title
    paths = page.wait_for("[...document.querySelectorAll('.opblock-summary-path')]"
                          ".map(e => e.innerText.replace(/\u200b/g, ''))", 30)
    assert "/v1/audio/speech" in paths and "/v1/tokens" in paths
