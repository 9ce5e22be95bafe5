"""Dropping a TCP connection at once.

``asyncio``'s ``transport.abort()`` discards its own buffer and closes the
socket, but a plain close leaves what the kernel holds for a peer that reads
nothing: the socket lives on as an orphan in FIN-WAIT-1, probing a zero
window with its unsent data, until the kernel's orphan retries run out
(``tcp(7)``: ``tcp_orphan_retries``). ``SO_LINGER`` on with a zero timeout
makes the close a reset (RST): the kernel frees the data now and the peer
learns at once that the connection is gone (``socket(7)``: ``SO_LINGER``).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any

_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # struct linger {l_onoff 1, l_linger 0}


def reset(transport: Any) -> None:
    """Abort ``transport`` (an asyncio transport) with a TCP reset: no byte it
    or the kernel still holds for the peer is sent."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # closed already: abort alone
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    transport.abort()
