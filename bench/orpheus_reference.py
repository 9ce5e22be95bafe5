"""Hook: measure the *reference* Orpheus streaming code on the GPU host.

This runs Canopy Labs' own streaming path, ``orpheus_tts.OrpheusModel.
generate_speech`` (PyPI package ``orpheus-speech``, which pulls ``vllm`` and
``snac``), unmodified, on the same GPU and weights as rtserver's Orpheus
voice, and writes results in the same schema as ``python -m bench``
(``system = "orpheus-reference"``), so ``bench.report`` puts them side by
side. It does not run here (no GPU, no vLLM): another step runs it on the
GPU host; nothing in this module produces a figure without running the
reference.

What is adapted, and only this:

- The reference loads SNAC at import with ``SNAC.from_pretrained(
  "hubertsiuzdak/snac_24khz")``; no hub is reachable, so ``--snac-dir``
  redirects that one call to a local folder in SNAC's layout (config.json +
  pytorch_model.bin). ``--make-random-snac DIR`` writes one with random
  weights of the published 24 kHz shapes.
- vLLM engine arguments pass through ``--engine-arg key=JSON`` (the
  reference forwards ``**engine_kwargs`` to ``AsyncEngineArgs``), e.g.
  ``--engine-arg load_format='"dummy"'`` for random weights of the real
  shapes. With random weights the model emits arbitrary tokens, which the
  reference decoder drops; pass the same audio-token constraint rtserver's
  Orpheus engine uses for its dummy-weight runs (a vLLM logits processor,
  ``--engine-arg logits_processors='["module:Class"]'``) so both sides emit
  audio tokens at the same per-token cost, and say so in the report.

Measured per request (the reference takes the whole text at once, so both
TTFA figures start when ``generate_speech`` is called): time to the first
audio chunk, chunk arrival times through the simulated listener (a chunk is
2048 samples at 24 kHz, 85.3 ms, as the reference's decoder slices it),
audio seconds, errors. Concurrency: N threads each calling the reference
back to back (its API is a blocking generator with a thread per request).

Usage on the GPU host::

    python -m bench.orpheus_reference --model-dir M --snac-dir S \\
        --engine-arg load_format='"dummy"' --concurrency 1,16,64 --duration 30 \\
        --out bench/results/gpu-orpheus-reference-DATE
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import inspect
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bench import report
from bench.corpus import select
from bench.listener import ListenerConfig
from bench.machine import describe, versions
from bench.measure import TurnRecord, analyze

SNAC_HUB_ID = "hubertsiuzdak/snac_24khz"
REFERENCE_RATE = 24000
CHUNK_SAMPLES = 2048  # the reference's decoder keeps audio_hat[:, :, 2048:4096]
CHUNK_MS = CHUNK_SAMPLES * 1000 / REFERENCE_RATE
# Published config.json of hubertsiuzdak/snac_24khz (SNAC 1.x).
SNAC_24KHZ_CONFIG = {
    "sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024, "decoder_rates": [8, 8, 4, 2], "attn_window_size": None,
    "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True,
    "depthwise": True,
}
SYSTEM = "orpheus-reference"
DEFAULT_LISTENER = ListenerConfig()


def make_random_snac(path: Path, seed: int = 0) -> None:
    """A SNAC folder (config.json + pytorch_model.bin) with random weights."""
    import torch
    from snac import SNAC

    torch.manual_seed(seed)
    model = SNAC(**SNAC_24KHZ_CONFIG)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG), encoding="utf-8")
    torch.save(model.state_dict(), path / "pytorch_model.bin")


def _redirect_snac(snac_dir: Path) -> None:
    """Make the reference's module-level ``SNAC.from_pretrained(hub id)`` read ``snac_dir``."""
    from snac import SNAC

    original = SNAC.from_pretrained.__func__  # the classmethod's function

    def from_pretrained(cls: type, repo_id: str, *args: Any, **kwargs: Any) -> Any:
        if repo_id == SNAC_HUB_ID:
            repo_id = str(snac_dir)
        return original(cls, repo_id, *args, **kwargs)

    SNAC.from_pretrained = classmethod(from_pretrained)


def load_reference(model_dir: Path, snac_dir: Path | None, engine_args: dict[str, Any]
                   ) -> Any:
    """The reference ``OrpheusModel`` over ``model_dir`` (tokenizer from there too)."""
    if snac_dir is not None:
        _redirect_snac(snac_dir)
    try:
        from orpheus_tts import OrpheusModel
    except ImportError as exc:
        raise SystemExit(f"orpheus_reference: the reference code is not installed ({exc}); "
                         "pip install orpheus-speech (it needs vllm and snac)") from None
    params = inspect.signature(OrpheusModel.__init__).parameters
    kwargs = dict(engine_args)
    if "tokenizer" in params:  # later versions take the tokenizer path apart
        kwargs["tokenizer"] = str(model_dir)
    return OrpheusModel(model_name=str(model_dir), **kwargs)


def chunk_arrivals(chunks: Iterable[tuple[float, int]]) -> tuple[tuple[float, int, int], ...]:
    """``(time, bytes of int16 audio)`` per chunk -> ``(time, seq, 1)`` listener arrivals."""
    out = []
    for seq, (at, _) in enumerate(chunks):
        out.append((at, seq, 1))
    return tuple(out)


def measure_request(speak: Callable[[str], Iterator[bytes]], text: str,
                    clock: Callable[[], float] = time.monotonic,
                    listener: ListenerConfig = DEFAULT_LISTENER) -> dict[str, Any]:
    """Run one reference request and measure it like an rtserver context."""
    began = clock()
    chunks: list[tuple[float, int]] = []
    error: str | None = None
    try:
        for audio in speak(text):
            chunks.append((clock(), len(audio)))
    except Exception as exc:  # the reference's failure is a result, not a crash
        error = f"{type(exc).__name__}: {exc}"
    finished = clock()
    record = TurnRecord(text=text, frame_ms=CHUNK_MS,
                        text_sent=((began, 0, len(text)),), end_sent_at=began,
                        seg0_source=(0, len(text)), arrivals=chunk_arrivals(chunks),
                        outcome="failed" if error else "done", finished_at=finished,
                        error_code="reference_failed" if error else None, error_message=error)
    sample = analyze(record, listener)
    sample["audio_ms"] = sum(n // 2 for _, n in chunks) * 1000 / REFERENCE_RATE
    sample["began_at"] = began
    return sample


def run_level(model: Any, voice: str, users: int, duration_s: float, seed: str,
              emit: Callable[[dict[str, Any]], None]) -> None:
    """``users`` threads calling the reference back to back for ``duration_s``."""
    stop_at = time.monotonic() + duration_s
    texts = select("en")
    ids = iter(range(1 << 62))
    lock = threading.Lock()

    def user(k: int) -> None:
        rng = random.Random(f"{seed}:user{k}")
        turn = 0
        while time.monotonic() < stop_at:
            utt = rng.choice(texts)
            with lock:
                rid = f"ref-{next(ids)}"

            def speak(text: str, rid: str = rid) -> Iterator[bytes]:
                return iter(model.generate_speech(prompt=text, voice=voice, request_id=rid))

            sample = measure_request(speak, utt.text)
            sample.update({"system": SYSTEM, "run": "sweep", "load": "whole",
                           "level": users, "user": k, "turn": turn, "kind": "whole",
                           "utterance": utt.id, "tags": list(utt.tags)})
            with lock:
                emit(sample)
            turn += 1

    threads = [threading.Thread(target=user, args=(k,), daemon=True) for k in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("--engine-arg is key=JSON")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.orpheus_reference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="Orpheus HF folder (weights or, with "
                   "load_format dummy, config + tokenizer)")
    p.add_argument("--snac-dir", type=Path, help="local SNAC 24 kHz folder")
    p.add_argument("--make-random-snac", type=Path, metavar="DIR",
                   help="write a random-weight SNAC folder and exit")
    p.add_argument("--engine-arg", type=_engine_arg, action="append", default=[])
    p.add_argument("--voice", default="tara")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", default="0")
    p.add_argument("--ttfa-p99-ms", type=float, default=120.0)
    p.add_argument("--note", action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("bench-out/orpheus-reference"))
    args = p.parse_args(argv)
    if args.make_random_snac:
        make_random_snac(args.make_random_snac)
        return 0
    if args.model_dir is None:
        p.error("--model-dir is required")
    model = load_reference(args.model_dir, args.snac_dir, dict(args.engine_arg))
    for i in range(args.warmup):
        for _ in model.generate_speech(prompt="Warming up.", voice=args.voice,
                                       request_id=f"warm-{i}"):
            pass
    samples: list[dict[str, Any]] = []
    for level in [int(x) for x in args.concurrency.split(",") if x]:
        print(f"[orpheus-reference] {level} concurrent, {args.duration:g} s", file=sys.stderr)
        run_level(model, args.voice, level, args.duration, f"{args.seed}:c{level}",
                  samples.append)
    rows = report.aggregate(samples)
    caps = report.capacity(rows, args.ttfa_p99_ms)
    results = {
        "meta": {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": describe(), "versions": versions(),
                 "server": "orpheus_tts.OrpheusModel (reference streaming code)",
                 "voice": args.voice, "command": "python -m bench.orpheus_reference " +
                 " ".join(argv), "notes": args.note},
        "config": {"seed": args.seed, "duration_s": args.duration, "fragment": "whole",
                   "tokens_per_s": 0.0, "jitter": 0.0, "format": "pcm_s16le",
                   "sample_rate": REFERENCE_RATE, "frame_ms": CHUNK_MS,
                   "engine_args": dict(args.engine_arg)},
        "steps": [], "samples": samples,
        "summary": [{"system": r.system, "run": r.run, "load": r.load, "level": r.level,
                     **r.stats} for r in rows],
        "capacity": [dataclasses.asdict(c) for c in caps],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str),
                                           encoding="utf-8")
    report.write_markdown(args.out / "summary.md", report.markdown(results, rows, caps))
    print(f"[orpheus-reference] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
