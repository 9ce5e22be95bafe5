"""Prompt, speakers and GPT logits: rtserver against upstream ChatTTS 0.2.5 on
the same checkpoint (tests/parity/conftest.py).

Tolerances:

- prompt ids and speaker vectors: equal (integers; float16 values whose
  arithmetic is the same ops in the same dtype);
- GPT logits, float32 on both sides: max |rtserver - upstream| over 32 steps
  x 4 codebooks x 626 ids <= ``LOGIT_ATOL`` = 1e-4 + 1e-5 x max |logit|.
  Both run the same Llama arithmetic in float32 but not the same kernels
  (transformers' attention and separate q/k/v, gate/up matmuls against
  rtserver's fused ones and a static-cache decode), so they differ by
  float32 rounding, which grows with depth and logit size. Measured: hidden
  states bit-equal, logits 2.9e-6 (the heads: rtserver folds the weight norm
  once, upstream recomputes it), two orders under the bound; the final norm's
  weight x1.001 moves them by 1e-2, a float32 speaker normalisation instead
  of upstream's float16 one by 1.2e-3.
"""

from __future__ import annotations

from typing import Any

import ChatTTS
import numpy as np
import pytest
import torch

from rtserver.voices.chattts import text as ct
from rtserver.voices.chattts.engine.model import ChatLM
from rtserver.voices.chattts.speaker import SpeakerStats, decode_speaker, encode_speaker, normalised

from .conftest import Pair

STEPS = 32
PROMPT_TEXTS = [
    "hello world, this is a test.",
    "[uv_break]we said hi [laugh] and left.[lbreak]",
    "你好，我们是中国人。今天天气很好[uv_break]谢谢",
    "mixed 你好 text 123 with [speed_2] inside",
    "[Stts]tokens the prompt [spk_emb]must not hold[Ptts]",
    "   spaces   around   ",
]


def upstream_prompt_ids(pair: Pair, text: str, speaker: bool) -> list[int]:
    chat = pair.chat
    spk = chat.sample_random_speaker() if speaker else None
    decorated = chat.speaker.decorate_code_prompts([text], "[speed_5]", None, spk)
    ids, _mask, _text_mask = chat.tokenizer.encode(decorated, chat.config.gpt.num_vq)
    return [int(i) for i in ids[0, :, 0]]


@pytest.mark.parametrize("speaker", [True, False])
@pytest.mark.parametrize("text", PROMPT_TEXTS)
def test_prompt_ids_equal(pair: Pair, text: str, speaker: bool) -> None:
    ours = pair.lm.tokenizer.encode(ct.code_prompt(text, prompt=ct.speed_prompt(5),
                                                   speaker=speaker))
    assert ours == upstream_prompt_ids(pair, text, speaker)


def test_speaker_strings_decode_to_the_same_vector(pair: Pair) -> None:
    h = pair.lm.config.hidden_size
    for seed in range(5):
        torch.manual_seed(seed)
        s = pair.chat.sample_random_speaker()
        up = pair.chat.speaker._decode(s)
        np.testing.assert_array_equal(decode_speaker(s, h), up.astype(np.float32))
        # and our encoder's string decodes upstream to the same vector
        np.testing.assert_array_equal(pair.chat.speaker._decode(encode_speaker(up)), up)


def test_seeded_speakers_are_upstreams_seeded_speakers(pair: Pair) -> None:
    """``seed_N`` is what ``torch.manual_seed(N); chat.sample_random_speaker()``
    gives upstream, from upstream's statistics string."""
    stats = pair.lm.speaker_stats
    assert stats is not None
    np.testing.assert_array_equal(stats.std, pair.chat.speaker.std.float().numpy())
    np.testing.assert_array_equal(stats.mean, pair.chat.speaker.mean.float().numpy())
    for seed in (0, 1, 2, 1234):
        torch.manual_seed(seed)
        up = pair.chat.speaker._decode(pair.chat.sample_random_speaker())
        np.testing.assert_array_equal(stats.sample(seed), up.astype(np.float32))


def test_real_speaker_statistics_string_reads_the_same() -> None:
    """Upstream's own ``Config.spk_stat`` (the real model's, 768 dims), which
    the real download does not hold: read by rtserver as upstream reads it."""
    from ChatTTS.config.config import Config
    from ChatTTS.model.speaker import Speaker

    cfg = Config()
    up = Speaker(cfg.gpt.hidden_size, cfg.spk_stat)
    ours = SpeakerStats.from_string(cfg.spk_stat, "upstream spk_stat")
    assert ours.dim == cfg.gpt.hidden_size == 768
    np.testing.assert_array_equal(ours.std, up.std.float().numpy())
    np.testing.assert_array_equal(ours.mean, up.mean.float().numpy())
    torch.manual_seed(11)
    want = up._sample_random().float().numpy()
    np.testing.assert_array_equal(ours.sample(11), want)


def upstream_generate(pair: Pair, text: str, spk: str, seed: int) -> dict[str, Any]:
    """Upstream's ``_infer_code`` for ``STEPS`` steps, with the head outputs
    (the raw code logits of every step) captured by forward hooks."""
    chat = pair.chat
    captured: list[list[torch.Tensor]] = [[] for _ in range(chat.config.gpt.num_vq)]
    hooks = [chat.embed.head_code[q].register_forward_hook(
        lambda _m, _i, out, q=q: captured[q].append(out[0, -1].detach().clone()))
        for q in range(chat.config.gpt.num_vq)]
    params = ChatTTS.Chat.InferCodeParams(
        spk_emb=spk, manual_seed=seed, max_new_token=STEPS, min_new_token=STEPS,
        show_tqdm=False, ensure_non_empty=False)
    try:
        res = list(chat._infer_code([text], False, chat.device, True, params))[-1]
    finally:
        for h in hooks:
            h.remove()
    logits = torch.stack([torch.stack(c) for c in captured], dim=1)  # [steps, vq, vocab]
    return {"codes": res.ids[0], "hidden": res.hiddens[0], "logits": logits}


def rtserver_teacher_forced(pair: Pair, text: str, spk: str, codes: torch.Tensor,
                            dtype: torch.dtype = torch.float32
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """ChatLM's logits and hidden states for upstream's prompt, fed upstream's codes."""
    lm = pair.lm
    ids = torch.tensor(lm.tokenizer.encode(ct.code_prompt(text, prompt=ct.speed_prompt(5))))
    t = len(ids)
    model = ChatLM(lm.config, lm.gpt, lm.embed, slots=1, max_len=t + STEPS + 1,
                   device="cpu", dtype=dtype)
    vec = torch.from_numpy(normalised(decode_speaker(spk, lm.config.hidden_size)))
    emb = model.prompt_embeds(ids, lm.tokenizer.spk_emb_id, vec)
    hidden = [model.prefill(emb[None], torch.tensor([t]), torch.tensor([0]))[0]]
    for i in range(STEPS - 1):
        hidden.append(model.decode(codes[i][None].long(), torch.tensor([t + i]), t + i + 1)[0])
    h = torch.stack(hidden)
    return model.code_logits(h), h


@pytest.fixture(scope="module")
def generated(pair: Pair) -> dict[str, Any]:
    torch.manual_seed(5)
    spk = pair.chat.sample_random_speaker()
    text = "hello world, 你好 [uv_break] this is a test."
    up = upstream_generate(pair, text, spk, seed=17)
    logits, hidden = rtserver_teacher_forced(pair, text, spk, up["codes"])
    return {"up": up, "logits": logits, "hidden": hidden, "spk": spk, "text": text}


def logit_atol(ref: torch.Tensor) -> float:
    return 1e-4 + 1e-5 * float(ref.abs().max())


def test_gpt_logits_of_32_steps_equal_in_float32(generated: dict[str, Any]) -> None:
    up = generated["up"]
    assert up["codes"].shape == (STEPS, 4) and up["logits"].shape == (STEPS, 4, 626)
    diff = float((generated["logits"] - up["logits"]).abs().max())
    hdiff = float((generated["hidden"] - up["hidden"]).abs().max())
    print(f"\nGPT logits, 32 steps: max |diff| {diff:.3g} (max |logit| "
          f"{float(up['logits'].abs().max()):.3g}, atol {logit_atol(up['logits']):.3g}); "
          f"hidden max |diff| {hdiff:.3g}")
    assert diff <= logit_atol(up["logits"])
    assert hdiff <= 1e-4 + 1e-5 * float(up["hidden"].abs().max())


def test_refine_text_logits_equal_in_float32(pair: Pair) -> None:
    """The refine-text pass (``Chat._refine_text``): text logits of 16 steps,
    upstream's ``head_text`` (captured) vs ChatLM's text lane fed upstream's
    ids, with its own KV cache. Tolerance as for the code logits."""
    chat, lm = pair.chat, pair.lm
    steps = 16
    text = "hello world, 你好 this is a test."
    captured: list[torch.Tensor] = []
    hook = chat.embed.head_text.register_forward_hook(
        lambda _m, _i, out: captured.append(out[0, -1].detach().clone()))
    params = ChatTTS.Chat.RefineTextParams(manual_seed=4, max_new_token=steps,
                                           min_new_token=steps, show_tqdm=False,
                                           ensure_non_empty=False)
    try:
        res = chat._refine_text(text, chat.device, params)
    finally:
        hook.remove()
    up_ids, up_logits = res.ids[0], torch.stack(captured)
    assert len(up_ids) == steps and up_logits.shape == (steps, lm.config.num_text_tokens)

    ids = torch.tensor(lm.tokenizer.encode(ct.refine_prompt(text)))
    t = len(ids)
    model = ChatLM(lm.config, lm.gpt, lm.embed, slots=1, max_len=t + steps + 1,
                   device="cpu", dtype=torch.float32)
    cache = model.text_cache(1, t + steps + 1)
    hidden = [model.prefill(model.prompt_embeds(ids)[None], torch.tensor([t]),
                            torch.tensor([0]), cache=cache)[0]]
    for i in range(steps - 1):
        x0 = model.emb_text[up_ids[i].long()][None]
        hidden.append(model.decode_embeds(x0, torch.tensor([t + i]), t + i + 1, cache)[0])
    ours = model.text_logits(torch.stack(hidden))[:, 0]
    diff = float((ours - up_logits).abs().max())
    print(f"\nrefine text logits, {steps} steps: max |diff| {diff:.3g} "
          f"(max |logit| {float(up_logits.abs().max()):.3g})")
    assert diff <= logit_atol(up_logits)
