"""The streaming SNAC vocoder: one ``SnacVocoder`` per process, one stream per segment.

    vocoder = SnacVocoder.load(snac_dir)            # or load(None, dummy=True)
    await vocoder.start()
    stream = vocoder.open_stream()
    for frames in ...:                               # int (n, 7), neutral order
        for chunk in await stream.push(frames):     # PcmChunk, 24 kHz float32
            ...
    for chunk in await stream.finish():             # the tail
        ...
    await vocoder.close()

Concatenated, a stream's chunks are ``frames * 2048`` samples: the full decode
of its codes, except near the first seam (see ``chunking.ChunkConfig``).
Decodes of all streams are batched (``batcher.DecodeBatcher``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from rtserver.vocoder.batched import BatchedVocoder
from rtserver.vocoder.batcher import DecodeBatcher
from rtserver.vocoder.chunking import ChunkConfig
from rtserver.vocoder.config import VocoderConfig
from rtserver.vocoder.planned_stream import PlannedStream
from rtserver.voices.orpheus.snac_model import CodeWindow, NoiseMode, SnacDecoder
from rtserver.voices.orpheus.snac_net import FRAME_CODES, SNAC24_CONFIG, build_snac, load_snac_dir
from rtserver.voices.orpheus.snac_precision import half_error_db, resolve_dtype


class SnacVocoder(BatchedVocoder[CodeWindow]):
    """The SNAC decoder behind the shared batcher; ``start`` before opening streams."""

    def __init__(self, decoder: SnacDecoder, config: VocoderConfig | None = None,
                 device: str = "cpu") -> None:
        self.config = config or VocoderConfig()
        self.decoder = decoder
        self.sample_rate: int = decoder.sample_rate
        self.samples_per_frame: int = decoder.samples_per_frame
        self.codebook_size: int = decoder.codebook_size
        self.held_starts = 0  # later segments that started on a held plan (``open_stream``)
        self._frame_s = self.samples_per_frame / self.sample_rate
        super().__init__(DecodeBatcher(decoder, self.config.batcher_config(device)),
                         self.config.chunk_config(self.samples_per_frame),
                         self.config.first_chunk_config(self.samples_per_frame))

    @classmethod
    def load(cls, snac_dir: Path | None, *, dummy: bool = False, device: str = "cpu",
             config: VocoderConfig | None = None) -> SnacVocoder:
        """From an upstream-layout folder, or the real 24 kHz shape with random
        weights (``dummy=True``: speed is real, sound is noise)."""
        config = config or VocoderConfig()
        model: Any
        if dummy:
            model = build_snac(SNAC24_CONFIG, seed=config.dummy_seed)
        elif snac_dir is None:
            raise ValueError("a SNAC folder is needed unless dummy=True")
        else:
            model = load_snac_dir(snac_dir)
        noise = cast(NoiseMode, config.noise)
        dtype, _ = resolve_dtype(config.dtype, device, lambda: half_error_db(
            model, device=device, noise=noise, noise_seed=config.noise_seed,
            snake_conv=config.snake_conv))
        decoder = SnacDecoder(model, device=device, noise=noise,
                              noise_seed=config.noise_seed, cuda_graphs=config.cuda_graphs,
                              graph_max_batch=config.max_batch,
                              graph_max_frames=config.graph_max_frames,
                              graph_max_cells=config.graph_max_cells,
                              graph_batch_buckets=config.graph_batch_buckets,
                              dtype=dtype,
                              compile=config.compile, main_stream=config.main_stream,
                              snake_conv=config.snake_conv)
        return cls(decoder, config, device)

    def _warm_up(self) -> Any:
        self.decoder.decode([CodeWindow(np.zeros((1, FRAME_CODES), dtype=np.int64), 0)])
        first = self.config.first_frames if self.config.first_lane else 0
        self.decoder.warm_up(self.config.max_batch_frames, first_lane_frames=first)
        return self.decoder.first_lane()

    def open_stream(self, *, first: bool = False, held_s: float | None = None) -> SnacStream:
        """A segment's stream: a context's first segment on ``first_chunking``;
        a later one whose listener holds ``held_s`` of audio starts with the
        chunk that leaves time for (``VocoderConfig.held_start``)."""
        chunking = self.first_chunking if first else self.config.segment_chunk_config(
            self.chunking, self._frame_s, held_s)
        if not first and chunking is not self.chunking:
            self.held_starts += 1
        return SnacStream(self, self._batcher, chunking, held_s=held_s)


class SnacStream(PlannedStream[CodeWindow]):
    """One segment's SNAC frames (int, shape (n, 7), neutral order) in, its PCM
    out. Calls must not overlap (one task)."""

    __slots__ = ("_vocoder",)

    def __init__(self, vocoder: SnacVocoder, batcher: DecodeBatcher[CodeWindow],
                 chunking: ChunkConfig | None = None, *, held_s: float | None = None) -> None:
        super().__init__(batcher, chunking or vocoder.chunking,
                         samples_per_frame=vocoder.samples_per_frame,
                         sample_rate=vocoder.sample_rate, width=FRAME_CODES, dtype=np.int64,
                         held_s=held_s)
        self._vocoder = vocoder

    def _check(self, frames: npt.ArrayLike) -> npt.NDArray[np.int64]:
        arr = np.asarray(frames)
        if arr.ndim != 2 or arr.shape[1] != FRAME_CODES:
            raise ValueError(f"frames must have shape (n, {FRAME_CODES}), not {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"frames must be integers, not {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= self._vocoder.codebook_size):
            raise ValueError(f"codes must be in [0, {self._vocoder.codebook_size})")
        return arr.astype(np.int64, copy=False)

    def _window(self, frames: npt.NDArray[Any], start_frame: int) -> CodeWindow:
        return CodeWindow(frames, start_frame)

