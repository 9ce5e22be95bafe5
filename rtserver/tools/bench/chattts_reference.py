"""Measure the reference: the ``chattts`` PyPI package's ``Chat.infer(stream=True)``.

Runs upstream's own streaming path, unchanged, on the same folder of random
weights of the real shapes as rtserver's ChatTTS voice
(``python -m rtserver.tools.layouts.chattts CK --shape real``), and writes JSON.

What is adapted, and only this:

- Loading: ``Chat.load(source="custom", custom_path=CK)`` first checks the
  SHA-256 of every file against the published weights, which random weights
  fail; so this calls what ``load`` calls after that check,
  ``Chat._load(**{name: CK/path})`` with upstream's own ``config.path``.
- Random weights end speech at random (EOS 625), so every request sets
  ``min_new_token = max_new_token =`` the budget rtserver's benchmark uses
  (natural speech length: 0.3 s + 0.07 s per character at 46.875 steps/s):
  both sides speak the same number of steps.
- Upstream's defaults otherwise: ``InferCodeParams`` (temperature 0.3, top_P
  0.7, top_K 20, repetition penalty 1.05, ``stream_batch`` 24,
  ``pass_first_n_batches`` 2), the Decoder route, no refine pass
  (``skip_refine_text=True``: rtserver's default too), a speaker from
  ``sample_random_speaker()``.

Per level N (``--mode batch``: one ``infer`` call with N texts, upstream's own
way to serve several; ``--mode threads``: N threads each calling ``infer``):
time to the first non-empty audio chunk (TTFA, from the call), audio seconds
per stream, wall time; a level holds real time when every stream's audio
came at least as fast as it plays after its first chunk.

    python -m rtserver.tools.bench.chattts_reference --check-deps
    python -m rtserver.tools.bench.chattts_reference --ckpt CK --device cuda \\
         --levels 1,2,4,8,16,32 \\
        --out reference.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import threading
import time
from dataclasses import asdict
from typing import Any

SAMPLE_RATE = 24000
STEPS_PER_S = SAMPLE_RATE / 512
TEXT = "Hello there, this is a benchmark of how quickly the first audio arrives."
DEPS = ("ChatTTS", "torch", "torchaudio", "transformers", "vocos", "vector_quantize_pytorch",
        "numba", "pybase16384", "einops", "einx", "encodec", "scipy", "huggingface_hub",
        "tqdm", "requests", "numpy")


def check_deps() -> dict[str, str]:
    """Module -> version, or the import error."""
    out: dict[str, str] = {}
    for name in DEPS:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # any failure to import is what we report
            out[name] = f"MISSING: {type(exc).__name__}: {exc}"
        else:
            out[name] = str(getattr(mod, "__version__", "ok"))
    return out


def budget_steps(text: str) -> int:
    """rtserver's benchmark budget: 0.3 s + 0.07 s per character."""
    chars = sum(1 for ch in text if ch.isalnum())
    return math.ceil((0.3 + 0.07 * chars) * STEPS_PER_S)


def load_chat(ckpt: str, device: str) -> Any:
    import torch
    from ChatTTS import Chat

    chat = Chat()
    paths = {k: os.path.join(ckpt, v) for k, v in asdict(chat.config.path).items()}
    ok = chat._load(device=torch.device(device), compile=False, **paths)
    if not ok:
        raise SystemExit(f"ChatTTS did not load {ckpt}")
    return chat


def _params(chat: Any, steps: int, seed: int | None) -> Any:
    from ChatTTS import Chat

    return Chat.InferCodeParams(spk_emb=chat.sample_random_speaker(), show_tqdm=False,
                                max_new_token=steps, min_new_token=steps, manual_seed=seed)


def _stream(chat: Any, texts: list[str], params: Any) -> tuple[float | None, list[int], float]:
    """One ``infer`` call: (first chunk s, samples per stream, wall s)."""
    t = time.monotonic()
    first: float | None = None
    samples = [0] * len(texts)
    for wavs in chat.infer(texts, stream=True, skip_refine_text=True, split_text=False,
                           use_decoder=True, params_infer_code=params):
        if wavs is None:
            continue
        for i, w in enumerate(wavs):
            n = int(getattr(w, "shape", [len(w)])[-1])
            samples[i] += n
            if n and first is None:
                first = time.monotonic() - t
    return first, samples, time.monotonic() - t


def run_level(chat: Any, n: int, mode: str, text: str) -> dict[str, Any]:
    steps = budget_steps(text)
    if mode == "batch":
        first, samples, wall = _stream(chat, [text] * n, _params(chat, steps, None))
        firsts = [first] * n
        walls = [wall] * n
    else:
        results: list[tuple[float | None, list[int], float]] = [(None, [0], 0.0)] * n

        def worker(i: int) -> None:
            results[i] = _stream(chat, [text], _params(chat, steps, None))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        firsts = [r[0] for r in results]
        samples = [r[1][0] for r in results]
        walls = [r[2] for r in results]
    audio = [s / SAMPLE_RATE for s in samples]
    # real time: audio after the first chunk arrived at least as fast as it plays
    rt = all(f is not None and a > 0 and (w - f) <= a
             for f, a, w in zip(firsts, audio, walls, strict=True))
    ok_firsts = [f for f in firsts if f is not None]
    return {"streams": n, "mode": mode, "steps": steps,
            "ttfa_ms_max": round(1000 * max(ok_firsts), 1) if ok_firsts else None,
            "ttfa_ms_min": round(1000 * min(ok_firsts), 1) if ok_firsts else None,
            "audio_s_per_stream_min": round(min(audio), 3),
            "wall_s_max": round(max(walls), 3), "real_time": rt}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--check-deps", action="store_true")
    p.add_argument("--ckpt", default="")
    p.add_argument("--device", default="cuda")
    p.add_argument("--levels", default="1,2,4,8,16,32")
    p.add_argument("--mode", choices=["batch", "threads"], default="batch")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--repeats", type=int, default=3, help="runs at 1 stream (TTFA)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    deps = check_deps()
    if a.check_deps or not a.ckpt:
        print(json.dumps(deps, indent=1))
        return
    chat = load_chat(a.ckpt, a.device)
    res: dict[str, Any] = {"system": "chattts-reference", "deps": deps, "ckpt": a.ckpt,
                           "device": a.device, "text": a.text,
                           "note": "random weights of the real shapes; EOS held off to the "
                                   "budget (min_new_token = max_new_token)", "levels": []}
    _stream(chat, [a.text], _params(chat, 30, 0))  # warm-up
    single = [run_level(chat, 1, "batch", a.text) for _ in range(a.repeats)]
    res["single"] = single
    print(json.dumps(single), flush=True)
    for n in (int(x) for x in a.levels.split(",")):
        lvl = run_level(chat, n, a.mode, a.text)
        res["levels"].append(lvl)
        print(json.dumps(lvl), flush=True)
        if not lvl["real_time"]:
            break  # larger levels only fall further behind
    held = [lv["streams"] for lv in res["levels"] if lv["real_time"]]
    res["streams_held"] = max(held) if held else 0
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
