"""A distinct CUDA stream per family of CUDA graphs, to capture them on.

Why: torch keeps one cuBLAS / cuBLASLt workspace per (handle, stream) pair
(``CublasHandlePool.cpp``: ``cublas_handle_stream_to_workspace``), the handle
being per thread, and ``torch.cuda.graph`` captures on one class-wide stream
unless given one. Two graph families captured on the same thread (the
ChatTTS decoder's main lane and its first lane) therefore bake the *same*
workspace pointer into their GEMMs; replayed at the same time on two streams,
they write it concurrently. A capture stream of its own per family gives each
family its own workspace (allocated in that family's graph pool).

``torch.cuda.Stream()`` hands out streams round-robin from a pool of 32, so a
new ``Stream`` object is not a new stream: ``CaptureStreams`` skips raw
streams it already handed out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

POOL_DRAWS = 64  # torch's stream pool holds 32 streams per priority (kStreamsPerPool)


class CaptureStreams:
    """Hands out streams whose raw handles (``cuda_stream``) differ from every
    one handed out before; ``factory`` makes a stream (``torch.cuda.Stream``)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._taken: set[int] = set()
        self._lock = threading.Lock()  # the engine and the decoder capture on two threads

    def new(self) -> Any:
        with self._lock:
            for _ in range(POOL_DRAWS):
                stream = self._factory()
                raw = int(stream.cuda_stream)
                if raw not in self._taken:
                    self._taken.add(raw)
                    return stream
        raise RuntimeError(f"no CUDA stream left for a graph family's capture "
                           f"({len(self._taken)} taken)")


_STREAMS: dict[str, CaptureStreams] = {}
_STREAMS_LOCK = threading.Lock()


def capture_stream(device: Any) -> Any:
    """A stream of ``device`` (a ``torch.device``) no other graph family of this
    process captures on: pass it as ``torch.cuda.graph(..., stream=...)``."""
    import torch

    key = str(device)
    with _STREAMS_LOCK:
        streams = _STREAMS.get(key)
        if streams is None:
            streams = _STREAMS[key] = CaptureStreams(lambda: torch.cuda.Stream(device))
    return streams.new()
