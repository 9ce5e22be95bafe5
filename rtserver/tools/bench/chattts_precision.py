"""The ChatTTS GPT in bf16 against float32 (upstream's precision).

Two measurements on the same prompts, speaker vectors and seeds:

- **free-running**, through the engine: each precision generates on its own.
  Codes agree until the first step where a draw flips; after that the two
  sequences condition on different histories, so the share of agreeing steps
  falls fast whatever the precision error (sampling is chaotic).
- **teacher-forced**, on the model directly: both precisions read the float32
  run's codes as history, so every step compares the two distributions the
  sampler draws from (after temperature, penalty, top-p, top-k) given the same
  past: their total-variation distance, how often the same noise draws a
  different code (the per-step flip rate), and the hidden state's relative
  error, over long generations; then the Decoder's mel (float32, upstream's
  default route, which reads the hidden states) of both runs' hidden states:
  the mel error bf16 leaves in what is heard.

    python -m rtserver.tools.bench.chattts_precision --ckpt CK --requests 64 --steps 512
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import numpy as np

from rtserver.engine.base import PromptEmbedding, SamplingSettings, TokenRequest
from rtserver.tools.bench.store import emit_json

TEXTS = ("Hello there, this is a check of how closely the two precisions agree.",
         "The quick brown fox jumps over the lazy dog, again and again.",
         "今天天气很好，我们一起去公园散步吧。",
         "Numbers like 1234 and dates like 2026 are read out as words.")


async def _run(ckpt: str, device: str, dtype_name: str, n: int, steps: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    import torch

    from rtserver.voices.chattts.assets import load_lm_assets
    from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig
    from rtserver.voices.chattts.engine.model import ChatLM
    from rtserver.voices.chattts.text import code_prompt

    a = load_lm_assets(ckpt)
    cfg = a.config
    max_len = 128 + steps
    slots = min(n, 64)

    def factory() -> ChatLM:
        return ChatLM(cfg, a.gpt, a.embed, slots=slots, max_len=max_len, device=device,
                      dtype=getattr(torch, dtype_name))

    engine = TorchCodeEngine(factory, TorchEngineConfig(
        slots=slots, max_len=max_len, ignore_eos=True, batch_buckets=(slots,),
        length_buckets=(max_len,), cuda_graphs=device.startswith("cuda")),
        eos_id=cfg.eos_id)
    await engine.start()
    try:
        async def one(i: int) -> tuple[np.ndarray, np.ndarray]:
            vec = np.random.default_rng(1000 + i).standard_normal(cfg.hidden_size)
            vec = vec / np.linalg.norm(vec)
            ids = a.tokenizer.encode(code_prompt(TEXTS[i % len(TEXTS)]))
            req = TokenRequest(
                request_id=f"p{i}", prompt_token_ids=tuple(ids), max_tokens=steps,
                sampling=SamplingSettings(temperature=0.3, top_p=0.7, top_k=20,
                                          repetition_penalty=1.05, seed=i),
                want_hidden=True,
                embeddings=(PromptEmbedding(a.tokenizer.spk_emb_id,
                                            tuple(float(v) for v in vec)),))
            codes: list[tuple[int, ...]] = []
            first: np.ndarray | None = None
            async for d in engine.generate(req):
                codes.extend(d.codes)
                if first is None and d.hidden is not None:
                    first = np.asarray(d.hidden[0], dtype=np.float64)
            assert first is not None
            return np.array(codes), first

        return list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await engine.close()


def teacher_forced(ckpt: str, *, device: str, n: int, steps: int) -> dict[str, Any]:
    import torch

    from rtserver.voices.chattts.assets import load_lm_assets
    from rtserver.voices.chattts.engine.model import ChatLM
    from rtserver.voices.chattts.engine.sampling import PENALTY_WINDOW, code_probs, race_noise
    from rtserver.voices.chattts.text import code_prompt

    torch.set_grad_enabled(False)
    a = load_lm_assets(ckpt)
    cfg = a.config
    max_len = 128 + steps
    models = [ChatLM(cfg, a.gpt, a.embed, slots=n, max_len=max_len, device=device,
                     dtype=dt) for dt in (torch.float32, torch.bfloat16)]
    prompts = [a.tokenizer.encode(code_prompt(TEXTS[i % len(TEXTS)])) for i in range(n)]
    vecs = []
    for i in range(n):
        v = np.random.default_rng(1000 + i).standard_normal(cfg.hidden_size)
        vecs.append(torch.tensor(v / np.linalg.norm(v), dtype=torch.float32, device=device))
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    t = int(lengths.max())
    hidden = []
    for m in models:
        emb = torch.zeros((n, t, cfg.hidden_size), dtype=m.dtype, device=device)
        for i, ids in enumerate(prompts):
            emb[i, :len(ids)] = m.prompt_embeds(torch.tensor(ids, device=device),
                                                a.tokenizer.spk_emb_id, vecs[i])
        hidden.append(m.prefill(emb, lengths, torch.arange(n, device=device)))
    ones = torch.ones(n, device=device)
    params = {"temperature": 0.3 * ones, "top_p": 0.7 * ones,
              "top_k": torch.full((n,), 20, device=device), "penalty": 1.05 * ones,
              "min_new": torch.ones(n, dtype=torch.int64, device=device)}
    seed = torch.arange(n, device=device)
    hist = torch.full((n, cfg.num_vq, PENALTY_WINDOW), cfg.num_audio_tokens,
                      dtype=torch.int64, device=device)
    tv, flips, herr, steps_h = [], [], [], []
    for step in range(steps):
        st = torch.full((n,), step, device=device)
        p32, p16 = (code_probs(m.code_logits(h), history=hist, step=st, eos_id=cfg.eos_id,
                               **params) for m, h in zip(models, hidden, strict=True))
        noise = race_noise(seed, st, cfg.num_vq, cfg.num_audio_tokens)
        c32, c16 = (p32 / noise).argmax(-1), (p16 / noise).argmax(-1)
        tv.append((0.5 * (p32 - p16).abs().sum(-1)).flatten().cpu())
        flips.append((c32 != c16).flatten().cpu())
        herr.append(((hidden[1] - hidden[0]).norm(dim=-1) / hidden[0].norm(dim=-1)).cpu())
        steps_h.append([h.float() for h in hidden])
        hist = torch.cat([hist[:, :, 1:], c32[:, :, None]], dim=2)
        pos = lengths + step
        hidden = [m.decode(c32, pos, max_len) for m in models]
    tvs = torch.cat(tv).double().numpy()
    fl = torch.cat(flips).double().numpy()
    he = torch.cat(herr).double().numpy()
    mel_err = _mel_error(ckpt, device, [torch.stack([s_[k] for s_ in steps_h], dim=1)
                                        for k in (0, 1)])
    return {"requests": n, "steps": steps,
            "mel_rel_err": {"p50": float(np.median(mel_err)),
                            "p99": float(np.percentile(mel_err, 99)),
                            "p50_db": float(20 * np.log10(np.median(mel_err))),
                            "max_db": float(20 * np.log10(mel_err.max()))},
            "tv_distance": {"mean": float(tvs.mean()), "p50": float(np.median(tvs)),
                            "p99": float(np.percentile(tvs, 99))},
            "draw_flip_rate_per_code": float(fl.mean()),
            "hidden_rel_err": {"p50": float(np.median(he)),
                               "p99": float(np.percentile(he, 99))}}


def _mel_error(ckpt: str, device: str, hidden: list[Any]) -> np.ndarray:
    """Per request ``||mel(bf16 hidden) - mel(float32 hidden)|| / ||mel(float32
    hidden)||``: ``hidden`` is [float32, bf16] ``(n, steps, H)``; the Decoder
    runs in float32 on both (upstream's route)."""
    from pathlib import Path

    import torch

    from rtserver.voices.chattts.decoder.checkpoint import load_audio_models

    mel, _, _ = load_audio_models(Path(ckpt), route="decoder")
    mel = mel.to(device).float().eval()
    n, t, _ = hidden[0].shape
    mask = torch.ones((n, 1, 2 * t), device=device)
    out = [mel(h.transpose(1, 2).contiguous(), mask) for h in hidden]
    err = (out[1] - out[0]).flatten(1).norm(dim=1) / out[0].flatten(1).norm(dim=1)
    return np.asarray(err.double().cpu().numpy())


def compare(ckpt: str, *, device: str, n: int, steps: int) -> dict[str, Any]:
    ref = asyncio.run(_run(ckpt, device, "float32", n, steps))
    low = asyncio.run(_run(ckpt, device, "bfloat16", n, steps))
    first_diff, agree, herr = [], [], []
    for (c32, h32), (c16, h16) in zip(ref, low, strict=True):
        same = (c32 == c16).all(axis=1)
        first_diff.append(int(np.argmin(same)) if not same.all() else steps)
        agree.append(float(same.mean()))
        herr.append(float(np.linalg.norm(h16 - h32) / np.linalg.norm(h32)))
    fd = np.array(first_diff)
    return {"device": device, "requests": n, "steps": steps,
            "first_differing_step": {"p10": float(np.percentile(fd, 10)),
                                     "p50": float(np.percentile(fd, 50)),
                                     "p90": float(np.percentile(fd, 90)),
                                     "never": int((fd == steps).sum())},
            "steps_agreeing_share_mean": round(float(np.mean(agree)), 4),
            "hidden_rel_err_step1": {"p50": float(np.median(herr)), "max": float(max(herr))}}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--steps", type=int, default=512)
    p.add_argument("--out", default="")
    a = p.parse_args()
    res = {"free_running": compare(a.ckpt, device=a.device, n=a.requests, steps=a.steps),
           "teacher_forced": teacher_forced(a.ckpt, device=a.device, n=a.requests,
                                            steps=a.steps)}
    emit_json(res, a.out)


if __name__ == "__main__":
    main()
