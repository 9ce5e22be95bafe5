"""ChatLM's hand-written Llama forward against transformers' LlamaModel."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rtserver.tools.layouts.chattts import write_tiny_chattts  # noqa: E402
from rtserver.voices.chattts.assets import load_lm_assets  # noqa: E402
from rtserver.voices.chattts.engine.model import ChatLM  # noqa: E402


def test_prefill_and_decode_match_transformers(tmp_path: Path) -> None:
    write_tiny_chattts(tmp_path, decoder=False)
    a = load_lm_assets(tmp_path)
    cfg = a.config
    hf_cfg = transformers.LlamaConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, num_hidden_layers=cfg.num_hidden_layers,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, vocab_size=8)
    hf = transformers.LlamaModel(hf_cfg).eval()
    state = dict(a.gpt)
    state["embed_tokens.weight"] = torch.zeros(8, cfg.hidden_size)
    hf.load_state_dict(state, strict=True)
    lm = ChatLM(cfg, a.gpt, a.embed, slots=2, max_len=128)
    ids = torch.tensor(a.tokenizer.encode("[Stts][spk_emb][speed_5]hello world[Ptts]"))
    spk = torch.randn(cfg.hidden_size)
    prompt = lm.prompt_embeds(ids, a.tokenizer.spk_emb_id, spk)
    assert torch.equal(prompt[1], spk)  # [spk_emb] is the second position
    codes = torch.randint(0, 625, (6, 4), generator=torch.Generator().manual_seed(0))
    steps = torch.cat([lm.code_embeds(codes[i:i + 1]) for i in range(6)])
    with torch.no_grad():
        ref = hf(inputs_embeds=torch.cat([prompt, steps])[None]).last_hidden_state[0]
        t = len(ids)
        # slot 1 prefilled beside a padded, longer row in slot 0
        other = torch.randn(1, t + 3, cfg.hidden_size)
        batch = torch.zeros(2, t + 3, cfg.hidden_size)
        batch[0], batch[1, :t] = other[0], prompt
        last = lm.prefill(batch, torch.tensor([t + 3, t]), torch.tensor([0, 1]))
        torch.testing.assert_close(last[1], ref[t - 1], atol=1e-5, rtol=1e-5)
        for i in range(6):
            both = torch.stack([codes[(i + 1) % 6], codes[i]])
            hidden = lm.decode(both, torch.tensor([t + 3 + i, t + i]), 64)
            torch.testing.assert_close(hidden[1], ref[t + i], atol=1e-5, rtol=1e-5)
