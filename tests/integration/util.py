"""Helpers for integration tests: plain HTTP and /metrics values."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

from rtserver.testing.server_thread import ServerThread


def http(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def metric(srv: ServerThread, name: str, **labels: str) -> float:
    _, _, body = http(srv.http + "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
    m = re.search("^" + pattern + "$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0
