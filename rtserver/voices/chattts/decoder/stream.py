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

With the torch engine's hidden-state store attached (``attach_store``, before
``start``) a stream takes store indices (int [T] or [T, 1]) instead of hidden
states: the decoder gathers its windows on the device.

Concatenated, a stream's chunks are ``steps * 512`` samples: the full decode of
its steps, except near seams cut inside the decoder's reach (the first one;
see ``config``). Decodes of all streams are batched (``batcher.DecodeBatcher``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from rtserver.errors import EngineFailed
from rtserver.vocoder.batched import BatchedVocoder
from rtserver.vocoder.batcher import DecodeBatcher, device_batcher_config
from rtserver.vocoder.planned_stream import PlannedStream
from rtserver.voices.chattts.decoder.checkpoint import Route, load_audio_models, random_audio_models
from rtserver.voices.chattts.decoder.config import ChatTTSDecodeConfig
from rtserver.voices.chattts.decoder.dims import REAL_DIMS, STEP_SAMPLES
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, StepWindow


class ChatTTSVocoder(BatchedVocoder[StepWindow]):
    """The window decoder behind the shared batcher; ``start`` before opening streams."""

    def __init__(self, decoder: ChatTTSWindowDecoder, config: ChatTTSDecodeConfig | None = None,
                 *, clock: Callable[[], float] = time.perf_counter) -> None:
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
        c = self.config
        super().__init__(DecodeBatcher(decoder, device_batcher_config(
            decoder.device.type == "cuda", max_batch=c.max_batch,
            max_batch_frames=c.max_batch_frames, max_pad_fraction=c.max_pad_fraction,
            hold_s=c.hold_s), clock=clock), c.chunk_config())

    @classmethod
    def load(cls, root: Path | None, *, route: str | None = None, dummy: bool = False,
             device: str = "cpu", config: ChatTTSDecodeConfig | None = None,
             clock: Callable[[], float] = time.perf_counter) -> ChatTTSVocoder:
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
            graph_max_cells=config.graph_max_cells,
            graph_batch_buckets=config.graph_batch_buckets)
        return cls(decoder, config, clock=clock)

    def attach_store(self, store: Any, zero_index: int) -> None:
        """Streams take indices into ``store`` (the engine's device tensor of hidden
        states) from now on; before ``start``."""
        self.decoder.attach_store(store, zero_index)

    def _warm_up(self) -> Any:
        self.decoder.warm_up()
        if not self.config.first_lane:
            return None
        return self.decoder.first_lane(self.config.first_lane_batch,
                                       self.config.first_lane_steps)

    def open_stream(self, *, first: bool = False, held_s: float | None = None) -> ChatTTSStream:
        """A segment's stream; one chunk plan for every segment (ChatTTS's r
        stays low enough that its chunks never outgrow the audio before them).
        ``held_s``: the audio its listener holds before it (deep chunks)."""
        return ChatTTSStream(self, self._batcher, held_s=held_s)


class ChatTTSStream(PlannedStream[StepWindow]):
    """One segment's steps in, its PCM out: hidden states float [T, width] (route
    "decoder") or codes int [T, 4] (route "dvae"), numpy or torch. Calls must not
    overlap (one task)."""

    __slots__ = ("_finite", "_vocoder")
    _what = "ChatTTS vocoder stream"

    def __init__(self, vocoder: ChatTTSVocoder, batcher: DecodeBatcher[StepWindow], *,
                 held_s: float | None = None) -> None:
        dec = vocoder.decoder
        super().__init__(batcher, vocoder.chunking, samples_per_frame=STEP_SAMPLES,
                         sample_rate=vocoder.sample_rate, width=dec.input_width,
                         dtype=dec.input_dtype, held_s=held_s)
        self._vocoder = vocoder
        self._finite = vocoder.config.finite_input  # skip the host's finiteness check

    @property
    def steps(self) -> int:
        """Steps pushed so far."""
        return self.frames

    def _check(self, x: Any) -> npt.NDArray[Any]:
        rows = self._vocoder.decoder.store_rows
        if rows:
            return self._check_indices(np.asarray(x), rows)
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
            if arr.size and arr.dtype.kind != "f":  # np.issubdtype's cost, every push
                raise ValueError(f"hidden states must be floats, not {arr.dtype}")
            arr = arr.astype(np.float32, copy=False)
            # the worker's event loop checks every push of every stream: 6 % of the
            # time it held the GIL at 512 streams on an H100 (py-spy --gil,
            # bench/results/h100-2026-12-06-s23) for what the engine checked already
            if not self._finite and not np.isfinite(arr).all():
                raise ValueError("hidden states contain NaN or infinity")
            return arr
        if arr.size and arr.dtype.kind not in "iu":
            raise ValueError(f"codes must be integers, not {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= v.codebook_size):
            raise ValueError(f"codes must be in [0, {v.codebook_size}) (EOS is never pushed)")
        return arr.astype(np.int64, copy=False)

    @staticmethod
    def _check_indices(arr: npt.NDArray[Any], rows: int) -> npt.NDArray[Any]:
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2 or arr.shape[1] != 1:
            raise ValueError(f"store indices must have shape (steps,) or (steps, 1), "
                             f"not {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            raise ValueError(f"store indices must be integers, not {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= rows):
            raise ValueError(f"store indices must be in [0, {rows})")
        return arr.astype(np.int64, copy=False)

    def _window(self, frames: npt.NDArray[Any], start_frame: int) -> StepWindow:
        return StepWindow(frames, start_frame)

    def _check_audio(self, audio: list[Any]) -> None:
        for a in audio:
            if not np.isfinite(a).all():
                raise EngineFailed("the ChatTTS decoder produced NaN or infinite audio")

