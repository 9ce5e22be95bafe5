"""What the ChatTTS hand-off costs the host, with hidden states copied to the
host and with them kept in the engine's device store (``[chattts] hidden_store``).

    python -m rtserver.tools.measure.chattts_handoff [--rows 64 256 512] [--windows 1 15 64]

Two host costs the store removes, timed here on the CPU with the real widths
(hidden 768), no model and no GPU:

- **engine thread, per step** (under the GIL): the hand-over's turn at ``rows``
  decode rows, every row handed its steps in blocks of 4 (``stream_interval``):
  ``Handover.read_rows`` + ``flush``, gathering ``[rows, 768]`` float32 hidden
  states out of the pinned ring, against gathering their int64 store indices;
- **decode thread, per decoder call** (under the GIL): ``_pack`` of ``windows``
  windows of 73 steps (24 left context + 32 + 16 lookahead + 1) into the call's
  pinned batch, hidden states against store indices.

What the store adds instead runs on the device (one ``index_copy_`` a step, one
gather a call): the H200 measures those (``bench/gpu/run_chattts_store.sh``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np

HIDDEN = 768  # ChatTTS GPT hidden size (upstream config gpt.hidden_size)
VQ = 4
HOLD = 4  # steps a running request's hand-over holds (TorchEngineConfig.stream_interval)
RING = HOLD + 3  # the runner's pinned ring (engine: stream_interval + 3)
WINDOW_STEPS = 73  # 24 + 32 + 16 + 1 (chattts.decoder.config)


def _per_call_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):  # warm: allocations, caches
        fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e6 * (time.perf_counter() - t0) / repeats


def handover_us(rows: int, store: bool, steps: int = 400) -> float:
    """Microseconds a step of ``Handover.read_rows`` + ``flush`` at ``rows`` rows."""
    from rtserver.voices.chattts.engine.handover import Handover

    max_len = 1536
    ho = Handover(rows * 2, HOLD, eager_steps=0, width=max_len + 1 if store else 0)
    given = [ho.give(f"r{i}", keep=store) for i in range(rows)]
    hs = np.array([h for h, _ in given], dtype=np.int64)
    gs = np.array([g for _, g in given], dtype=np.int64)
    ho.steps[hs] = np.arange(rows) % HOLD  # staggered: a quarter of the rows hand over a step
    ho.held[hs] = np.arange(rows) % HOLD
    codes = np.zeros((RING, rows, VQ + 1), dtype=np.int32)
    hidden = None if store else np.random.default_rng(0).standard_normal(
        (RING, rows, HIDDEN)).astype(np.float32)
    flags = codes[0, :, VQ]
    turn = [0]

    def step() -> None:
        r = turn[0] % RING
        turn[0] += 1
        ho.read_rows(hs, gs, r, flags)
        ho.flush(codes, hidden)

    return _per_call_us(step, steps)


def pack_us(windows: int, store: bool, calls: int = 200) -> float:
    """Microseconds of one decoder call's ``_pack`` of ``windows`` windows."""
    import tempfile
    from pathlib import Path

    import torch

    from rtserver.tools.layouts.chattts_decoder import write_tiny_decoder_assets
    from rtserver.voices.chattts.decoder.checkpoint import load_audio_models
    from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, StepWindow

    with tempfile.TemporaryDirectory() as tmp:
        mel, vocos, dims = load_audio_models(write_tiny_decoder_assets(Path(tmp),
                                                                       gpt_hidden=HIDDEN))
    dec = ChatTTSWindowDecoder(mel, vocos, dims, "decoder")
    rng = np.random.default_rng(1)
    if store:
        dec.attach_store(torch.zeros((8, HIDDEN)), 7)
        ws = [StepWindow(rng.integers(0, 7, (WINDOW_STEPS, 1)), 0) for _ in range(windows)]
    else:
        ws = [StepWindow(rng.standard_normal((WINDOW_STEPS, HIDDEN)).astype(np.float32), 0)
              for _ in range(windows)]
    return _per_call_us(lambda: dec._pack(ws, WINDOW_STEPS), calls)


def report(rows: Sequence[int], windows: Sequence[int]) -> str:
    lines = ["| engine step at | host copy: read + flush us | store: read + flush us |",
             "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r} rows | {handover_us(r, False):.0f} | {handover_us(r, True):.0f} |")
    lines += ["", "| decoder call of | host copy: _pack us | store: _pack us |", "|---|---|---|"]
    for w in windows:
        lines.append(f"| {w} windows x {WINDOW_STEPS} steps | {pack_us(w, False):.0f} | "
                     f"{pack_us(w, True):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--windows", type=int, nargs="+", default=[1, 15, 64])
    a = p.parse_args(argv)
    print(report(a.rows, a.windows))


if __name__ == "__main__":
    main()
