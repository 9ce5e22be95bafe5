"""Small helpers shared by the deployment tests."""

from __future__ import annotations

import random
import socket
import urllib.request
from collections.abc import Collection
from pathlib import Path


def _ephemeral_low() -> int:
    """The lowest port Linux gives outgoing connections (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports for test servers come from below the ephemeral range: a port the
# kernel handed out (bind to 0) can meanwhile become the local port of any
# outgoing connection on the machine, and a server started seconds later on it
# fails "Address already in use" (a fresh clone's run, 2026-12-05: every front
# end of test_gpu_worker_server restarting on it for the module's 180 s).
_LOW = 10000


def free_port() -> int:
    return free_port_block(1)


def free_port_block(n: int, avoid: Collection[int] = ()) -> int:
    """A port p with p .. p + n - 1 all free now and none in ``avoid``, below
    the ephemeral range: a supervised server's process i serves /metrics on
    ``metrics_port + i``, so a lone free port for the first leaves the others
    to chance (the second taken by another of the test's own ports kept a
    front end from ever starting)."""
    high = _ephemeral_low() - n
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(_LOW, high)
        if set(range(base, base + n)) & set(avoid):
            continue
        held: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", base + i))
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
