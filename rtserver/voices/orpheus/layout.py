"""Write an Orpheus-layout HF Llama folder: config.json, tokenizer.json, weights.

The layout is the upstream checkpoint's (canopylabs/orpheus-3b-0.1-ft):
``config.json`` (LlamaForCausalLM), ``generation_config.json``,
``tokenizer.json`` (+ ``tokenizer_config.json``, ``special_tokens_map.json``)
and ``model.safetensors``. Shapes:

- ``"3b"``: Orpheus-3B (Llama 3.2 3B): hidden 3072, 28 layers, 24 heads, 8 KV
  heads, head_dim 128, intermediate 8192, vocab 156940, rope theta 500000 with
  llama3 rope scaling (factor 32, low/high freq factor 1/4, original 8192),
  tied embeddings. Config only: run it with vLLM ``load_format="dummy"``.
- ``"tiny"``: the same vocabulary and rope, 2 layers of width 64 (2 heads of 32:
  the smallest head vLLM's CPU attention takes), for CPU tests.

The tokenizer is a small byte-level BPE trained here with ``tokenizers`` on a
fixed English text, plus the ids that matter at their real positions:
``<|begin_of_text|>`` 128000 (prepended by the post-processor, as Llama 3's),
``<|end_of_text|>`` 128001, ``<|eot_id|>`` 128009, ``<custom_token_N>`` at
128256 + N and ``<|audio|>`` at 156939. Text ids differ from the real
tokenizer's; every id Orpheus' prompt and audio layout uses is the same.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rtserver.voices.orpheus.codes import (
    AUDIO_PLACEHOLDER,
    BEGIN_OF_TEXT,
    END_OF_SPEECH,
    END_OF_TEXT,
    LLAMA3_VOCAB,
    NUM_CUSTOM_TOKENS,
    PAD_TOKEN,
    VOCAB_SIZE,
)

Shape = Literal["tiny", "3b"]

_ROPE_SCALING = {  # Llama 3.2 / Orpheus-3B config.json
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

_SHAPES: dict[str, dict[str, int]] = {
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
           "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
}

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello there, how are you today? "
    "I went to the market this morning and bought some apples, bread and cheese. "
    "It is a truth universally acknowledged that a single sentence needs a voice. "
    "Streaming speech should start quickly, and it should never stop to think. "
    "One, two, three, four, five, six, seven, eight, nine, ten. Yes! No? Maybe... "
)


def llama_config(shape: Shape = "tiny") -> dict[str, Any]:
    """``config.json`` of an Orpheus checkpoint of the given shape."""
    if shape not in _SHAPES:
        raise ValueError(f"unknown shape {shape!r}: 'tiny' or '3b'")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_SHAPES[shape],
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": dict(_ROPE_SCALING),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "tie_word_embeddings": True,
        "bos_token_id": BEGIN_OF_TEXT,
        "eos_token_id": END_OF_TEXT,
        "pad_token_id": PAD_TOKEN,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


_LLAMA3_SPECIALS = {  # Llama 3 tokenizer.json names of the specials Orpheus touches
    BEGIN_OF_TEXT: "<|begin_of_text|>",
    BEGIN_OF_TEXT + 1: "<|end_of_text|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    END_OF_TEXT: "<|eot_id|>",
}


def _added(token_id: int, content: str) -> dict[str, Any]:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def tokenizer_json() -> str:
    """A ``tokenizer.json`` with Orpheus' special ids (see module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    data = json.loads(tok.to_str())
    # tokenizers numbers added tokens right after the model's vocabulary, so the
    # BPE vocabulary is padded with unreachable entries up to 128000, as big as
    # Llama 3's, and the added tokens then follow at their real ids.
    vocab: dict[str, int] = data["model"]["vocab"]
    for i in range(len(vocab), BEGIN_OF_TEXT):
        vocab[f"<|unused_{i}|>"] = i
    added = [_added(i, _LLAMA3_SPECIALS.get(i, f"<|reserved_special_token_{i - 128000}|>"))
             for i in range(BEGIN_OF_TEXT, LLAMA3_VOCAB)]
    added += [_added(LLAMA3_VOCAB + n, f"<custom_token_{n}>") for n in range(NUM_CUSTOM_TOKENS)]
    added.append(_added(AUDIO_PLACEHOLDER, "<|audio|>"))
    data["added_tokens"] = added
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                 "ids": [BEGIN_OF_TEXT],
                                                 "tokens": ["<|begin_of_text|>"]}},
    }
    return json.dumps(data, ensure_ascii=False)


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of an Orpheus (Llama, tied embeddings)
    checkpoint; 1-D ones are the RMSNorm weights."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    hd = config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], h),
                                          "model.norm.weight": (h,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes


def _weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random float16 weights (std 0.02), norms at one."""
    rng = np.random.default_rng(seed)
    return {name: (np.ones(shape, dtype=np.float16) if len(shape) == 1 else
                   (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))
            for name, shape in tensor_shapes(config).items()}


def write_tiny_orpheus(directory: str | Path, *, shape: Shape = "tiny",
                       with_weights: bool = False, seed: int = 0) -> Path:
    """Write the folder; returns its path.

    ``with_weights``: random float16 ``model.safetensors`` (tiny shape only; the
    3B shape is meant for ``load_format="dummy"``). Without weights the folder
    loads only with vLLM's dummy loader.
    """
    if with_weights and shape != "tiny":
        raise ValueError("weights are written for the tiny shape only; "
                         "use load_format='dummy' for 3b")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = llama_config(shape)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": BEGIN_OF_TEXT, "eos_token_id": [END_OF_SPEECH],
        "do_sample": True, "temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.3,
    }, indent=2), encoding="utf-8")
    (out / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "model_max_length": 131072, "clean_up_tokenization_spaces":
        True}, indent=2), encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, indent=2),
        encoding="utf-8")
    if with_weights:
        from safetensors.numpy import save_file

        save_file(_weights(config, seed), str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    return out


# Spread of the audio logits in ``write_random_orpheus``: the final RMSNorm
# leaves |h| ~ sqrt(hidden) (55 at 3072), so with audio rows of std 0.02 * gain
# an audio logit is ~N(0, (sqrt(hidden) * 0.02 * gain)^2); gain is set so that
# is N(0, 11^2) (gain 9.9 at 3B). The best of 28,672 audio logits (~4 sigma,
# ~45) then outweighs all 128,268 other tokens by e^60 at
# temperature 0.6: the model writes audio tokens and nothing else (the other
# tokens' logits, ~N(0, 1.1^2), stay below ~6).
AUDIO_LOGIT_STD = 11.0


def write_random_orpheus(directory: str | Path, *, shape: Shape = "3b", seed: int = 0,
                         device: str | None = None) -> Path:
    """An Orpheus folder with random bfloat16 weights that write audio tokens only.

    For benchmarks of the real shapes through vLLM's normal loader without a
    logits mask (which would force vLLM's slower V1 model runner): the rows of
    the tied embedding / LM head of the 28,672 audio tokens are scaled up (see
    ``AUDIO_LOGIT_STD``); every other token's logit stays ~N(0, 1.1^2).
    End-of-speech is never sampled (like ``load_format="dummy"``, speech never
    ends: the token budget ends it). Slots are random: a stream of them needs
    the voice's ``wrong_slot="reslot"``. Speed is real, the sound is noise.
    Generated with torch (on the GPU when there is one: seconds for 3B).
    """
    import torch
    from safetensors.torch import save_file

    from rtserver.voices.orpheus.codes import AUDIO_TOKENS_END, AUDIO_TOKENS_START

    out = write_tiny_orpheus(directory, shape=shape, with_weights=False, seed=seed)
    config = llama_config(shape)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, dims in tensor_shapes(config).items():
        if len(dims) == 1:
            tensors[name] = torch.ones(dims, dtype=torch.bfloat16)
        else:
            x = torch.randn(dims, generator=gen, device=dev, dtype=torch.float32) * 0.02
            tensors[name] = x.to(torch.bfloat16).cpu()
    h = config["hidden_size"]
    gain = AUDIO_LOGIT_STD / (math.sqrt(h) * 0.02)
    tensors["model.embed_tokens.weight"][AUDIO_TOKENS_START:AUDIO_TOKENS_END] *= gain
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="Write an Orpheus-layout HF Llama folder.")
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=["tiny", "3b"], default="tiny")
    p.add_argument("--weights", choices=["none", "random", "audio-biased"], default="none",
                   help="none: config only (vLLM load_format=dummy); random: float16 "
                        "(tiny only); audio-biased: write_random_orpheus")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.weights == "audio-biased":
        print(write_random_orpheus(a.out, shape=a.shape, seed=a.seed))
    else:
        print(write_tiny_orpheus(a.out, shape=a.shape, with_weights=a.weights == "random",
                                 seed=a.seed))


if __name__ == "__main__":
    main()
