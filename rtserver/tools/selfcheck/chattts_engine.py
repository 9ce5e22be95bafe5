"""Self-check of the torch engine's decode step on a ChatTTS folder.

Prefills ``--batch`` random prompts into slots, then for ``--steps`` steps
runs the same decode step three ways from the same state: the CUDA graph of
its bucket (on CUDA), the eager step, and the eager step of each row alone
(batch of one, CPU only: slow). It prints JSON with the largest absolute
difference of the hidden states and the share of differing codes, plus the
time per step of each way.

    python -m rtserver.tools.selfcheck.chattts_engine --asset-dir /path/chattts \\
        --device cuda --dtype bfloat16 --batch 64 --steps 16
    python -m rtserver.tools.selfcheck.chattts_engine --asset-dir TINY --device cpu --batch 3
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from rtserver.engine.base import PromptEmbedding, SamplingSettings, TokenRequest
from rtserver.voices.chattts.assets import load_lm_assets
from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig
from rtserver.voices.chattts.engine.intake import EngineRequest, prefill_inputs
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.engine.runner import ModelRunner
from rtserver.voices.chattts.engine.scheduler import Seq


def _state(runner: ModelRunner) -> list[torch.Tensor]:
    m = runner.model
    return [runner.istate, runner.fstate, runner.hist, runner.out_i, runner.out_h,
            m.k_cache, m.v_cache]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_transformers(assets: Any, *, device: str, dtype: torch.dtype, batch: int,
                      steps: int, prompt: int = 32) -> float:
    """ms per decode step of transformers' ``LlamaModel`` with its ``DynamicCache``
    on the same weights (the alternative to our forward), eager."""
    from transformers import DynamicCache, LlamaConfig, LlamaModel

    c = assets.config
    fields: dict[str, Any] = {
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": c.num_hidden_layers, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": 8}
    hf = LlamaModel(LlamaConfig(**fields)).eval()
    state = dict(assets.gpt)
    state["embed_tokens.weight"] = torch.zeros(8, c.hidden_size)
    hf.load_state_dict(state)
    hf = hf.to(device=device, dtype=dtype)
    cache = DynamicCache()
    x = torch.randn(batch, prompt, c.hidden_size, device=device, dtype=dtype)
    hf(inputs_embeds=x, past_key_values=cache, use_cache=True)
    step = torch.randn(batch, 1, c.hidden_size, device=device, dtype=dtype)
    dev = torch.device(device)
    total = 0.0
    for i in range(steps + 2):
        _sync(dev)
        t = time.monotonic()
        hf(inputs_embeds=step, past_key_values=cache, use_cache=True,
           cache_position=torch.tensor([prompt + i], device=device))
        _sync(dev)
        if i >= 2:  # two warm-up steps
            total += time.monotonic() - t
    return 1000 * total / steps


def run(asset_dir: str, *, device: str, dtype: str, batch: int, steps: int,
        max_len: int, graphs: bool, alone: bool, compare_hf: bool = False) -> dict[str, Any]:
    torch.set_grad_enabled(False)
    assets = load_lm_assets(asset_dir)
    cfg = assets.config
    dt = getattr(torch, dtype)

    def factory() -> ChatLM:
        return ChatLM(cfg, assets.gpt, assets.embed, slots=batch, max_len=max_len,
                      device=device, dtype=dt)

    engine = TorchCodeEngine(factory, TorchEngineConfig(
        slots=batch, max_len=max_len, cuda_graphs=graphs, batch_buckets=(batch,),
        length_buckets=(max_len,)), eos_id=cfg.eos_id)
    t0 = time.monotonic()
    model = engine._build()
    engine._model = model
    build_s = time.monotonic() - t0
    runner, sched = engine.runner, engine._sched
    assert sched is not None
    gen = torch.Generator().manual_seed(0)
    spk = torch.randn(cfg.hidden_size, generator=gen)
    spk = spk / spk.norm()
    tok = assets.tokenizer
    for i in range(batch):
        ids = tok.encode(f"[Stts][spk_emb][speed_5]check number {i}[Ptts]")
        req = TokenRequest(request_id=f"r{i}", prompt_token_ids=tuple(ids), max_tokens=steps + 1,
                           sampling=SamplingSettings(temperature=0.3, top_p=0.7, top_k=20,
                                                     repetition_penalty=1.05, seed=i),
                           want_hidden=True,
                           embeddings=(PromptEmbedding(tok.spk_emb_id,
                                                       tuple(spk.tolist())),))
        p = EngineRequest(req, prefill_inputs(req, model, min_new=engine.config.min_new_steps),
                          submitted=0.0)
        sched.add(Seq(rid=req.request_id, prompt_len=len(ids), payload=p))
    while sched.decoding < batch:  # prefill everyone (the plans' decode rows run too)
        runner.wait(runner.launch(sched.schedule(), engine._inputs, True))
    dev = model.device
    b, length = batch, max_len
    worst_h = {"graph_vs_eager": 0.0, "alone_vs_batched": 0.0}
    diff_codes = {"graph_vs_eager": 0, "alone_vs_batched": 0}
    times: dict[str, float] = {"eager": 0.0, "graph": 0.0, "alone": 0.0}
    graph = runner._decode_graphs.get((b, length))
    vq = runner.vq
    for _ in range(steps):
        saved = [t.clone() for t in _state(runner)]
        _sync(dev)
        t = time.monotonic()
        runner._decode(b, length)
        _sync(dev)
        times["eager"] += time.monotonic() - t
        eager_h = runner.out_h[:b].clone()
        eager_c = runner.out_i[:b, :vq].clone()
        after = [x.clone() for x in _state(runner)]
        if graph is not None:
            for dst, src in zip(_state(runner), saved, strict=True):
                dst.copy_(src)
            _sync(dev)
            t = time.monotonic()
            graph.replay()
            _sync(dev)
            times["graph"] += time.monotonic() - t
            worst_h["graph_vs_eager"] = max(worst_h["graph_vs_eager"], float(
                (runner.out_h[:b] - eager_h).abs().max()))
            diff_codes["graph_vs_eager"] += int((runner.out_i[:b, :vq] != eager_c).sum())
        if alone:
            for row in range(b):
                # row alone: move its state to slot 0 of a batch of one
                for dst, src in zip(_state(runner), saved, strict=True):
                    dst.copy_(src)
                for buf in (runner.istate, runner.fstate, runner.hist):
                    buf[0] = buf[row].clone()
                model.k_cache[:, 0] = model.k_cache[:, row].clone()
                model.v_cache[:, 0] = model.v_cache[:, row].clone()
                t = time.monotonic()
                runner._decode(1, length)
                _sync(dev)
                times["alone"] += time.monotonic() - t
                worst_h["alone_vs_batched"] = max(worst_h["alone_vs_batched"], float(
                    (runner.out_h[0] - eager_h[row]).abs().max()))
                diff_codes["alone_vs_batched"] += int((runner.out_i[0, :vq] != eager_c[row])
                                                      .sum())
        for dst, src in zip(_state(runner), after, strict=True):
            dst.copy_(src)
    n = steps * b * cfg.num_vq
    hf_ms = fwd_ms = None
    if compare_hf:
        hf_ms = round(time_transformers(assets, device=device, dtype=dt, batch=b, steps=steps),
                      3)
        total = 0.0
        for _ in range(steps):
            _sync(dev)
            t = time.monotonic()
            model.decode(runner.istate[:b, :vq], runner.istate[:b, runner.POS],
                         256 if max_len >= 256 else max_len)
            _sync(dev)
            total += time.monotonic() - t
        fwd_ms = round(1000 * total / steps, 3)
    return {
        # the forward alone, eager, same batch: ours vs transformers' LlamaModel
        "forward_ms_per_step": {"ours_eager": fwd_ms, "transformers_llama": hf_ms}
        if compare_hf else None,
        "device": str(dev), "dtype": dtype, "batch": b, "length_bucket": length,
        "steps": steps, "build_s": round(build_s, 2), "graphs": runner.graphs,
        "max_abs_diff_hidden": {k: v for k, v in worst_h.items()
                                if (k == "graph_vs_eager" and graph is not None)
                                or (k == "alone_vs_batched" and alone)},
        "codes_differing": {k: f"{diff_codes[k]}/{n}" for k in diff_codes
                            if (k == "graph_vs_eager" and graph is not None)
                            or (k == "alone_vs_batched" and alone)},
        "ms_per_step": {k: round(1000 * v / steps, 3) for k, v in times.items()
                        if v > 0 and k != "alone"},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--asset-dir", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--alone", action="store_true",
                   help="also run each row alone (batch invariance; slow on big batches)")
    p.add_argument("--compare-hf", action="store_true",
                   help="also time transformers' LlamaModel + DynamicCache decode (the "
                        "forward only; ours includes heads and sampling)")
    a = p.parse_args()
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    res = run(a.asset_dir, device=a.device, dtype=dtype, batch=a.batch, steps=a.steps,
              max_len=a.max_len, graphs=a.device.startswith("cuda"), alone=a.alone,
              compare_hf=a.compare_hf)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
