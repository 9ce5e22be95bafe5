"""The Piper decoder in bfloat16, on CPUs that compute it natively (OpenVINO).

Why: the decoder is most of a Piper stream's CPU. OpenVINO's CPU plugin runs
its convolutions on bf16 inputs with float32 accumulation (AVX-512 BF16 or
AMX), at 0.59-0.71x the CPU time of onnxruntime's float32 blocked decoder per
second of audio (eager, near and bulk plans on four sentences, 16-frame
buckets; ``python -m rtserver.tools.measure.piper bf16``). The audio differs
from float32 by -37 to -41 dB (RMS, re the signal) and wide-band PESQ against
the float32 decode is 4.61-4.62 (4.64 for identical audio; Opus at the
server's complexity 2 costs more: 4.40). Where the CPU lacks native bf16,
OpenVINO would emulate it (slower than float32): ``native_bf16`` says which.

Shapes: OpenVINO prepares kernels and memory per input shape and keeps them
(RSS grew to 3 GB over ~200 distinct window lengths). So every window is
rounded up to a multiple of ``bucket_frames``: extended to the left where the
latent has frames there (more left context leaves the emitted samples as
they were), else padded on the right with zero frames; that only happens at a
sentence's true end, where it changes the last receptive field of audio by
under -60 dB re RMS. With windows of at most ``max_frames`` the shapes, and
so the memory, are bounded; the runtime cache holds all of them.
"""

from __future__ import annotations

import logging
import math
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rtserver.engine.cpu_features import native_bf16
from rtserver.errors import ConfigError
from rtserver.voices.piper.graph import DecoderCut

FloatArray = npt.NDArray[np.float32]
log = logging.getLogger("rtserver.piper")

# 16 frames (186 ms at hop 256, 22050 Hz): 9-10 shapes for Piper's plans, and
# 0.342 ms of CPU per emitted frame over random window lengths (8: 13 shapes,
# the same cost; 32: 6 shapes, 10-25 % more CPU from padding).
BUCKET_FRAMES = 16
# The load check: bf16 vs float32 on random latents, RMS of the difference re
# the float32 audio's RMS. Measured -37..-41 dB on speech; a voice far above
# that is not served in bf16.
MAX_ERROR_DB = -30.0


def bucket_window(start: int, end: int, n_frames: int, bucket: int) -> tuple[int, int]:
    """``(first, pad)``: decode frames ``[first, end)`` plus ``pad`` zero frames
    for the window ``[start, end)`` of a latent of ``n_frames`` frames, so the
    decoded length is a multiple of ``bucket``; ``first <= start``."""
    if not 0 <= start < end <= n_frames:
        raise ValueError(f"window [{start}, {end}) outside 0..{n_frames}")
    size = math.ceil((end - start) / bucket) * bucket
    first = max(0, end - size)
    return first, size - (end - first)


class Bf16Decoder:
    """The decoder graph compiled by OpenVINO in bf16, for ``streams`` callers
    at a time (``threads_per_stream`` threads each); ``decode`` is thread-safe
    and blocks while all ``streams`` requests are in use."""

    def __init__(self, decoder: Path, cut: DecoderCut, hop: int, *, streams: int,
                 max_frames: int, threads_per_stream: int = 1,
                 bucket_frames: int = BUCKET_FRAMES) -> None:
        try:
            import openvino
        except ImportError:
            raise ConfigError("piper decoder_precision 'bfloat16' needs OpenVINO: pip install "
                              "'rtserver[piper]'") from None
        if min(streams, max_frames, threads_per_stream, bucket_frames) < 1:
            raise ValueError("streams, max_frames, threads_per_stream and bucket_frames "
                             "must be >= 1")
        self.cut = cut
        self._hop = hop
        self._bucket = bucket_frames
        shapes = math.ceil(max_frames / bucket_frames) + 1
        core = openvino.Core()
        try:
            self._model = core.compile_model(str(decoder), "CPU", {
                "INFERENCE_PRECISION_HINT": "bf16",
                "NUM_STREAMS": streams,  # one request per pool worker at a time
                "INFERENCE_NUM_THREADS": streams * threads_per_stream,
                "ENABLE_CPU_PINNING": False,  # the cores are shared with the front
                "CPU_RUNTIME_CACHE_CAPACITY": 4 * shapes,  # each shape's kernels, kept
            })
        except Exception as exc:  # OpenVINO raises RuntimeError with its own text
            raise ConfigError(f"Piper decoder {decoder} in OpenVINO: {exc}") from None
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.inputs = {port.get_any_name(): int(port.get_partial_shape()[1].get_length())
                        for port in self._model.inputs}
        requests = [self._model.create_infer_request() for _ in range(streams)]
        # Every shape once now, not in a stream's first chunks: a shape's
        # first run prepares its kernels (2.5-4x a later run), for every
        # request of the model (they share the runtime cache). The requests
        # share the shapes out: the embedded voice's 10 shapes took 3.4 s on one
        # request and 1.7 s on two, on 2 cores (then 0.2 s on either).
        self.sizes = tuple(range(bucket_frames, shapes * bucket_frames, bucket_frames))

        def run(request: Any, size: int) -> None:
            request.infer(self._feed(np.zeros((1, self.inputs[cut.z], size), np.float32), None))

        # The first shape on this thread alone: OpenVINO's Python binding sets
        # up its numpy bridge at its first tensor access (pybind11's
        # gil_safe_call_once_and_store), and two threads that race into it
        # deadlock (py-spy of a hung start: one in __cxa_guard_acquire, the
        # other in that call_once; 1 of 14 `rtserver say` runs, 2026-12-06).
        run(requests[0], self.sizes[0])
        rest = self.sizes[1:]
        lanes = min(len(requests), len(rest))

        def warm(lane: int) -> None:
            for size in rest[lane::lanes]:
                run(requests[lane], size)

        if lanes:
            with ThreadPoolExecutor(lanes, thread_name_prefix="bf16-warm") as warming:
                list(warming.map(warm, range(lanes)))  # raises a lane's error
        for request in requests:
            self._requests.put(request)
        self.shapes: set[int] = set(self.sizes)

    def _feed(self, window: FloatArray, g: FloatArray | None) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {self.cut.z: np.ascontiguousarray(window,
                                                                          dtype=np.float32)}
        if self.cut.g is not None:
            feed[self.cut.g] = (g if g is not None else
                                 np.zeros((1, self.inputs[self.cut.g], 1), np.float32))
        return feed

    def decode(self, z: FloatArray, start: int, end: int, g: FloatArray | None = None
               ) -> FloatArray:
        """The decoder's audio for frames ``[start, end)`` of ``z`` ``[1, ch, n]``:
        ``(end - start) * hop`` samples, as a decode of that window alone."""
        n = int(z.shape[2])
        first, pad = bucket_window(start, end, n, self._bucket)
        window = z[:, :, first:end]
        if pad:
            window = np.concatenate(
                [window, np.zeros((z.shape[0], z.shape[1], pad), dtype=np.float32)], axis=2)
        feed = self._feed(window, g)
        self.shapes.add(int(window.shape[2]))
        request = self._requests.get()
        try:
            # the feed is ours until infer returns; the output is a copy
            audio = np.asarray(request.infer(feed, share_inputs=True)[0],
                               dtype=np.float32).reshape(-1)
        finally:
            self._requests.put(request)
        skip = (start - first) * self._hop
        return audio[skip:skip + (end - start) * self._hop]


def error_db(bf16: Bf16Decoder, float32: Any, frames: int = 64) -> float:
    """RMS of bf16 minus ``float32`` (an onnxruntime session of the same graph)
    re the float32 audio's RMS, on random latents of ``frames`` frames."""
    cut = bf16.cut
    rng = np.random.default_rng(0)
    feed = {name: rng.standard_normal((1, ch, frames if name == cut.z else 1)
                                      ).astype(np.float32) for name, ch in bf16.inputs.items()}
    want = np.asarray(float32.run(None, feed)[0], dtype=np.float32).reshape(-1)
    got = bf16.decode(feed[cut.z], 0, frames, feed.get(cut.g) if cut.g else None)
    rms = float(np.sqrt(np.mean(want ** 2)))
    err = float(np.sqrt(np.mean((got - want) ** 2)))
    return 20.0 * math.log10(max(err, 1e-12) / max(rms, 1e-12))


__all__ = ["BUCKET_FRAMES", "Bf16Decoder", "bucket_window", "error_db", "native_bf16"]
