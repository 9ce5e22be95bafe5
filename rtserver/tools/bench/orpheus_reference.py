"""Hook: measure the *reference* Orpheus streaming code on the GPU host.

This runs Canopy Labs' own streaming path, ``orpheus_tts.OrpheusModel.
generate_speech`` (PyPI package ``orpheus-speech``, which pulls ``vllm`` and
``snac``), unmodified, on the same GPU and weights as rtserver's Orpheus
voice, and writes results in the same schema as ``python -m rtserver.tools.bench``
(``system = "orpheus-reference"``), so ``rtserver.tools.bench.report`` puts them side by
side. It does not run here (no GPU, no vLLM): another step runs it on the
GPU host; nothing in this module produces a figure without running the
reference.

What is adapted, and only this (the reference's own methods run unchanged):

- The reference loads SNAC at import with ``SNAC.from_pretrained(
  "hubertsiuzdak/snac_24khz")``; no hub is reachable, so ``--snac-dir``
  redirects that one call to a local folder in SNAC's layout (config.json +
  pytorch_model.bin). ``--make-random-snac DIR`` writes one with random
  weights of the published 24 kHz shapes.
- vLLM engine arguments pass through ``--engine-arg key=JSON``, e.g.
  ``--engine-arg load_format='"dummy"'`` for random weights of the real
  shapes. orpheus-speech 0.1.0 (the PyPI release) takes no engine arguments
  (``OrpheusModel(model_name, dtype)``); then a subclass overrides only
  ``_setup_engine`` to add them. With random weights the model emits
  arbitrary tokens, which the reference decoder drops; pass the audio-token
  constraint (``rtserver.tools.bench.reference_mask``, a vLLM logits processor applied to
  every request: ``--engine-arg logits_processors='["rtserver.tools.bench.reference_mask:
  AudioOnlyMask"]'``) so both sides emit audio tokens at the same per-token
  cost, and say so in the report.
- vLLM 0.26 has only the V1 engine (``AsyncLLMEngine`` is ``AsyncLLM``), and
  the reference runs every request in its own thread under its own
  ``asyncio.run``. V1's output handler is an asyncio task of the loop of the
  first request: that loop ends with the request, and every later request
  waits forever (V0, which the reference was written for, restarted its
  background loop per request: canopyai/Orpheus-TTS issue 64). So the engine
  the reference holds is wrapped (``LoopBridge``): ``generate`` runs on one
  persistent event loop thread and each output is handed to the caller's
  loop. V1 also merges outputs when a consumer lags (V0 queued each one); the
  bridge splits a merged cumulative text back into one output per new
  ``<custom_token_N>``, so the reference's decoder still sees every token as
  it did on V0, and it counts how often that happened.
- ``--dummy-model DIR`` writes an Orpheus-3B ``config.json`` and tokenizer
  (``rtserver.voices.orpheus.layout``) for ``load_format="dummy"``, with the
  ``<custom_token_N>`` added tokens marked non-special: the reference reads
  the codes from vLLM's detokenized text with ``skip_special_tokens`` on, so
  it works only with a tokenizer where they survive that (as the published
  checkpoint's must).
- ``--budget FPC:BASE``: ``max_tokens`` per request (an argument of
  ``generate_speech``) from the text length, ``BASE + FPC * chars`` frames,
  the same rule as rtserver's ``TokenBudget``; random weights never end
  speech, so this sets the audio length a real reply would have. Without it
  the reference's default, 1200 tokens (14.6 s), for every text.

Measured per request (the reference takes the whole text at once, so both
TTFA figures start when ``generate_speech`` is called): time to the first
audio chunk, chunk arrival times through the simulated listener (a chunk is
2048 samples at 24 kHz, 85.3 ms, as the reference's decoder slices it),
audio seconds, errors. Concurrency: N threads each calling the reference
back to back (its API is a blocking generator with a thread per request).

Usage on the GPU host::

    python -m rtserver.tools.bench.orpheus_reference --model-dir M --snac-dir S \\
        --engine-arg load_format='"dummy"' --concurrency 1,16,64 --duration 30 \\
        --out bench/results/gpu-orpheus-reference-DATE
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import inspect
import json
import random
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rtserver.tools.bench import report
from rtserver.tools.bench.corpus import select
from rtserver.tools.bench.listener import ListenerConfig
from rtserver.tools.bench.machine import describe, versions
from rtserver.tools.bench.measure import TurnRecord, analyze

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


def write_reference_model(path: Path, shape: str = "3b") -> Path:
    """Orpheus config + tokenizer (no weights: ``load_format="dummy"``), with the
    ``<custom_token_N>`` tokens non-special so they survive detokenization."""
    from rtserver.voices.orpheus.layout import write_tiny_orpheus

    out = write_tiny_orpheus(path, shape="3b" if shape == "3b" else "tiny", with_weights=False)
    tok_path = out / "tokenizer.json"
    data = json.loads(tok_path.read_text(encoding="utf-8"))
    for tok in data["added_tokens"]:
        if tok["content"].startswith("<custom_token_"):
            tok["special"] = False
    tok_path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return out


_CUSTOM_TOKEN = re.compile(r"<custom_token_\d+>")
_END = object()


@dataclasses.dataclass
class _Completion:
    text: str


@dataclasses.dataclass
class _Output:
    """What the reference reads of a ``RequestOutput``: ``outputs[0].text``."""

    outputs: list[_Completion]


class LoopBridge:
    """The reference's ``engine``: ``generate`` on one persistent event loop.

    The wrapped engine (vLLM V1 ``AsyncLLM``) runs every request on the
    bridge's own loop thread; outputs go to whichever loop called
    ``generate`` (the reference's per-request ``asyncio.run``), one per new
    token as V0 delivered them (see the module docstring).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.merged_outputs = 0  # outputs that carried more than one new token
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop",
                                        daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # anything else: the engine's own
        return getattr(self.engine, name)

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            caller.call_soon_threadsafe(queue.put_nowait, item)

        async def pump() -> None:
            seen = ""
            try:
                async for out in self.engine.generate(*args, **kwargs):
                    text = out.outputs[0].text if out.outputs else ""
                    new = _CUSTOM_TOKEN.findall(text[len(seen):]) \
                        if text.startswith(seen) else []
                    if len(new) > 1:
                        self.merged_outputs += 1
                        for k in range(1, len(new) + 1):
                            put(_Output([_Completion(seen + "".join(new[:k]))]))
                    else:
                        put(out)
                    seen = text
            except BaseException as exc:  # handed to the caller, who raises it
                put(exc)
            finally:
                put(_END)

        asyncio.run_coroutine_threadsafe(pump(), self._loop)
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def shutdown(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)


def load_reference(model_dir: Path, snac_dir: Path | None, engine_args: dict[str, Any]
                   ) -> Any:
    """The reference ``OrpheusModel`` over ``model_dir`` (tokenizer from there too),
    its engine behind a ``LoopBridge``."""
    if snac_dir is not None:
        _redirect_snac(snac_dir)
    try:
        from orpheus_tts import OrpheusModel
    except ImportError as exc:
        raise SystemExit(f"orpheus_reference: the reference code is not installed ({exc}); "
                         "pip install orpheus-speech (it needs vllm and snac)") from None
    params = inspect.signature(OrpheusModel.__init__).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = {}
    if "tokenizer" in params:  # later versions take the tokenizer path apart
        kwargs["tokenizer"] = str(model_dir)
    if takes_kwargs:
        cls: Any = OrpheusModel
        kwargs |= engine_args
    else:  # 0.1.0: AsyncEngineArgs(model=..., dtype=...) only; add ours there
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        class _WithEngineArgs(OrpheusModel):
            def _setup_engine(self) -> Any:
                args = AsyncEngineArgs(model=self.model_name, dtype=self.dtype,
                                       **engine_args)
                return AsyncLLMEngine.from_engine_args(args)

        cls = _WithEngineArgs
    model = cls(model_name=str(model_dir), **kwargs)
    model.engine = LoopBridge(model.engine)
    return model


def natural_budget(spec: str | None) -> Callable[[str], dict[str, Any]]:
    """``FPC:BASE`` -> text -> ``{"max_tokens": ...}`` for ``generate_speech``
    (rtserver's ``TokenBudget`` rule); None -> the reference's default."""
    if not spec:
        return lambda text: {}
    from rtserver.voices.orpheus.codes import TokenBudget

    fpc, _, base = spec.partition(":")
    budget = TokenBudget(frames_per_char=float(fpc), base_frames=int(base or 0))
    return lambda text: {"max_tokens": budget.max_tokens(text)}


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
              emit: Callable[[dict[str, Any]], None],
              budget: Callable[[str], dict[str, Any]] = lambda text: {},
              tags: tuple[str, ...] = ()) -> None:
    """``users`` threads calling the reference back to back for ``duration_s``."""
    stop_at = time.monotonic() + duration_s
    texts = select("en", tags)
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
                return iter(model.generate_speech(prompt=text, voice=voice, request_id=rid,
                                                  **budget(text)))

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
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.orpheus_reference",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="Orpheus HF folder (weights or, with "
                   "load_format dummy, config + tokenizer)")
    p.add_argument("--snac-dir", type=Path, help="local SNAC 24 kHz folder")
    p.add_argument("--make-random-snac", type=Path, metavar="DIR",
                   help="write a random-weight SNAC folder and exit")
    p.add_argument("--dummy-model", type=Path, metavar="DIR",
                   help="write an Orpheus-3B config + tokenizer here and use it as --model-dir "
                   "(with --engine-arg load_format='\"dummy\"')")
    p.add_argument("--dummy-shape", choices=["3b", "tiny"], default="3b",
                   help="shape --dummy-model writes (tiny: CPU smoke runs)")
    p.add_argument("--budget", metavar="FPC:BASE",
                   help="max_tokens = (BASE + FPC * chars) frames * 7 + 1, rtserver's rule "
                   "(default: the reference's 1200)")
    p.add_argument("--tags", default="", help="corpus tags to keep, comma list")
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
    if args.dummy_model is not None:
        args.model_dir = write_reference_model(args.dummy_model, args.dummy_shape)
    if args.model_dir is None:
        p.error("--model-dir (or --dummy-model) is required")
    budget = natural_budget(args.budget)
    tags = tuple(t for t in args.tags.split(",") if t)
    t0 = time.monotonic()
    model = load_reference(args.model_dir, args.snac_dir, dict(args.engine_arg))
    print(f"[orpheus-reference] engine ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    for i in range(args.warmup):
        for _ in model.generate_speech(prompt="Warming up.", voice=args.voice,
                                       request_id=f"warm-{i}"):
            pass
    samples: list[dict[str, Any]] = []

    def write(levels_done: list[int]) -> None:
        rows = report.aggregate(samples)
        caps = report.capacity(rows, args.ttfa_p99_ms)
        results = {
            "meta": {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                     "machine": describe(), "versions": versions(),
                     "server": "orpheus_tts.OrpheusModel (reference streaming code)",
                     "voice": args.voice, "command":
                      "python -m rtserver.tools.bench.orpheus_reference " +
                     " ".join(argv), "notes": args.note},
            "config": {"seed": args.seed, "duration_s": args.duration, "fragment": "whole",
                       "tokens_per_s": 0.0, "jitter": 0.0, "format": "pcm_s16le",
                       "sample_rate": REFERENCE_RATE, "frame_ms": CHUNK_MS,
                       "engine_args": dict(args.engine_arg), "budget": args.budget,
                       "tags": list(tags), "merged_outputs": model.engine.merged_outputs,
                       "levels_done": levels_done},
            "steps": [], "samples": samples,
            "summary": [{"system": r.system, "run": r.run, "load": r.load, "level": r.level,
                         **r.stats} for r in rows],
            "capacity": [dataclasses.asdict(c) for c in caps],
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str),
                                               encoding="utf-8")
        report.write_markdown(args.out / "summary.md", report.markdown(results, rows, caps))

    levels_done: list[int] = []
    for level in [int(x) for x in args.concurrency.split(",") if x]:
        print(f"[orpheus-reference] {level} concurrent, {args.duration:g} s", file=sys.stderr)
        run_level(model, args.voice, level, args.duration, f"{args.seed}:c{level}",
                  samples.append, budget, tags)
        done = [x for x in samples if x["level"] == level]
        ttfa = sorted(x["ttfa_ms"] for x in done if x.get("ttfa_ms") is not None)
        print(f"[orpheus-reference] {level}: {len(done)} requests, ttfa p50 "
              f"{ttfa[len(ttfa) // 2] if ttfa else float('nan'):.0f} ms, max "
              f"{ttfa[-1] if ttfa else float('nan'):.0f} ms, underran "
              f"{sum(1 for x in done if (x.get('underruns') or 0) > 0)}, failed "
              f"{sum(1 for x in done if x.get('outcome') != 'done')}, merged outputs "
              f"{model.engine.merged_outputs}", file=sys.stderr, flush=True)
        levels_done.append(level)
        write(levels_done)  # after every level: a run cut short keeps what it measured
    print(f"[orpheus-reference] wrote {args.out}", file=sys.stderr)
    model.engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
