"""Small helpers shared by the deployment tests."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Collection


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int, avoid: Collection[int] = ()) -> int:
    """A port p with p .. p + n - 1 all free now and none in ``avoid``: a
    supervised server's process i serves /metrics on ``metrics_port + i``, so a
    lone free port for the first leaves the others to chance (the second taken
    by another of the test's own ports kept a front end from ever starting)."""
    for _ in range(200):
        held: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", held[0].getsockname()[1] + i if i else 0))
            base = int(held[0].getsockname()[1])
            if not avoid or not set(range(base, base + n)) & set(avoid):
                return base
        except OSError:  # one of the block taken: another base
            pass
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no block of {n} free ports on 127.0.0.1")


def scrape(url: str, timeout: float = 10.0) -> str:
    """The body of a /metrics page (no proxy: loopback only)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return str(resp.read().decode())
