"""GPU self-check of ChatTTS's decode attention: the Triton kernel against SDPA.

    python -m rtserver.tools.selfcheck.chattts_attention [--device cuda] [--rows 1,64,256,512]
        [--positions 50:600] [--out FILE.json]

One layer's cache of the real shapes (12 heads of 64, ``--slots`` x ``--max-len``
positions, random values, bf16 on CUDA) and ``--rows`` rows at positions drawn
from ``--positions`` (a mix, as a batch of segments of different lengths is);
the step's length bucket is the engine's scheduler's (the next of 128, 256, 512,
1024 ... at or above the longest row, at most ``--max-len``). For each row count:
the largest difference between the two (expect bf16 rounding) and each one's
time a call (CUDA events, median of ``--repeats`` runs of ``--calls`` calls).
A step calls it once per layer (20).
On the CPU it runs the kernel under Triton's interpreter (``TRITON_INTERPRET=1``
before the start), for the tool's own test, with no timings worth reading.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def check(device: str, rows: list[int], lo: int, hi: int, *, slots: int, max_len: int,
          heads: int = 12, head_dim: int = 64, calls: int = 20, repeats: int = 5,
          seed: int = 0) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    from rtserver.voices.chattts.engine.attention import decode_attention
    from rtserver.voices.chattts.engine.engine import DEFAULT_LENGTH_BUCKETS
    from rtserver.voices.chattts.engine.scheduler import bucket

    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(seed)
    shape = (slots + 1, heads, max_len + 1, head_dim)
    kc = torch.randn(shape, generator=g).to(dev, dtype)
    vc = torch.randn(shape, generator=g).to(dev, dtype)
    out: list[dict[str, Any]] = []
    for b in rows:
        q = torch.randn(b, heads, 1, head_dim, generator=g).to(dev, dtype)
        pos = torch.randint(lo, hi + 1, (b,), generator=g).to(dev)
        # the step's length as the engine's scheduler picks it
        length = bucket(int(pos.max()) + 1, DEFAULT_LENGTH_BUCKETS, max_len)
        mask = (torch.arange(length, device=dev)[None, :] <= pos[:, None])[:, None, None]

        def dense(q: Any = q, mask: Any = mask, length: int = length, b: int = b) -> Any:
            return F.scaled_dot_product_attention(q, kc[:b, :, :length], vc[:b, :, :length],
                                                  attn_mask=mask)

        def own(q: Any = q, pos: Any = pos, length: int = length) -> Any:
            return decode_attention(q, kc, vc, pos, length)

        ref, got = dense(), own()
        err = float((got.float() - ref.float()).abs().max())
        out.append({"rows": b, "length_bucket": length,
                    "mean_position": round(float(pos.float().mean()), 1),
                    "max_abs_diff": err, "ref_abs_max": float(ref.float().abs().max()),
                    "sdpa_ms": _time(dense, dev, calls, repeats),
                    "triton_ms": _time(own, dev, calls, repeats)})
    return out


def _time(fn: Any, dev: Any, calls: int, repeats: int) -> float:
    """Median ms a call over ``repeats`` runs of ``calls`` (CUDA events on a GPU)."""
    import torch

    runs: list[float] = []
    for _ in range(repeats):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            runs.append(1000 * (time.perf_counter() - t0) / calls)
    return round(statistics.median(runs), 4)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", default="1,64,256,512")
    p.add_argument("--positions", default="50:600", help="LO:HI, each row's position")
    p.add_argument("--slots", type=int, default=512)
    p.add_argument("--max-len", type=int, default=1536)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    lo, _, hi = a.positions.partition(":")
    res = {"device": a.device, "slots": a.slots, "max_len": a.max_len,
           "levels": check(a.device, [int(r) for r in a.rows.split(",")], int(lo), int(hi),
                           slots=a.slots, max_len=a.max_len, calls=a.calls,
                           repeats=a.repeats)}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
