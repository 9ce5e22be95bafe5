"""A process's TCP sockets, from /proc (Linux): what a test can see of a
server process that its own counters do not say (its descriptors of one
connection, whether it still listens)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

LISTEN = "0A"  # the state column of /proc/net/tcp


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds a descriptor of."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed while we looked
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(int(link[len("socket:["):-1]))
    return inodes


def _tcp_rows(pid: int) -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, inode) of every TCP socket in the
    network namespace of ``pid``."""
    rows = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            rows.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16),
                         f[3], int(f[9])))
    return rows


def held_peers(pid: int, port: int) -> set[int]:
    """Client ports of the TCP connections to ``port`` that process ``pid``
    holds a descriptor of (any state but LISTEN: a connection the peer closed
    counts until the process closes its end)."""
    mine = socket_inodes(pid)
    return {remote for local, remote, state, inode in _tcp_rows(pid)
            if local == port and state != LISTEN and inode in mine}


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on ``port``."""
    mine = socket_inodes(pid)
    return any(local == port and state == LISTEN and inode in mine
               for local, _, state, inode in _tcp_rows(pid))
