"""The torch engine alone (no server, no decoder) on a ChatTTS folder.

For each level N, N requests of ``steps`` steps start together; per request:
time to the first step (prefill included) and the step rate after it (real
time needs 46.875 steps/s: 24 kHz / 512 samples per step). EOS is off, so
every request runs its steps. Per level, from the engine's counters: host
time per step (the engine thread outside its one wait), GPU time per step,
GPU busy (GPU time over wall time), rows and prefill positions per step, and
the host syncs the step loop made besides its one wait per step (CUDA's sync
debug mode, which flags every synchronizing call; expected 0).

    python -m rtserver.tools.bench.gpu_chattts_engine --ckpt CK --device cuda --levels 1,64,512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rtserver.engine.base import PromptEmbedding, SamplingSettings, TokenRequest
from rtserver.tools.bench.store import emit_json

STEPS_PER_S = 24000 / 512  # audio steps per second (upstream Vocos hop 256, 2 frames/step)
TEXT = "Hello there, this is a benchmark of how quickly the first audio arrives."


def parse_levels(text: str, steps: int) -> list[tuple[int, int]]:
    """``"1,64,512x256"`` -> [(1, steps), (64, steps), (512, 256)]: streams, steps each."""
    out = []
    for part in text.split(","):
        n, _, s = part.partition("x")
        out.append((int(n), int(s) if s else steps))
    return out


async def _levels(ckpt: str, device: str, slots: int, max_len: int,
                  levels: list[tuple[int, int]], want_hidden: bool = True,
                  profile: str = "", dtype_name: str = "", kernels: str = "",
                  attention: str = "auto", **engine_kw: Any) -> dict[str, Any]:
    import torch

    from rtserver.voices.chattts.assets import load_lm_assets
    from rtserver.voices.chattts.engine.counters import PHASES
    from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig
    from rtserver.voices.chattts.engine.model import ChatLM, resolve_attention
    from rtserver.voices.chattts.text import code_prompt

    assets = load_lm_assets(ckpt)
    cfg = assets.config
    dtype = getattr(torch, dtype_name) if dtype_name else (
        torch.bfloat16 if device.startswith("cuda") else torch.float32)
    attention = resolve_attention(attention, torch.device(device))  # "auto" as it ran

    def factory() -> ChatLM:
        return ChatLM(cfg, assets.gpt, assets.embed, slots=slots, max_len=max_len,
                      device=device, dtype=dtype, attention=attention)

    engine = TorchCodeEngine(factory, TorchEngineConfig(
        slots=slots, max_len=max_len, cuda_graphs=device.startswith("cuda"), ignore_eos=True,
        **engine_kw), eos_id=cfg.eos_id)
    if profile:  # the step loop under cProfile, stats written at close (Python 3.12's
        # cProfile sees every thread: the asyncio side shows too)
        import cProfile
        import pstats

        run = engine._run

        def profiled() -> None:
            prof = cProfile.Profile()
            prof.enable()
            try:
                run()
            finally:
                prof.disable()
                with open(profile, "w") as f:  # own time, then the loop's parts inclusive
                    stats = pstats.Stats(prof, stream=f)
                    stats.sort_stats("tottime").print_stats(40)
                    stats.sort_stats("cumulative").print_stats(40)
                prof.dump_stats(profile + ".prof")  # the whole profile, for pstats

        engine._run = profiled  # type: ignore[method-assign]
    t0 = time.monotonic()
    await engine.start()
    start_s = time.monotonic() - t0
    ids = tuple(assets.tokenizer.encode(code_prompt(TEXT)))
    vec = np.random.default_rng(0).standard_normal(cfg.hidden_size)
    vec = vec / np.linalg.norm(vec)
    emb = (PromptEmbedding(assets.tokenizer.spk_emb_id, tuple(float(v) for v in vec)),)
    c = engine.counters_
    out: dict[str, Any] = {"device": device, "dtype": str(dtype), "attention": attention,
                           "slots": slots, "max_len": max_len,
                           "prompt_positions": len(ids), "want_hidden": want_hidden,
                           "engine": {k: v for k, v in engine_kw.items()},
                           "start_s": round(start_s, 2), "graphs": engine.runner.graphs,
                           "levels": []}
    cuda = device.startswith("cuda")
    phases = [ph for ph, _ in PHASES]  # launch, read, post (StepCounters)
    try:
        for n, steps in levels:
            async def one(i: int, n: int = n, steps: int = steps) -> tuple[float, float, int]:
                req = TokenRequest(request_id=f"l{n}-{i}", prompt_token_ids=ids,
                                   max_tokens=steps,
                                   sampling=SamplingSettings(temperature=0.3, top_p=0.7,
                                                             top_k=20, repetition_penalty=1.05,
                                                             seed=i),
                                   want_hidden=want_hidden, embeddings=emb)
                t = time.monotonic()
                first = last = 0.0
                got = 0
                async for d in engine.generate(req):
                    now = time.monotonic() - t
                    if got == 0:
                        first = now
                    got += len(d.codes)
                    last = now
                engine.release_hidden(req.request_id)  # a store's rows (a no-op without)
                return first, last, got

            before = {k: getattr(c, k) for k in (
                "steps", "decode_steps", "rows", "host_s", "host_cpu_s", "gpu_s", "wait_s",
                "prefill_tokens", "prefill_padded", "moves", "syncs",
                *(f"{ph}{kind}_s" for ph in phases for kind in ("", "_cpu")))}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                t = time.monotonic()
                res = await asyncio.gather(*(one(i) for i in range(n)))
                wall = time.monotonic() - t
                await asyncio.sleep(0.05)  # the loop reads the last step back
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [str(w.message)[:120] for w in caught if "synchroniz" in str(w.message)
                     and "prototype" not in str(w.message)]
            d = {k: getattr(c, k) - v for k, v in before.items()}
            firsts = np.array([r[0] for r in res]) * 1000
            rates = np.array([(r[2] - 1) / max(r[1] - r[0], 1e-9) for r in res])
            st = max(d["steps"], 1)
            # the steady part: every stream decoding (no prefill in the step)
            out["levels"].append({
                "streams": n, "steps": steps, "wall_s": round(wall, 3),
                "steps_per_s_total": round(sum(r[2] for r in res) / wall, 1),
                "first_step_ms_p50": round(float(np.percentile(firsts, 50)), 2),
                "first_step_ms_p99": round(float(np.percentile(firsts, 99)), 2),
                "steps_per_s_per_stream_min": round(float(rates.min()), 1),
                "steps_per_s_per_stream_p50": round(float(np.percentile(rates, 50)), 1),
                "real_time_x_min": round(float(rates.min()) / STEPS_PER_S, 2),
                "real_time_x_p50": round(float(np.percentile(rates, 50)) / STEPS_PER_S, 2),
                "engine_steps": d["steps"],
                "host_ms_per_step": round(1000 * d["host_s"] / st, 3),
                "host_cpu_ms_per_step": round(1000 * d["host_cpu_s"] / st, 3),
                # where the host's time a step goes: wall / CPU ms of each phase
                "host_ms_by_phase": {ph: [round(1000 * d[f"{ph}_s"] / st, 3),
                                          round(1000 * d[f"{ph}_cpu_s"] / st, 3)]
                                     for ph in phases},
                "gpu_ms_per_step": round(1000 * d["gpu_s"] / st, 3),
                "wait_ms_per_step": round(1000 * d["wait_s"] / st, 3),
                "gpu_busy": round(d["gpu_s"] / wall, 3),
                "rows_per_decode_step": round(d["rows"] / max(d["decode_steps"], 1), 1),
                "prefill_tokens_per_step": round(d["prefill_tokens"] / st, 1),
                "prefill_padded_per_step": round(d["prefill_padded"] / st, 1),
                "moves": d["moves"], "host_syncs_per_step": round(d["syncs"] / st, 3),
                "other_syncs_flagged": len(syncs), "other_syncs_sample": syncs[:3],
            })
            print(json.dumps(out["levels"][-1]), flush=True)
        if kernels:
            out["kernels"] = await _kernel_table(engine, ids, emb, cuda)
    finally:
        await engine.close()
    return out


async def _kernel_table(engine: Any, ids: tuple[int, ...], emb: Any, cuda: bool) -> str:
    """One request of 48 steps alone under torch's profiler: the device kernels
    by total time (what one step at one row is made of), as a table."""
    from torch.profiler import ProfilerActivity, profile

    req = TokenRequest(request_id="kernels", prompt_token_ids=ids, max_tokens=48,
                       sampling=SamplingSettings(temperature=0.3, top_p=0.7, top_k=20,
                                                 repetition_penalty=1.05, seed=1),
                       want_hidden=True, embeddings=emb)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        async for _ in engine.generate(req):
            pass
        engine.release_hidden(req.request_id)
        await asyncio.sleep(0.05)  # the loop's last step back
    events = prof.key_averages()
    key = "device_time_total" if cuda else "cpu_time_total"
    try:
        table = events.table(sort_by=key, row_limit=40)
    except (AttributeError, KeyError, ValueError):
        table = events.table(sort_by="cuda_time_total" if cuda else key, row_limit=40)
    return (f"# one request, 48 steps, alone ({engine.runner.graphs} graphs captured; device "
            f"kernels from every thread, CPU ops from this one only)\n{table}")


def run_engine_levels(ckpt: str, *, device: str, slots: int, max_len: int, levels: list[int],
                      steps: int, want_hidden: bool = True, **engine_kw: Any) -> dict[str, Any]:
    return asyncio.run(_levels(ckpt, device, slots, max_len, [(n, steps) for n in levels],
                               want_hidden, **engine_kw))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--slots", type=int, default=512)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--levels", default="1,8,32,64,128,256,512",
                   help="streams per level; NxS: N streams of S steps")
    p.add_argument("--steps", type=int, default=64, help="steps per request (levels without x)")
    p.add_argument("--no-hidden", action="store_true", help="requests want no hidden states")
    p.add_argument("--prefill-tokens", type=int, default=0, help="0: the engine's default")
    p.add_argument("--hidden-store", action="store_true",
                   help="hidden states stay in the engine's device store (handed over as "
                   "indices) instead of a copy to the host each step")
    p.add_argument("--no-move-graphs", action="store_true",
                   help="a step's KV moves run eagerly (the A/B of their CUDA graphs)")
    p.add_argument("--decode-attention", default="auto", choices=("auto", "sdpa", "triton"),
                   help="a decode step's attention (chattts.decode_attention)")
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--dtype", default="", help="weights: bfloat16 or float32 (default: bf16 "
                   "on CUDA)")
    p.add_argument("--profile", default="", help="write cProfile stats of the run here (from "
                   "the step loop's start; on Python 3.12 every thread shows)")
    p.add_argument("--kernels", default="", help="after the levels, write the device kernels "
                   "of one request of 48 steps alone here (torch profiler)")
    p.add_argument("--gil-switch-ms", type=float, default=0.0,
                   help="sys.setswitchinterval for this process (0: Python's 5 ms)")
    a = p.parse_args()
    if a.gil_switch_ms > 0:
        sys.setswitchinterval(a.gil_switch_ms / 1000)
    kw: dict[str, Any] = {"prefill_tokens": a.prefill_tokens} if a.prefill_tokens else {}
    if a.hidden_store:
        kw["hidden_store"] = True
    if a.no_move_graphs:
        kw["move_graphs"] = False
    res = asyncio.run(_levels(a.ckpt, a.device, a.slots, a.max_len,
                              parse_levels(a.levels, a.steps), not a.no_hidden,
                              a.profile, a.dtype, a.kernels, a.decode_attention, **kw))
    res["gil_switch_ms"] = sys.getswitchinterval() * 1000
    if a.kernels:
        Path(a.kernels).write_text(res.pop("kernels"))
    emit_json(res, a.out)


if __name__ == "__main__":
    main()
