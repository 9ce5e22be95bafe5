"""Batched window decoding: many streams' step windows -> 24 kHz audio in one call.

A window is a run of GPT steps of one stream (hidden states [n, 768] on the
Decoder route, codes [n, 4] on the DVAE route) starting at ``start_frame``;
its audio is ``n * 512`` samples, exactly what decoding those steps alone gives
(the modules' masks make batch padding exact). ``ChatTTSWindowDecoder.decode``
packs the windows of a call into one zero-padded batch, one host->device copy,
one forward, one device->host copy.

With a hidden-state store (``attach_store``: the torch engine's device tensor of
every step's hidden state) a window carries store indices ([n, 1] int64)
instead of hidden states, and the call gathers its batch there on the device:
no hidden state crosses to the host and back.

On CUDA with ``cuda_graphs``: one graph per (batch bucket, steps bucket),
captured in ``warm_up``, sharing one memory pool, replayed for calls that fit
(rows past the call's windows have length 0); other shapes run eager. All
graph work is on the decode thread (one call at a time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from rtserver.engine.capture_streams import capture_stream
from rtserver.vocoder.graph_buckets import batch_buckets
from rtserver.voices.chattts.decoder.dims import SAMPLE_RATE, STEP_SAMPLES, ChatTTSAudioDims
from rtserver.voices.chattts.decoder.modules import MelDecoder, Vocos

FloatArray = npt.NDArray[np.float32]
Route = Literal["decoder", "dvae"]


@dataclass(frozen=True, slots=True)
class StepWindow:
    """Steps ``data`` ([n, width]: float32 hidden states or int64 codes; with a
    store, [n, 1] int64 store indices) of one stream, the first being step
    ``start_frame`` of its segment."""

    data: npt.NDArray[Any]
    start_frame: int

    @property
    def n_frames(self) -> int:
        return int(self.data.shape[0])


class _Graph:
    """Static input/output buffers of one bucket and the captured graph (or, on
    the CPU for tests, the same forward run on those buffers)."""

    __slots__ = ("graph", "lengths", "out", "x")

    def __init__(self, x: torch.Tensor, lengths: torch.Tensor) -> None:
        self.x, self.lengths = x, lengths
        self.out: torch.Tensor | None = None
        self.graph: Any = None

    def replay(self, forward: Any) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:  # emulated (CPU tests): the forward the graph would hold
            assert self.out is not None
            self.out.copy_(forward(self.x, self.lengths))


class ChatTTSWindowDecoder:
    """Mel decoder + Vocos on one device. Not thread-safe: one decode thread.

    A *lane* (``first_lane()``, CUDA graphs only) is a second decoder on the
    same modules with its own small graphs, memory pool, pinned buffers and
    high-priority CUDA stream, for a second thread: first chunks decode there
    beside a long call in flight instead of waiting for it.
    """

    sample_rate = SAMPLE_RATE
    samples_per_frame = STEP_SAMPLES

    def __init__(self, mel: MelDecoder, vocos: Vocos, dims: ChatTTSAudioDims, route: Route, *,
                 device: str = "cpu", cuda_graphs: bool = False, bf16: bool = False,
                 graph_max_batch: int = 64, graph_frame_buckets: Sequence[int] = (),
                 graph_max_cells: int = 16384, graph_batch_buckets: Sequence[int] = (),
                 stream: Any = None, lane: bool = False,
                 emulate_graphs: bool = False) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda": the current
            self.device = torch.device("cuda", torch.cuda.current_device())  # (the engine's)
        self._stream = stream  # CUDA stream for all this decoder's work (None: current)
        self._lane = lane  # graphs only: shapes without one are refused (see ``fits``)
        self.route: Route = route
        self.dims = dims
        self.mel = mel.to(self.device).eval()
        self.vocos = vocos.to(self.device).eval()
        self.width = dims.gpt_hidden if route == "decoder" else dims.vq.n_codes
        self.dtype = np.float32 if route == "decoder" else np.int64
        self._bf16 = bf16 and self.device.type == "cuda"
        # emulate_graphs: tests only, the graph bookkeeping (buckets, static
        # buffers, padding rows) on the CPU with the forward run eagerly
        self._emulate = emulate_graphs and self.device.type == "cpu"
        self._use_graphs = (cuda_graphs and self.device.type == "cuda") or self._emulate
        self._graph_max_batch = graph_max_batch
        # windows a graph takes; a call runs on the smallest that holds it
        self._batch_buckets = batch_buckets(graph_batch_buckets, graph_max_batch)
        self._frame_buckets = sorted(set(graph_frame_buckets))
        self._graph_max_cells = graph_max_cells
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._x_buf: torch.Tensor | None = None  # every graph's input (_static_input)
        self._computed = 0  # steps this decoder's calls computed (graph padding included)
        self._lanes: list[ChatTTSWindowDecoder] = []
        self._pool: Any = None
        self._capture_stream: Any = None
        self._pinned: torch.Tensor | None = None
        self._pinned_out: torch.Tensor | None = None
        self._store: torch.Tensor | None = None  # [rows, width] on the device
        self._zero = 0  # a store index whose row is zeros

    # --- the hidden-state store ---------------------------------------------------

    def attach_store(self, store: torch.Tensor, zero_index: int) -> None:
        """Read windows as indices into ``store`` (route "decoder", before
        ``warm_up``); ``store[zero_index]`` must stay zeros (padding)."""
        if self.route != "decoder" or store.shape[-1] != self.width:
            raise ValueError(f"a hidden-state store of width {self.width} needs the decoder "
                             f"route, not {self.route!r} with {tuple(store.shape)}")
        if store.device != self.device:
            raise ValueError(f"the store is on {store.device}, the decoder on {self.device}")
        self._store, self._zero = store, zero_index

    @property
    def store_rows(self) -> int:
        """Rows of the attached store (0: none)."""
        return 0 if self._store is None else int(self._store.shape[0])

    @property
    def input_width(self) -> int:
        """Columns of a window's data: the model's, or 1 (a store index)."""
        return 1 if self._store is not None else self.width

    @property
    def input_dtype(self) -> type[np.generic]:
        return np.int64 if self._store is not None else self.dtype

    @property
    def _pad(self) -> int:
        """What pads a window's data: zeros, or the store's zero row."""
        return self._zero if self._store is not None else 0

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        """A packed batch on the device: the hidden states its indices name (with a
        store), else ``x`` itself."""
        x = x.to(self.device, non_blocking=True)
        if self._store is None:
            return x
        return self._store[x.squeeze(-1)]

    # --- eager ----------------------------------------------------------------

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``x`` (B, T, width) on the device, ``lengths`` (B,) steps -> (B, T*512)."""
        t = x.shape[1]
        mask = (torch.arange(2 * t, device=x.device)[None, :] < 2 * lengths[:, None])
        mask = mask.to(torch.float32).unsqueeze(1)
        inp = x.transpose(1, 2) if self.route == "decoder" else x
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self._bf16,
                            cache_enabled=False):  # no weight-cast cache across graph replays
            mel = self.mel(inp, mask)
            feats = self.vocos.backbone(mel, mask)
        return self.vocos.head(feats.float(), mask)

    def decode(self, windows: Sequence[StepWindow]) -> list[FloatArray]:
        """Audio of each window (``n * 512`` float32 samples), in order."""
        if not windows:
            return []
        b, n = len(windows), max(w.n_frames for w in windows)
        if n == 0:
            return [np.zeros(0, dtype=np.float32) for _ in windows]
        with torch.inference_mode(), contextlib.ExitStack() as ctx:
            if self._stream is not None:
                ctx.enter_context(torch.cuda.stream(self._stream))
            graph = self._graph_for(b, n) if self._use_graphs else None
            if graph is not None:
                self._computed += graph.x.shape[0] * graph.x.shape[1]
                return self._replay(graph, windows)
            if self._lane:
                raise ValueError(f"no first-lane graph for {b} windows of {n} steps")
            self._computed += b * n
            x, lengths = self._pack(windows, n)
            audio = self.forward(self._inputs(x), lengths.to(self.device, non_blocking=True))
            return self._unpack(audio, windows)

    def _pack(self, windows: Sequence[StepWindow], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(len(windows), n, input width) in a reused (pinned on CUDA) host buffer,
        each row's data then zeros (with a store: the zero row's index); and the
        lengths."""
        torch_dtype = torch.float32 if self.input_dtype is np.float32 else torch.int64
        b, width = len(windows), self.input_width
        size = b * n * width
        buf = self._pinned
        if buf is None or buf.numel() < size or buf.dtype != torch_dtype:
            buf = torch.zeros(max(size, 1 << 16), dtype=torch_dtype,
                              pin_memory=self.device.type == "cuda")
            self._pinned = buf
        x = buf[:size].view(b, n, width)
        xa = x.numpy()
        pad = self._pad
        for i, w in enumerate(windows):
            xa[i, :w.n_frames] = w.data
            xa[i, w.n_frames:] = pad
        lengths = torch.tensor([w.n_frames for w in windows], dtype=torch.int64)
        return x, lengths

    def _unpack(self, audio: torch.Tensor, windows: Sequence[StepWindow]) -> list[FloatArray]:
        b, cols = len(windows), audio.shape[1]
        if self.device.type == "cuda":
            out = self._pinned_out
            if out is None or out.numel() < b * cols:
                out = torch.empty(max(b * cols, 1 << 20), dtype=torch.float32, pin_memory=True)
                self._pinned_out = out
            host = out[:b * cols].view(b, cols)
            host.copy_(audio[:b], non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
        else:
            host = audio[:b]
        arr = host.numpy()
        return [np.array(arr[i, :w.n_frames * STEP_SAMPLES], dtype=np.float32)
                for i, w in enumerate(windows)]

    # --- CUDA graphs (guarded: cuda_graphs=True on a CUDA device only) ----------

    def graph_buckets(self) -> list[tuple[int, int]]:
        """Every (batch, steps) shape a graph is captured for: batches from
        ``graph_batch_buckets`` (else powers of two) up to ``graph_max_batch``,
        steps from ``graph_frame_buckets``, batch x steps <= ``graph_max_cells``
        (bounds capture time and memory)."""
        return [(b, n) for b in self._batch_buckets for n in self._frame_buckets
                if b * n <= self._graph_max_cells]

    def _bucket(self, b: int, n: int) -> tuple[int, int] | None:
        if b > self._graph_max_batch:
            return None
        bb = next(x for x in self._batch_buckets if x >= b)
        for nb in self._frame_buckets:
            if nb >= n:
                return (bb, nb) if bb * nb <= self._graph_max_cells else None
        return None

    def _graph_for(self, b: int, n: int) -> _Graph | None:
        """The captured graph for this call's bucket; None (eager) for shapes past
        the buckets or before ``warm_up`` captured them (no capture mid-traffic)."""
        key = self._bucket(b, n)
        return None if key is None else self._graphs.get(key)

    def _static_input(self, b: int, n: int) -> torch.Tensor:
        """Graph (b, n)'s input: a view of one buffer every graph of this decoder
        shares (its calls never overlap: one thread, a sync each), sized for the
        largest bucket, instead of a tensor each (136 graphs of [b, n, 768] floats:
        ~590 MB)."""
        if self._x_buf is None:  # graphs are captured for graph_buckets() only
            cells = max(bb * nn for bb, nn in self.graph_buckets())
            self._x_buf = torch.zeros(cells * self.width, device=self.device,
                                      dtype=torch.float32 if self.route == "decoder"
                                      else torch.int64)
        return self._x_buf[:b * n * self.width].view(b, n, self.width)

    def _capture(self, b: int, n: int) -> _Graph:
        x = self._static_input(b, n)
        lengths = torch.full((b,), n, dtype=torch.int64, device=self.device)
        g = _Graph(x, lengths)
        if self._emulate:
            g.out = self.forward(x, lengths)
            return g
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            # this decoder's own capture stream: its GEMMs' cuBLAS workspace is
            # then not the other lane's (see rtserver.engine.capture_streams)
            self._capture_stream = capture_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up runs: allocator, cuFFT plans, autotuning
                self.forward(x, lengths)
        torch.cuda.current_stream(self.device).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        # thread_local: the LM engine's thread may launch work while this captures
        with torch.cuda.graph(g.graph, pool=self._pool, stream=self._capture_stream,
                              capture_error_mode="thread_local"):
            g.out = self.forward(x, lengths)
        return g

    def _replay(self, g: _Graph, windows: Sequence[StepWindow]) -> list[FloatArray]:
        b, n = len(windows), max(w.n_frames for w in windows)
        x, lengths = self._pack(windows, n)
        g.x.zero_()  # rows and steps past the windows: zeros, length 0
        g.x[:b, :n].copy_(self._inputs(x), non_blocking=True)
        g.lengths.zero_()
        g.lengths[:b].copy_(lengths)
        g.replay(self.forward)
        assert g.out is not None
        return self._unpack(g.out, windows)

    def fits(self, windows: int, frames: int) -> bool:
        """A captured graph takes ``windows`` windows of up to ``frames`` steps."""
        key = self._bucket(windows, frames)
        return key is not None and key in self._graphs

    def first_lane(self, max_batch: int = 8, max_steps: int = 32) -> ChatTTSWindowDecoder | None:
        """A lane decoder (see the class docstring) with graphs for up to
        ``max_batch`` windows of up to ``max_steps`` steps, captured now; None
        on the CPU or without graphs."""
        if not self._use_graphs:
            return None
        buckets = [n for n in self._frame_buckets if n <= max_steps] or [max_steps]
        lane = ChatTTSWindowDecoder(
            self.mel, self.vocos, self.dims, self.route, device=str(self.device),
            cuda_graphs=True, bf16=self._bf16, graph_max_batch=max_batch,
            graph_frame_buckets=buckets, graph_max_cells=max_batch * max(buckets),
            graph_batch_buckets=self._batch_buckets,
            stream=None if self._emulate else torch.cuda.Stream(self.device, priority=-1),
            lane=True, emulate_graphs=self._emulate)
        if self._store is not None:
            lane.attach_store(self._store, self._zero)
        lane.warm_up()
        self._lanes.append(lane)
        return lane

    @property
    def computed_steps(self) -> int:
        """Steps its calls and its lanes' computed, padding included: a window's
        up to its call's longest, and the call's up to its graph's shape."""
        return self._computed + sum(lane.computed_steps for lane in self._lanes)

    def warm_up(self) -> int:
        """One eager decode; with graphs, capture every bucket now. Returns graphs held."""
        if not self._lane:
            self.decode([StepWindow(np.full((2, self.input_width), self._pad,
                                            dtype=self.input_dtype), 0)])
        if self._use_graphs:
            with torch.inference_mode():
                for key in self.graph_buckets():
                    if key not in self._graphs:
                        self._graphs[key] = self._capture(*key)
        self._computed = 0  # the counter is traffic's
        return len(self._graphs)
