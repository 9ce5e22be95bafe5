"""ChatTTS's streaming vocoder: one per process, one ``ChatTTSStream`` per segment.

    vocoder = ChatTTSVocoder.load(root, device="cuda")   # root holds asset/; or dummy=True
    await vocoder.start()
    stream = vocoder.open_stream()
    for hidden in ...:                                 # float32 [T, 768] (route "decoder")
        for chunk in await stream.push(hidden):        # PcmChunk, 24 kHz float32
            ...
    for chunk in await stream.finish():                # the tail
        ...
    await vocoder.close()

Concatenated, a stream's chunks are ``steps * 512`` samples: the full decode of
its steps, except near seams cut inside the decoder's reach (the first one;
see ``config``). Decodes of all streams are batched (``batcher.DecodeBatcher``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import PcmChunk
from rtserver.errors import EngineFailed
from rtserver.vocoder.batcher import BatcherConfig, BatcherStats, DecodeBatcher
from rtserver.vocoder.chattts.checkpoint import Route, load_audio_models, random_audio_models
from rtserver.vocoder.chattts.config import ChatTTSDecodeConfig
from rtserver.vocoder.chattts.dims import REAL_DIMS, STEP_SAMPLES
from rtserver.vocoder.chattts.model import ChatTTSWindowDecoder, StepWindow
from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob, SeamJoiner


class ChatTTSVocoder:
    """Owns the window decoder and the batcher; ``start`` before opening streams."""

    def __init__(self, decoder: ChatTTSWindowDecoder, config: ChatTTSDecodeConfig | None = None
                 ) -> None:
        self.config = config or ChatTTSDecodeConfig(route=decoder.route)
        if self.config.route != decoder.route:
            raise ValueError(f"config route {self.config.route!r} != decoder route "
                             f"{decoder.route!r}")
        self.decoder = decoder
        self.route: Route = decoder.route
        self.sample_rate: int = decoder.sample_rate
        self.samples_per_step: int = STEP_SAMPLES
        self.width: int = decoder.width
        self.codebook_size: int = decoder.dims.vq.codebook_size
        self._chunking = self.config.chunk_config()
        pad = self.config.max_pad_fraction
        if pad < 0:
            pad = 4.0 if decoder.device.type == "cuda" else 0.25
        self._batcher: DecodeBatcher[StepWindow] = DecodeBatcher(decoder, BatcherConfig(
            max_batch=self.config.max_batch, max_batch_frames=self.config.max_batch_frames,
            max_pad_fraction=pad))

    @classmethod
    def load(cls, root: Path | None, *, route: str | None = None, dummy: bool = False,
             device: str = "cpu", config: ChatTTSDecodeConfig | None = None) -> ChatTTSVocoder:
        """From an upstream-layout folder (``root/asset/...``), or the real shapes
        with random weights (``dummy=True``: the speed is real, the sound is noise)."""
        config = config or ChatTTSDecodeConfig(route=route or "decoder")
        if route is not None and route != config.route:
            raise ValueError(f"route {route!r} != config route {config.route!r}")
        r = cast(Route, config.route)
        mel: Any
        if dummy:
            dec, dvae, vocos = random_audio_models(REAL_DIMS, seed=config.dummy_seed,
                                                   layer_scale=config.dummy_layer_scale)
            mel, dims = (dec if r == "decoder" else dvae), REAL_DIMS
        elif root is None:
            raise ValueError("a ChatTTS model folder is needed unless dummy=True")
        else:
            mel, vocos, dims = load_audio_models(Path(root), r)
        decoder = ChatTTSWindowDecoder(
            mel, vocos, dims, r, device=device, cuda_graphs=config.cuda_graphs, bf16=config.bf16,
            graph_max_batch=config.max_batch, graph_frame_buckets=config.graph_frame_buckets,
            graph_max_cells=config.graph_max_cells)
        return cls(decoder, config)

    @property
    def chunking(self) -> ChunkConfig:
        """The chunk plan (frame = one GPT step); ``chunking.stream_plan`` takes it."""
        return self._chunking

    @property
    def stats(self) -> BatcherStats:
        """Batching counters (calls, call sizes, decode seconds) for metrics."""
        return self._batcher.stats.snapshot()

    async def start(self, *, warm_up: bool = True) -> None:
        """Start the decode thread; ``warm_up`` runs one decode (and on CUDA with
        graphs captures them all, and the first lane's) on it before returning."""
        await self._batcher.start()
        if warm_up:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._batcher.executor, self.decoder.warm_up)
            if self.config.first_lane:
                lane = await loop.run_in_executor(
                    self._batcher.executor, self.decoder.first_lane,
                    self.config.first_lane_batch, self.config.first_lane_steps)
                if lane is not None:
                    self._batcher.enable_first_lane(lane)

    async def close(self) -> None:
        await self._batcher.close()

    def open_stream(self) -> ChatTTSStream:
        return ChatTTSStream(self, self._batcher)


class _Steps:
    """A stream's steps still needed, in one growable array (amortised O(1) append)."""

    __slots__ = ("base", "data", "n")

    def __init__(self, width: int, dtype: type[np.generic]) -> None:
        self.data: npt.NDArray[Any] = np.zeros((64, width), dtype=dtype)
        self.base = 0  # step index of data[0]
        self.n = 0  # rows in use

    def append(self, rows: npt.NDArray[Any]) -> None:
        need = self.n + len(rows)
        if need > len(self.data):
            grown = np.zeros((max(need, 2 * len(self.data)), self.data.shape[1]),
                             dtype=self.data.dtype)
            grown[:self.n] = self.data[:self.n]
            self.data = grown
        self.data[self.n:need] = rows
        self.n = need

    def window(self, start: int, end: int) -> npt.NDArray[Any]:
        return self.data[start - self.base:end - self.base].copy()

    def drop_before(self, step: int) -> None:
        k = step - self.base
        if k <= 0:
            return
        if k >= self.n:
            self.base, self.n = step, 0
            return
        self.data[:self.n - k] = self.data[k:self.n]
        self.n -= k
        self.base = step


class ChatTTSStream:
    """One segment's steps in, its PCM out. Calls must not overlap (one task)."""

    __slots__ = ("_batcher", "_busy", "_closed", "_joiner", "_planner", "_steps", "_vocoder")

    def __init__(self, vocoder: ChatTTSVocoder, batcher: DecodeBatcher[StepWindow]) -> None:
        self._vocoder = vocoder
        self._batcher = batcher
        self._planner = ChunkPlanner(vocoder.chunking)
        self._joiner = SeamJoiner(STEP_SAMPLES)
        dtype = np.float32 if vocoder.route == "decoder" else np.int64
        self._steps = _Steps(vocoder.width, dtype)
        self._busy = False
        self._closed = False

    @property
    def steps(self) -> int:
        """Steps pushed so far."""
        return self._planner.frames

    @property
    def closed(self) -> bool:
        return self._closed

    async def push(self, x: Any) -> list[PcmChunk]:
        """Add steps: hidden states float [T, width] (route "decoder") or codes
        int [T, 4] (route "dvae"); numpy or torch. Returns the audio now final."""
        arr = self._check(x)
        self._enter()
        try:
            self._steps.append(arr)
            return await self._run(self._planner.push(len(arr)))
        finally:
            self._busy = False

    async def finish(self) -> list[PcmChunk]:
        """End of segment: the rest of the audio (no lookahead left to wait for)."""
        self._enter()
        try:
            chunks = await self._run(self._planner.finish())
        finally:
            self._busy = False
        self.close()
        return chunks

    def close(self) -> None:
        """Drop the stream's state (cancel); a push in flight then returns nothing."""
        self._closed = True
        self._steps = _Steps(self._vocoder.width, self._steps.data.dtype.type)

    def _enter(self) -> None:
        if self._closed:
            raise RuntimeError("ChatTTS vocoder stream is closed")
        if self._busy:
            raise RuntimeError("overlapping calls on one ChatTTS vocoder stream")
        self._busy = True

    def _check(self, x: Any) -> npt.NDArray[Any]:
        if hasattr(x, "detach"):  # a torch tensor, maybe on the GPU: one copy to host
            import torch

            x = x.detach().to("cpu", torch.float32 if self._vocoder.route == "decoder"
                              else torch.int64).numpy()
        arr = np.asarray(x)
        v = self._vocoder
        if arr.ndim != 2 or arr.shape[1] != v.width:
            what = "hidden states" if v.route == "decoder" else "codes"
            raise ValueError(f"{what} must have shape (steps, {v.width}), not {arr.shape}")
        if v.route == "decoder":
            if arr.size and not np.issubdtype(arr.dtype, np.floating):
                raise ValueError(f"hidden states must be floats, not {arr.dtype}")
            arr = arr.astype(np.float32, copy=False)
            if not np.isfinite(arr).all():
                raise ValueError("hidden states contain NaN or infinity")
            return arr
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"codes must be integers, not {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= v.codebook_size):
            raise ValueError(f"codes must be in [0, {v.codebook_size}) (EOS is never pushed)")
        return arr.astype(np.int64, copy=False)

    async def _run(self, jobs: list[DecodeJob]) -> list[PcmChunk]:
        if not jobs:
            return []
        windows = [StepWindow(self._steps.window(j.start_frame, j.end_frame), j.start_frame)
                   for j in jobs]
        self._steps.drop_before(self._planner.first_needed_frame())
        try:
            audio = await self._batcher.decode(windows, urgent=jobs[0].index == 0)
        except BaseException:
            self.close()  # the schedule moved on without this audio: unusable
            raise
        if self._closed:
            return []
        for a in audio:
            if not np.isfinite(a).all():
                self.close()
                raise EngineFailed("the ChatTTS decoder produced NaN or infinite audio")
        rate = self._vocoder.sample_rate
        chunks = [PcmChunk(self._joiner.join(j, a), rate)
                  for j, a in zip(jobs, audio, strict=True)]
        return [c for c in chunks if len(c.samples)]
