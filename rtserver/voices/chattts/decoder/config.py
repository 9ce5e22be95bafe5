"""Settings of ChatTTS's streaming decode: light (no torch).

Chunking reuses ``rtserver.vocoder.chunking`` with one frame = one GPT step =
512 samples. The numbers come from ``python -m rtserver.tools.measure.chattts_decoder``
on the real shapes with random weights (blocks' residual scale 0.5 unless said):

- Receptive field, exact (from the layers, ``dims.exact_support``): one step
  changes up to 26624 samples = 52 steps = 1.11 s either side of its own 512
  (upstream's "about +-52 steps, +-1.1 s"); confirmed by perturbation: some
  change (above -120 dB re RMS) up to 50.5-51 steps away.
- Effective receptive field (``measure reach``: one step's hidden state
  replaced, worst of 3 positions, dB re RMS): above -40 dB within 10.8 steps
  (5533 samples), -60 dB 14.2, -80 dB 17.0. It grows with the residual scale:
  at 1.0: 13.2 / 17.0 / 20.2 steps; at 2.0: 15.3 / 19.4 / 22.8; at 0.1: 6.5 /
  8.9 / 11.1. The DVAE route (codes) is alike: 10.2 / 13.5 / 17.1 at 0.5.
- A window cut short (``measure edges``) errs more than one step's change
  (all missing steps add up): ``EDGE_ERROR_DB`` (0.5) and ``EDGE_ERROR_DB_1``.

Trained weights: unmeasured here (no weights on this machine). Trained conv
stacks usually use far less than their theoretical field but more than at
init, hence the table at residual scale 1.0 and 2.0 too, and the choice below
of a lookahead that stays under -50 dB at 1.0. With real weights, re-measure:
``python -m rtserver.tools.measure.chattts_decoder edges --root MODEL_DIR``.

Choices: left context 24 steps (12288 samples), where a cut window's edge
error is -102 dB at residual scale 1.0 (float rounding) and below -101 dB at
0.5: far under the lookahead's own error below. The exact support (52 steps)
costs 101-step windows for 32 emitted; 24 steps cost 73 (1.4x less decode,
``bench/results/h200-chattts-decode-2026-12-04``). Lookahead 16 steps (8192
samples): later seams -74 dB (0.5), -54 dB (1.0); each step of lookahead delays every chunk, and the
listener's buffer, by one step of generation time. First chunk: after 16
steps, lookahead 8 steps (4096): 3840 samples (160 ms) of audio; its seam is
the stream's one approximate seam: the edge error at 8 steps is -25 dB (0.5),
-17 dB (1.0) re RMS; chunked vs full on the real shapes (``measure seams``):
-29.1 dB (0.5), -17.5 dB (1.0), later seams <= -74.8 / -56.5 dB. Options:
12 steps with lookahead 6 (2816 samples, -14/-8 dB); 20 with 12 (3840
samples, -47/-33 dB).
"""

from __future__ import annotations

from dataclasses import dataclass

from rtserver.vocoder.chunking import ChunkConfig
from rtserver.vocoder.graph_buckets import BATCH_COUNTS

STEP_SAMPLES = 512  # one GPT step: 2 mel frames x hop 256 at 24 kHz (see dims)
# Exact one-sided support of the real Decoder + Vocos (``dims.exact_support``).
CHATTTS_EXACT_SUPPORT = 26624

# Error of a window cut short at distance d samples inside it, worst of left
# and right edges over 3 cuts and 256-sample spans, dB re RMS; real shapes,
# random weights, residual scale 0.5 (``measure edges --shape real``) and 1.0
# (``--layer-scale 1.0``). At 26624 (the exact support) the error is 0.
EDGE_ERROR_DB: dict[int, float] = {
    0: 16.2, 1024: 4.1, 2048: -2.8, 3072: -13.8, 4096: -25.0, 5120: -34.6, 6144: -47.2,
    7168: -59.0, 8192: -74.0, 9216: -87.3, 10240: -101.1,  # then float rounding
}
EDGE_ERROR_DB_1: dict[int, float] = {
    0: 15.7, 1024: 4.0, 2048: -1.1, 3072: -7.6, 4096: -16.9, 5120: -23.8, 6144: -32.7,
    7168: -44.7, 8192: -54.0, 9216: -64.7, 10240: -77.5, 11264: -89.6, 12288: -102.4,
}


# Deep chunks' size: 63 steps (1.34 s) make a window of 24 + 63 + 16 + 1 = 104
# steps, a graph bucket, for 63 emitted, where 32 take 73 steps in the 80 bucket.
# Decoder time per emitted step on the real shapes (random weights, CPU): -19 to
# -40 % (bench/results/cpu-chattts-deep-chunks-2026-12-05).
DEEP_CHUNK_STEPS = 63


@dataclass(frozen=True, slots=True)
class ChatTTSDecodeConfig:
    """Route, chunking (``ChunkConfig`` fields, frame = one step), batching, decoder."""

    route: str = "decoder"  # "decoder" (GPT hidden states) | "dvae" (codes)
    first_frames: int = 16  # steps before the first decode (see the module docstring)
    second_frames: int = 8  # then chunks of 8, 16, 32, 32 ... steps
    growth: float = 2.0
    max_chunk_frames: int = 32  # 0.68 s of audio per decode at most
    # ... or this many once the listener holds that much (``ChunkConfig.
    # deep_chunk_frames``; 0: never, the default until measured on a GPU;
    # ``DEEP_CHUNK_STEPS`` is the size to turn on)
    deep_chunk_frames: int = 0
    context_samples: int = 12288  # 24 steps: edge error <= -101 dB (EDGE_ERROR_DB*)
    first_lookahead_samples: int = 4096  # 8 steps: first seam -25 dB (0.5), -17 dB (1.0)
    lookahead_samples: int = 8192  # 16 steps: later seams -74 dB (0.5), -54 dB (1.0)
    crossfade_samples: int = 256  # 10.7 ms raised cosine
    max_batch: int = 64  # windows per decoder call
    max_batch_frames: int = 8192  # steps per call, padding included
    max_pad_fraction: float = -1.0  # < 0: 0.25 on CPU, 4.0 on CUDA (launch-bound)
    # A later chunk's window may wait this long for others to share its call
    # (``BatcherConfig.hold_s``); < 0: 40 ms on CUDA (~15 windows a call at 256
    # streams), 0 on the CPU.
    hold_s: float = -1.0
    cuda_graphs: bool = True  # CUDA only
    # CUDA only: the convs and MLPs under bf16 autocast (ISTFT fp32). Against
    # float32 on the real shapes (H200, ``selfcheck.chattts_decoder``): audio
    # error RMS -40.7 dB re the signal's RMS, max -22 dB; 2.2x the throughput.
    bf16: bool = False
    # steps buckets: first windows 16, steady windows 73 (24 + 32 + 16 + 1)
    graph_frame_buckets: tuple[int, ...] = (16, 24, 32, 48, 64, 80, 104, 128)
    graph_max_cells: int = 8192  # batch x steps of the largest graph
    # windows a graph takes (up to max_batch; ``rtserver.vocoder.graph_buckets``): a
    # call runs on the smallest that holds it, its other rows computed for nothing
    graph_batch_buckets: tuple[int, ...] = BATCH_COUNTS
    # The hidden states pushed are finite, vouched by their producer (the torch
    # engine fails a request whose step was not, on the device): streams skip the
    # host's check of every value (``build_runtime`` sets it from the engine's
    # ``hands_over_finite``). Shapes and dtypes are checked either way.
    finite_input: bool = False
    # CUDA graphs only: first chunks decode on a second set of graphs, stream and
    # thread (the first lane), beside a long call in flight, up to this shape.
    first_lane: bool = True
    first_lane_batch: int = 8
    first_lane_steps: int = 32
    dummy_seed: int = 0  # random weights (benchmarks): seed
    dummy_layer_scale: float = 0.5  # random weights: blocks' residual scale

    def __post_init__(self) -> None:
        if self.route not in ("decoder", "dvae"):
            raise ValueError(f"route must be 'decoder' or 'dvae', not {self.route!r}")
        self.chunk_config()  # validates the chunking fields

    def chunk_config(self) -> ChunkConfig:
        return ChunkConfig(samples_per_frame=STEP_SAMPLES, first_frames=self.first_frames,
                           growth=self.growth, max_chunk_frames=self.max_chunk_frames,
                           second_frames=self.second_frames,
                           context_samples=self.context_samples,
                           first_lookahead_samples=self.first_lookahead_samples,
                           lookahead_samples=self.lookahead_samples,
                           crossfade_samples=self.crossfade_samples,
                           deep_chunk_frames=self.deep_chunk_frames)
