"""SNAC 24 kHz decoder: a batched, deterministic decode.

The checkpoint's layout, its loader and the swapped layers: ``snac_net``.

Decoding differs from ``SNAC.decode`` in three ways, none changing the maths
of one full decode except the noise source:

- Weight norm is folded into plain weights once (it is a reparametrization).
- Noise: every ``NoiseBlock`` adds ``randn(B, 1, T) * linear(x)``, fresh per call,
  so upstream output is random and two overlapping windows never agree. Here
  the noise is a fixed Gaussian sequence indexed by the *absolute* position in
  the stream (``noise="positional"``, period ``NOISE_PERIOD_LATENT`` latent
  frames): the decoder still gets the unit-variance noise it was trained with,
  the output is a pure function of the codes (deterministic, testable), and a
  chunk decoded with enough context equals the full decode. ``noise="off"``
  drops the noise term instead (changes the trained output slightly).
- Batches: windows of different lengths are right-padded to a common length
  and, before every layer that mixes time steps (convolutions with kernel > 1),
  each row's samples beyond its own length are zeroed. That is exactly the
  zero padding a convolution applies at a sequence end, so a padded row
  computes what the row alone computes: padding cannot reach kept samples.

Optional on CUDA: graphs captured per (batch bucket, frame bucket) shape and
replayed; with the masking above, bucket padding is exact too (on an H200 the
replayed and eager outputs were bit-identical). Precision on CUDA: cuDNN's
default TF32 convolutions put a decode about -51 dB (re RMS, random weights)
from the float32 CPU decode, and two window shapes that far from each other;
this module leaves that process-wide switch alone (vLLM shares the process).
Measured there too: float16 weights -44 dB for ~1.1-1.4x at 64+ windows,
bfloat16 -25 dB. ``dtype="bfloat16"`` or ``"float16"`` runs the decoder
(weights and activations; the quantizer's lookups stay float32) in that dtype,
eager and in graphs, and returns float32 audio. bfloat16 is never the default;
float16 is where ``snac_precision`` measures it within -40 dB at start. On
the CPU, real 24 kHz shape, random weights (max |error| re RMS): a bf16 full
decode is -24.8 dB from the float32 one (~-39 dB RMS error) and its exact
seams -26 dB (float32: below -120 dB), missing the -40 dB target (``python -m
rtserver.tools.measure.snac seams --shape 24khz --dtype bfloat16``); float16 is
-44.9 dB (-57.7 dB RMS, 12 frames), but its range (65504) is unproven on real
checkpoints' activations.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from rtserver.engine.capture_streams import capture_stream
from rtserver.engine.triton_usable import triton_usable
from rtserver.vocoder.config import SNAKE_CONVS
from rtserver.vocoder.graph_buckets import batch_buckets
from rtserver.voices.orpheus.snac_kernels import fuse
from rtserver.voices.orpheus.snac_net import (
    FRAME_CODES,
    BatchState,
    PositionalNoise,
    ShiftedDepthwise,
    check_frame_layout,
    decoder_support,
    fold_weight_norm,
    swap_depthwise,
)

FloatArray = npt.NDArray[np.float32]
NoiseMode = Literal["positional", "off"]
# Decoder dtypes that ship (the seam tests cover each).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                  "float16": torch.float16}

@dataclass(frozen=True, slots=True)
class CodeWindow:
    """Frames ``codes`` (n, 7) int, neutral order, starting at ``start_frame``."""

    codes: npt.NDArray[np.int64]
    start_frame: int

    @property
    def n_frames(self) -> int:
        return int(self.codes.shape[0])


class _Graph:
    """One captured shape. Its inputs are views of one device buffer
    (``packed``: codes, then lengths, then offsets), so a replay needs one
    host-to-device copy: on a GPU shared with vLLM's process, every
    synchronous copy waits for a time slice of its own."""

    __slots__ = ("codes", "graph", "lengths", "offsets", "out", "packed")

    def __init__(self, b: int, n: int, device: torch.device) -> None:
        cells = b * n * FRAME_CODES
        self.packed = torch.zeros(cells + 2 * b, dtype=torch.int64, device=device)
        self.codes = self.packed[:cells].view(b, n, FRAME_CODES)
        self.lengths = self.packed[cells:cells + b]
        self.offsets = self.packed[cells + b:]
        self.graph: Any = None
        self.out: torch.Tensor | None = None


class _Staging:
    """Pinned host buffers for graph inputs and outputs, grown on demand and
    reused by every call (one decode thread: calls never overlap)."""

    def __init__(self) -> None:
        self._in: torch.Tensor | None = None
        self._out: torch.Tensor | None = None

    def inputs(self, size: int) -> torch.Tensor:
        if self._in is None or self._in.numel() < size:
            self._in = torch.empty(size, dtype=torch.int64, pin_memory=True)
        return self._in[:size]

    def outputs(self, rows: int, cols: int) -> torch.Tensor:
        if self._out is None or self._out.numel() < rows * cols:
            self._out = torch.empty(rows * cols, dtype=torch.float32, pin_memory=True)
        return self._out[:rows * cols].view(rows, cols)


class _Lane:
    """A set of captured graphs with its own memory pool, pinned buffers and
    CUDA stream: graphs of two lanes may replay at the same time (two threads),
    graphs of one lane share their pool and must not."""

    def __init__(self, stream: Any = None) -> None:
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool: Any = None
        self.capture_stream: Any = None  # set with the pool (first capture)
        self.staging = _Staging()
        self.stream = stream  # None: the thread's current stream


class SnacDecoder:
    """Batched decoder of code windows -> float32 audio, one array per window.

    Not thread-safe: call ``decode`` from one thread (the batcher's). The one
    exception, on CUDA with graphs: after ``warm_up``, ``first_lane()`` returns a
    decoder for short windows (first chunks) that replays its own graphs on its
    own stream and may run on a second thread while ``decode`` runs.
    """

    def __init__(self, model: Any, *, device: str = "cpu", noise: NoiseMode = "positional",
                 noise_seed: int = 0, cuda_graphs: bool = False, graph_max_batch: int = 64,
                 graph_frame_step: int = 4, graph_max_frames: int = 24,
                 graph_max_cells: int = 512, graph_batch_buckets: Sequence[int] = (),
                 dtype: str = "float32", compile: bool = False, compile_backend: Any = "inductor",
                 snake_conv: str = "auto",
                 main_stream: bool = False) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        check_frame_layout({"vq_strides": model.vq_strides,
                            "attn_window_size": model.attn_window_size})
        self.device = torch.device(device)
        self.sample_rate = int(model.sampling_rate)
        self.hop = int(model.hop_length)
        self.latent_per_frame = int(model.vq_strides[0])  # 4
        self.samples_per_frame = self.hop * self.latent_per_frame  # 2048
        self.codebook_size = int(model.codebook_size)
        self._state = BatchState()
        fold_weight_norm(model)
        self.quantizer: nn.Module = model.quantizer
        self.decoder: nn.Module = model.decoder
        self._install_noise(noise, noise_seed, list(model.decoder_rates))
        if compile:
            swap_depthwise(self.decoder)
        premasked = self._fuse(snake_conv, compile)
        for m in self.decoder.modules():
            if (isinstance(m, nn.Conv1d | nn.ConvTranspose1d | ShiftedDepthwise)
                    and m.kernel_size[0] > 1 and m not in premasked):
                m.register_forward_pre_hook(self._mask_hook)
        self.quantizer.to(self.device).eval()
        self.dtype = DTYPES[dtype]
        self.decoder.to(self.device, self.dtype).eval()
        self.support = decoder_support(self.decoder, self.hop)
        # main_stream (CUDA): the main lane's calls on a stream of their own,
        # not the decode thread's current one (the legacy default stream, which
        # serializes with default-stream work of the same process, such as an
        # in-process vLLM's); off: as before
        self._main = _Lane(torch.cuda.Stream(device=self.device)
                           if main_stream and self.device.type == "cuda" else None)
        self._first: _Lane | None = None  # created by warm_up (CUDA graphs only)
        self._use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graph_max_batch = graph_max_batch
        self._batch_buckets = batch_buckets(graph_batch_buckets, graph_max_batch)
        # frames a graph takes: 1 and 2 (first chunks), then multiples of the step
        self._frame_buckets = sorted({1, 2, *range(graph_frame_step, graph_max_frames + 1,
                                                   graph_frame_step), graph_max_frames})
        self._graph_max_frames = graph_max_frames
        self._graph_max_cells = graph_max_cells
        # the most windows of up to n frames one graph takes (0: none), per n: read
        # at every decode call
        self._rows_for = [max((b for b in self._batch_buckets
                               if self._bucket(b, n) is not None), default=0)
                          for n in range(graph_max_frames + 1)]
        # compile: the decode as fused kernels (torch.compile, shapes dynamic so
        # one compile serves every window size; graphs are captured over it)
        self.compiled = compile
        self._run: Any = self._levels_to_audio
        if compile:
            self._run = torch.compile(self._levels_to_audio, dynamic=True,
                                      backend=compile_backend)

    # --- construction helpers -------------------------------------------------

    def _install_noise(self, noise: NoiseMode, seed: int, rates: list[int]) -> None:
        from snac.layers import DecoderBlock, NoiseBlock

        gen = torch.Generator().manual_seed(seed)
        up = 1
        for block in (m for m in self.decoder.modules() if isinstance(m, DecoderBlock)):
            up *= rates.pop(0)
            seq = block.block
            for i, layer in enumerate(seq):
                if isinstance(layer, NoiseBlock):
                    seq[i] = (nn.Identity() if noise == "off"
                              else PositionalNoise(layer.linear, up, self._state, gen))

    def _fuse(self, snake_conv: str, compile: bool) -> set[nn.Module]:
        """Resolve ``snake_conv`` into ``self.snake_conv``; with ``"triton"``, Snake
        and depthwise convolutions as fused kernels (``snac_kernels``). Returns
        the convolutions whose mask those apply."""
        if snake_conv not in SNAKE_CONVS:
            raise ValueError(f"snake_conv must be one of {', '.join(SNAKE_CONVS)}, "
                             f"not {snake_conv!r}")
        if snake_conv == "auto":
            snake_conv = "triton" if not compile and triton_usable(self.device) else "torch"
        self.snake_conv = snake_conv
        if snake_conv == "torch":
            return set()
        if compile:
            raise ValueError("snake_conv 'triton' and compile exclude each other (compile "
                             "fuses the same work its own way)")
        if self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("snake_conv 'triton' needs a CUDA device")
        return fuse(self.decoder, self._state)

    def _mask_hook(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> Any:
        st = self._state
        lengths = st.lengths
        if lengths is None:
            return None
        x = args[0]
        scale = x.shape[-1] // st.t_latent
        keep = st.masks.get(scale)
        if keep is None or keep.dtype != x.dtype:
            keep = st.masks[scale] = (
                torch.arange(x.shape[-1], device=x.device).unsqueeze(0)
                < (lengths * scale).unsqueeze(1)).unsqueeze(1).to(x.dtype)
        return (x * keep,)

    # --- decoding --------------------------------------------------------------

    def decode(self, windows: Sequence[CodeWindow]) -> list[FloatArray]:
        """Decode each window; window i gives ``len(codes_i) * samples_per_frame`` samples."""
        if not windows:
            return []
        sizes = [int(w.codes.shape[0]) for w in windows]
        if min(sizes) < 1:
            raise ValueError("empty code window")
        n_max = max(sizes)
        b = len(windows)
        lane_stream = (torch.cuda.stream(self._main.stream) if self._main.stream is not None
                       else contextlib.nullcontext())
        with torch.inference_mode(), lane_stream:
            rows = self._graph_rows(n_max) if self._use_graphs else 0
            if rows:
                # a call too big for one graph runs as several replays, never eager
                # (under load eager launches wait on the GIL: H100, 256 Orpheus
                # streams, 73% of the decode thread's samples were in eager calls
                # of 17-23 windows, bench/results/h100-2026-12-05-s15)
                parts: list[FloatArray] = []
                for lo in range(0, b, rows):
                    part = windows[lo:lo + rows]
                    graph = self._graph_for(self._main, len(part), max(sizes[lo:lo + rows]))
                    assert graph is not None  # rows and n_max fit one, so does part
                    parts += self._replay(self._main, graph, part)
                return parts
            # eager: one host-to-device copy of codes, lengths and offsets
            cells = b * n_max * FRAME_CODES
            packed = np.empty(cells + 2 * b, dtype=np.int64)
            self._pack(windows, packed, b, n_max)
            dev = torch.from_numpy(packed).to(self.device)
            lengths = None if min(sizes) == n_max else dev[cells:cells + b]
            out = self._forward(dev[:cells].view(b, n_max, FRAME_CODES), lengths,
                                dev[cells + b:])
            audio = out.cpu().numpy()
        f = self.samples_per_frame
        return [np.ascontiguousarray(audio[i, :sizes[i] * f]) for i in range(b)]

    def _pack(self, windows: Sequence[CodeWindow], out: npt.NDArray[np.int64], rows: int,
              frames: int) -> None:
        """Write ``windows`` into ``out`` laid out as ``_Graph.packed`` for a
        (rows, frames) shape: codes zero-padded, then each row's length and
        offset in latent steps (0 for rows no window uses)."""
        lpf = self.latent_per_frame
        cells = rows * frames * FRAME_CODES
        out.fill(0)
        grid = out[:cells].reshape(rows, frames, FRAME_CODES)
        for i, w in enumerate(windows):
            n = int(w.codes.shape[0])
            grid[i, :n] = w.codes
            out[cells + i] = n * lpf
            out[cells + rows + i] = w.start_frame * lpf

    def _forward(self, codes: torch.Tensor, lengths: torch.Tensor | None,
                 offsets: torch.Tensor) -> torch.Tensor:
        b, n, _ = codes.shape
        levels = [codes[:, :, 0], codes[:, :, 1:3].reshape(b, 2 * n),
                  codes[:, :, 3:7].reshape(b, 4 * n)]
        st = self._state
        st.lengths, st.offsets, st.t_latent = lengths, offsets, n * self.latent_per_frame
        try:
            return self._run(levels)
        finally:
            st.lengths, st.offsets = None, None
            st.masks.clear()

    def _levels_to_audio(self, levels: list[torch.Tensor]) -> torch.Tensor:
        """The three code levels -> (B, samples) float32 (in a graph too: its
        output buffer is float32). ``_run`` is this, or it compiled."""
        z = self.quantizer.from_codes(levels)  # type: ignore[operator]
        y: torch.Tensor = self.decoder(z.to(self.dtype))
        return y[:, 0, :].float()

    # --- CUDA graphs (guarded: only with cuda_graphs=True on a CUDA device) ----

    def graph_buckets(self) -> list[tuple[int, int]]:
        """Every (batch, frames) shape a graph is captured for.

        Graphs pay where a call is launch-bound: on an H200, idle loop, a 1 x 4-frame
        decode takes ~4-7 ms eager and ~1.3 ms replayed, 8 x 4 frames ~6.7 vs ~2.9
        ms, while from ~8 x 21 frames on the two are equal (compute-bound) and the
        bucket padding only costs. With a busy event loop holding the GIL, eager
        launches slow down and graphs also win at mid sizes (64 streams: 17% less
        decode time with graphs for every bucket). Hence batch x frames <=
        ``graph_max_cells`` (512 with max_batch 64: 50 graphs for powers of two, ~4 s to
        capture at start; 116 for ``graph_batch_buckets``' default counts); a bigger call
        of windows a graph's frames cover replays several (``decode``).
        """
        return [(b, n) for b in self._batch_buckets for n in self._frame_buckets
                if b * n <= self._graph_max_cells]

    def warm_up(self, max_frames: int = 1024, first_lane_frames: int = 0) -> int:
        """On CUDA: one eager decode of ``max_frames`` frames in all (the most one
        call takes, so the caching allocator holds that memory before traffic
        needs it) and, with graphs, every bucket captured now (else each on first
        use); with ``first_lane_frames`` > 0 also the first lane's graphs (every
        batch bucket x frame buckets up to that many frames). Returns the graphs held."""
        if self.device.type != "cuda":
            return 0
        n = self._graph_max_frames
        rows = max(1, max_frames // n)
        codes = torch.zeros((rows, n, FRAME_CODES), dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            self._forward(codes, None, torch.zeros(rows, dtype=torch.int64, device=self.device))
            torch.cuda.synchronize(self.device)
            if self._use_graphs:
                for b, n in self.graph_buckets():
                    self._graph_for(self._main, b, n)
                if first_lane_frames > 0 and self._first is None:
                    # high priority: its kernels go ahead of the main lane's
                    lane = _Lane(torch.cuda.Stream(device=self.device, priority=-1))
                    for b, n in self.graph_buckets():
                        if n <= first_lane_frames:
                            self._graph_for(lane, b, n)
                    torch.cuda.synchronize(self.device)
                    self._first = lane
        return len(self._main.graphs) + (len(self._first.graphs) if self._first else 0)

    def first_lane(self) -> FirstLaneDecoder | None:
        """The second lane's decoder (see the class docstring), once ``warm_up``
        captured its graphs; None on the CPU or without graphs."""
        return FirstLaneDecoder(self, self._first) if self._first is not None else None

    def _lane_decode(self, lane: _Lane, windows: Sequence[CodeWindow]) -> list[FloatArray]:
        """Decode on ``lane`` with captured graphs only (no capture, no eager
        forward: both touch state the main lane uses)."""
        b, n_max = len(windows), max(int(w.codes.shape[0]) for w in windows)
        graph = self._lookup(lane, b, n_max)
        if graph is None:
            raise ValueError(f"no first-lane graph for {b} windows of {n_max} frames")
        with torch.inference_mode(), torch.cuda.stream(lane.stream):
            return self._replay(lane, graph, windows)

    def _bucket(self, b: int, n: int) -> tuple[int, int] | None:
        if b > self._graph_max_batch or n > self._graph_max_frames:
            return None
        bb = next(x for x in self._batch_buckets if x >= b)
        nb = next(f for f in self._frame_buckets if f >= n)
        return None if bb * nb > self._graph_max_cells else (bb, nb)

    def _graph_rows(self, n: int) -> int:
        """The most windows of up to ``n`` frames one graph takes (0: none does)."""
        return self._rows_for[n] if n < len(self._rows_for) else 0

    def _lookup(self, lane: _Lane, b: int, n: int) -> _Graph | None:
        key = self._bucket(b, n)
        return lane.graphs.get(key) if key is not None else None

    def _graph_for(self, lane: _Lane, b: int, n: int) -> _Graph | None:
        key = self._bucket(b, n)
        if key is None:
            return None
        g = lane.graphs.get(key)
        if g is None:
            g = lane.graphs[key] = self._capture(lane, *key)
        return g

    def _capture(self, lane: _Lane, b: int, n: int) -> _Graph:
        dev = self.device
        g = _Graph(b, n, dev)
        g.lengths.fill_(n * self.latent_per_frame)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(g.codes, g.lengths, g.offsets)
        torch.cuda.current_stream(dev).wait_stream(side)
        if lane.pool is None:
            lane.pool = torch.cuda.graph_pool_handle()
            # the lane's own capture stream: its own cuBLAS workspace
            # (rtserver.engine.capture_streams)
            lane.capture_stream = capture_stream(dev)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=lane.pool, stream=lane.capture_stream,
                              capture_error_mode="thread_local"):
            g.out = self._forward(g.codes, g.lengths, g.offsets)
        return g

    def _replay(self, lane: _Lane, g: _Graph, windows: Sequence[CodeWindow]
                ) -> list[FloatArray]:
        """Windows packed straight into pinned memory, one host-to-device copy,
        the replay, one device-to-host copy of the frames used, one
        synchronize. Returns a fresh array per window."""
        bb, nb, _ = g.codes.shape
        host = lane.staging.inputs(g.packed.numel())
        self._pack(windows, host.numpy(), bb, nb)
        g.packed.copy_(host, non_blocking=True)
        g.graph.replay()
        assert g.out is not None
        sizes = [int(w.codes.shape[0]) for w in windows]
        f = self.samples_per_frame
        out = lane.staging.outputs(len(windows), max(sizes) * f)
        out.copy_(g.out[:len(windows), :max(sizes) * f], non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        audio = out.numpy()
        return [audio[i, :n * f].copy() for i, n in enumerate(sizes)]


class FirstLaneDecoder:
    """``WindowDecoder`` on a ``SnacDecoder``'s first lane: short windows only
    (``fits``), safe on a second thread beside the main lane's ``decode``."""

    def __init__(self, decoder: SnacDecoder, lane: _Lane) -> None:
        self._decoder = decoder
        self._lane = lane

    def fits(self, windows: int, frames: int) -> bool:
        """Whether ``windows`` windows of at most ``frames`` frames have a graph here."""
        return self._decoder._lookup(self._lane, windows, frames) is not None

    def decode(self, windows: Sequence[CodeWindow]) -> list[FloatArray]:
        return self._decoder._lane_decode(self._lane, windows) if windows else []
