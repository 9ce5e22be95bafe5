"""The vocoder's settings: a light module (no torch), so the server's one
Config can hold it without importing the decoder."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rtserver.vocoder.chunking import SNAC24_EXACT_SUPPORT, ChunkConfig, held_start
from rtserver.vocoder.graph_buckets import BATCH_COUNTS

if TYPE_CHECKING:
    from rtserver.vocoder.batcher import BatcherConfig

# How a SNAC decoder runs Snake activations and depthwise convolutions
# (``VocoderConfig.snake_conv``, ``voices.orpheus.snac_model.SnacDecoder``).
SNAKE_CONVS = ("auto", "torch", "triton")
# The decoder's dtypes (``VocoderConfig.dtype``; "auto": ``voices.orpheus.snac_precision``).
VOCODER_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class VocoderConfig:
    """Chunking (see ``chunking.ChunkConfig``, same defaults), batching, decoder."""

    first_frames: int = 1
    growth: float = 2.0
    max_chunk_frames: int = 16
    # A context's first segment's chunks stop growing at this many frames
    # (0: ``max_chunk_frames``). A chunk comes out once all its frames are
    # generated, so at a generation speed r above 0.5 chunks that keep
    # doubling outgrow the audio before them and the listener's first hint
    # must cover them: at r 0.85, 1,233 ms from the text to playback with 16,
    # 653 with 6; the decoder computes 1.88 frames per frame of a 24-frame
    # first segment with 6 against 1.67 (context and lookahead per window)
    # (``python -m rtserver.tools.measure.chunk_plans``). Later segments keep
    # ``max_chunk_frames``: by then the listener has audio queued.
    first_max_chunk_frames: int = 6
    # ... and grow by this factor (0: ``growth``). By the server's hint model
    # (``measure.chunk_plans --max-chunk-frames 6 --growth 1.5``, then 2) 1.5
    # gives a first hint of 72 instead of 258 ms at r 0.6 for the same decoder
    # frames; measured on one H100 at 128 Orpheus streams (r 0.86-0.89, where
    # the model expects no gain) 1.5 against 2: first heard p50/p99 525/1,022
    # against 552/1,057 ms, 40 of 255 contexts underran against 17 of 252
    # (bench/results/h100-2026-12-06-s18). 1.25 keeps the first hint short to r 0.8
    # (``chunk_plans --first-segment``); at 192 streams (r ~0.7) one run gave first
    # heard p50/p99 266/454 against 426-481/543-606 ms, another ran far slower and
    # underran (bench/results/h100-2026-12-07-s28). Off until runs agree.
    first_growth: float = 0.0
    context_samples: int = SNAC24_EXACT_SUPPORT
    first_lookahead_samples: int = 1024
    lookahead_samples: int = SNAC24_EXACT_SUPPORT
    # A context's first segment's chunks after its first decode with this
    # lookahead (0: ``lookahead_samples``). A chunk comes out once the frames
    # of its lookahead are generated too; 3,584 samples instead of the exact
    # 4,757 let chunk 1 of a first segment carry 235 instead of 186 ms for the
    # same 4 frames, so by the server's hint model (``measure.chunk_plans``)
    # a listener starts 277 instead of 499 ms after the text at r 0.65 (256
    # against 461 at r 0.6), never later at any r, for the same decoder work.
    # Its price: a window cut 3,584 samples past its last emitted sample is
    # -42.2 dB off the full decode there (``chunking.BOUNDARY_ERROR_DB``); after
    # the crossfade the first segment's seams past its first (approximate by
    # design, -12.4 dB) were -46.6 dB re RMS at worst on the real 24 kHz shape
    # with random weights, against -111 dB exact (``python -m
    # rtserver.tools.measure.snac seams --frames 24``, row ``first-segment``),
    # inside issue 24's -40 dB. Later segments stay exact.
    first_segment_lookahead_samples: int = 3584
    crossfade_samples: int = 256
    # A later segment whose listener holds audio from the segments before it
    # (``open_stream(held_s=)``) starts with the chunk that audio leaves time for
    # (``chunking.held_start``): its first decode waits for up to
    # ``max_chunk_frames`` frames, as many as real-time generation makes in
    # ``held_s`` less ``held_start_margin_s``, with the exact lookahead. The plan
    # otherwise restarts every segment at 1 frame with the short lookahead (its
    # approximate first seam, -12 dB re RMS before the crossfade) and grows from
    # there: with 1.7 s held a 24-frame segment decodes 1.21 frames a frame in 2
    # windows instead of 1.67 in 5, a 60-frame one 1.25 in 4 instead of 1.43 in 7
    # (``python -m rtserver.tools.measure.chunk_plans --held-s 1.7``). The margin:
    # the segment's first token (TTFA p50 at 256 Orpheus streams on an H100: ~100
    # ms, bench/results/h100-2026-12-07-s27), the batcher's hold (40 ms), a decode,
    # the hand-off and the listener's jitter (40 ms). On one H100 at 256 Orpheus
    # streams 89 and 114 of ~490 contexts underran with it, 205 and 211 without
    # (interleaved runs; bench/results/h100-2026-12-07-s28). False: every segment
    # restarts.
    held_start: bool = True
    held_start_margin_s: float = 0.3
    max_batch: int = 64  # windows per decoder call
    max_batch_frames: int = 512  # frames per call, padding included (see batcher)
    max_pad_fraction: float = -1.0  # < 0: 0.25 on CPU, 4.0 on CUDA (launch-bound)
    # A later chunk may wait this long for others to share its call (see
    # ``batcher.BatcherConfig.hold_s``); < 0: 40 ms on CUDA, 0 on the CPU, as
    # ChatTTS's decoder (there it cut TTFA p99 at 256 streams 269 -> 180 ms,
    # ``bench/results/h200-chattts-worker-2026-12-04-run2``). SNAC ran with it in
    # ``bench/results/h200-orpheus-worker-2026-12-04``, not yet against 0.
    hold_s: float = -1.0
    # The order of the later chunks queued for a call: "arrival" or "deadline"
    # (``batcher.BatcherConfig.order``: why arrival stays the default).
    queue_order: str = "arrival"
    noise: str = "positional"  # "positional" | "off" (see snac_model)
    noise_seed: int = 0
    cuda_graphs: bool = True  # CUDA only: capture graphs for common shapes
    # CUDA graphs only: first chunks decode on a second set of graphs, stream and
    # thread, beside the main calls, so a first chunk never waits for one in flight.
    first_lane: bool = True
    graph_max_frames: int = 24  # longest window (frames) a graph is captured for
    graph_max_cells: int = 512  # largest batch x frames a graph is captured for
    # Window counts a graph is captured for (up to max_batch; ``graph_buckets``): a
    # call replays the smallest that holds it (or, past the largest that fits
    # graph_max_cells, that one and the rest). 116 graphs with the defaults instead of
    # 50 for powers of two (one shared memory pool a lane). Empty: powers of two.
    graph_batch_buckets: tuple[int, ...] = BATCH_COUNTS
    dummy_seed: int = 0  # --dummy-weights: seed of the random weights
    # The decoder's dtype, eager and in graphs: "float32", "bfloat16", "float16"
    # (their seam and full-decode error: snac_model) or "auto": float16 on CUDA
    # when this checkpoint's float16 decode is within -40 dB of its float32 one
    # at start, else float32 (voices.orpheus.snac_precision). On one H100 at 256
    # Orpheus streams float16 took 0.60 instead of 0.77-0.80 s of decode a second,
    # and 0 of ~375 contexts underran at 192 against 9 and 25 with float32
    # (bench/results/h100-2026-12-07-s27).
    dtype: str = "auto"
    # The decode through torch.compile (fused pointwise work, depthwise
    # convolutions as fused shifted sums; graphs captured over it): a start-up
    # compile for less GPU time per window. Off: on an H100 the compiled SNAC's
    # warm-up and graphs took 3.7 minutes (bench/results/h100-2026-12-05-s17).
    compile: bool = False
    # Snake activations and depthwise convolutions (one of SNAKE_CONVS): "torch"
    # (its layers), "triton" (fused kernels, CUDA; ``voices.orpheus.snac_kernels``)
    # or "auto" (the kernels where ``engine.triton_usable``: CUDA sm_80+ with
    # Triton, not with compile; the layers elsewhere). On an H100, SNAC alone, the
    # kernels' float32 decode equals the layers' bit for bit and takes 48 against
    # 79 ms for 64 windows of 22 frames (bench/results/h100-2026-12-06-s24); through
    # the server vLLM made 16.8-17.6k tokens/s at 256 streams on an H100, 9.2-10.2k
    # before (h100-2026-12-07-s26).
    snake_conv: str = "auto"
    # CUDA: the batched calls on a stream of their own (the first lane has its
    # own already); for a vLLM engine in the same process, whose default-stream
    # kernels would otherwise serialize with them. Off until measured on a GPU.
    main_stream: bool = False

    def __post_init__(self) -> None:
        from rtserver.vocoder.batcher import QUEUE_ORDERS  # (as batcher_config does)

        if self.queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order must be one of {', '.join(QUEUE_ORDERS)}, not "
                             f"{self.queue_order!r}")
        if self.noise not in ("positional", "off"):
            raise ValueError(f"noise must be 'positional' or 'off', not {self.noise!r}")
        if self.snake_conv not in SNAKE_CONVS:
            raise ValueError(f"snake_conv must be one of {', '.join(SNAKE_CONVS)}, not "
                             f"{self.snake_conv!r}")
        if self.snake_conv == "triton" and self.compile:
            raise ValueError("snake_conv 'triton' and compile exclude each other")
        if self.dtype not in VOCODER_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(VOCODER_DTYPES)}, not "
                             f"{self.dtype!r}")
        if any(b < 1 for b in self.graph_batch_buckets):
            raise ValueError(f"graph_batch_buckets must be >= 1, not {self.graph_batch_buckets}")
        if self.first_max_chunk_frames < 0:
            raise ValueError("first_max_chunk_frames must be >= 0 (0: max_chunk_frames)")
        if self.first_growth != 0 and not self.first_growth >= 1:
            raise ValueError("first_growth must be >= 1 (0: growth)")
        if self.held_start_margin_s < 0:
            raise ValueError("held_start_margin_s must be >= 0")
        if self.first_segment_lookahead_samples < 0:
            raise ValueError("first_segment_lookahead_samples must be >= 0 "
                             "(0: lookahead_samples)")
        self.first_chunk_config(2048)  # validates the chunking fields (both plans)

    def chunk_config(self, samples_per_frame: int) -> ChunkConfig:
        return ChunkConfig(samples_per_frame=samples_per_frame, first_frames=self.first_frames,
                           growth=self.growth, max_chunk_frames=self.max_chunk_frames,
                           context_samples=self.context_samples,
                           first_lookahead_samples=self.first_lookahead_samples,
                           lookahead_samples=self.lookahead_samples,
                           crossfade_samples=self.crossfade_samples)

    def segment_chunk_config(self, later: ChunkConfig, frame_s: float,
                             held_s: float | None) -> ChunkConfig:
        """The plan of a later segment whose listener holds ``held_s`` of audio
        from the segments before it (``held_start``; None: unknown), from
        ``later`` (this config's ``chunk_config``): ``later`` itself unless held."""
        if not self.held_start or held_s is None:
            return later
        return held_start(later, held_s - self.held_start_margin_s, frame_s)

    def first_chunk_config(self, samples_per_frame: int) -> ChunkConfig:
        """``chunk_config`` for a context's first segment (``first_max_chunk_frames``,
        ``first_growth``, ``first_segment_lookahead_samples``)."""
        changes: dict[str, Any] = {}
        if self.first_growth > 0:
            changes["growth"] = self.first_growth
        if self.first_segment_lookahead_samples > 0:
            changes["lookahead_samples"] = self.first_segment_lookahead_samples
        if self.first_max_chunk_frames > 0:
            changes["max_chunk_frames"] = min(
                self.max_chunk_frames, max(self.first_frames, self.first_max_chunk_frames))
        return dataclasses.replace(self.chunk_config(samples_per_frame), **changes)

    def batcher_config(self, device: str) -> BatcherConfig:
        from rtserver.vocoder.batcher import device_batcher_config

        return device_batcher_config(device.startswith("cuda"), max_batch=self.max_batch,
                                     max_batch_frames=self.max_batch_frames,
                                     max_pad_fraction=self.max_pad_fraction, hold_s=self.hold_s,
                                     order=self.queue_order)
