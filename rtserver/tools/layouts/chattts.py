"""Write a ChatTTS checkpoint in the upstream layout with random weights.

``write_tiny_chattts(root)``: a tiny GPT (tests run it on the CPU in
milliseconds). ``write_tiny_chattts(root, shape="real")``: the real shapes
(20 layers, hidden 768, 12 heads, intermediate 3072, 626 audio ids x 4
codebooks, 21,178 text ids; upstream ``ChatTTS/config/config.py``) with random
weights, for benchmarks: the speed is real, the sound is noise.

Layout (what ``rtserver.voices.chattts.assets`` and upstream ``Chat.load`` read):
``asset/gpt/{config.json,model.safetensors}``, ``asset/Embed.safetensors``
(heads under weight-norm parametrizations), ``asset/tokenizer/`` (a BERT
word-piece ``tokenizer.json`` with the control tokens, plus the two JSON files
transformers' ``BertTokenizerFast`` wants), ``asset/spk_stat.pt``, and, from
chattts-dec's writer, ``asset/{Decoder,DVAE,Vocos}.safetensors``. With
``spk_stat_file=False`` the folder holds exactly ``UPSTREAM_FILES``, the files
upstream 0.2.5 downloads (its ``res/sha256_map.json``): upstream keeps the
speaker statistics in its package config (``Config.spk_stat``), and
``tiny_speaker_stats`` gives the string that goes there.

The tokenizer is ours, not upstream's: letters, digits, punctuation and a few
hundred common CJK characters, so its ids are not upstream's ids. The real
shape pads the text vocabulary to upstream's size.

Run: ``python -m rtserver.tools.layouts.chattts OUT_DIR [--shape real]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from rtserver.voices.chattts.assets import GptConfig

# The control tokens upstream's tokenizer adds to its BERT vocabulary.
CONTROL_TOKENS: tuple[str, ...] = (
    "[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]", "[Sbreak]", "[Pbreak]", "[Ebreak]",
    "[uv_break]", "[v_break]", "[lbreak]", "[laugh]", "[music]",
    *(f"[speed_{i}]" for i in range(10)), *(f"[oral_{i}]" for i in range(10)),
    *(f"[laugh_{i}]" for i in range(3)), *(f"[break_{i}]" for i in range(8)),
)

# What upstream 0.2.5 downloads into asset/ (ChatTTS/res/sha256_map.json), no more.
UPSTREAM_FILES: tuple[str, ...] = (
    "Decoder.safetensors", "DVAE.safetensors", "Embed.safetensors", "Vocos.safetensors",
    "gpt/config.json", "gpt/model.safetensors", "tokenizer/special_tokens_map.json",
    "tokenizer/tokenizer_config.json", "tokenizer/tokenizer.json",
)

TINY = GptConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                 num_key_value_heads=4, num_hidden_layers=2, max_position_embeddings=1024,
                 num_audio_tokens=626, num_text_tokens=0, num_vq=4)
REAL = GptConfig()  # upstream config.GPT


def _word_pieces() -> list[str]:
    base = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789")
    punct = list(",.!?;:'\"-()，。、！？；：")
    # common CJK characters (one word piece each, as BERT splits CJK per character)
    cjk = [chr(c) for c in range(0x4E00, 0x4E00 + 256)]
    cjk += list("你好我们是的在有这个中国人说话今天天气很好谢谢")
    pieces = base + chars + [f"##{c}" for c in chars] + punct + cjk
    seen: set[str] = set()
    return [p for p in pieces if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def _write_tokenizer(folder: Path) -> int:
    """A BERT-style ``tokenizer.json`` (+ configs); returns its size with added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {p: i for i, p in enumerate(_word_pieces())}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in CONTROL_TOKENS])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                "cls_token": "[CLS]", "mask_token": "[MASK]"}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True,
         "tokenize_chinese_chars": True, "model_max_length": 512, **specials}),
        encoding="utf-8")
    return int(tok.get_vocab_size(with_added_tokens=True))


def _config_json(cfg: GptConfig) -> dict[str, object]:
    # What transformers' LlamaConfig reads, plus upstream's custom keys.
    return {"architectures": ["LlamaModel"], "model_type": "llama",
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "num_hidden_layers": cfg.num_hidden_layers, "hidden_act": "silu",
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "use_cache": False, "torch_dtype": "float32",
            "spk_emb_dim": 192, "spk_KL": False,
            "num_audio_tokens": cfg.num_audio_tokens, "num_text_tokens": cfg.num_text_tokens,
            "num_vq": cfg.num_vq}


def _gpt_tensors(cfg: GptConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    from rtserver.voices.chattts.assets import gpt_weight_shapes

    out: dict[str, torch.Tensor] = {}
    for name, shape in gpt_weight_shapes(cfg).items():
        if len(shape) == 1:  # RMSNorm weights near one
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:  # fan-in scaled, so activations stay O(1) through the layers
            out[name] = torch.randn(shape, generator=gen) / shape[1] ** 0.5
    return out


def _weight_norm(name: str, shape: tuple[int, int], gen: torch.Generator,
                 scale: float) -> dict[str, torch.Tensor]:
    v = torch.randn(shape, generator=gen)
    g = scale * (1.0 + 0.1 * torch.rand((shape[0], 1), generator=gen))
    return {f"{name}.parametrizations.weight.original0": g,
            f"{name}.parametrizations.weight.original1": v}


def _embed_tensors(cfg: GptConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h = cfg.hidden_size
    out = {"emb_text.weight": torch.randn((cfg.num_text_tokens, h), generator=gen) * 0.5}
    for q in range(cfg.num_vq):
        out[f"emb_code.{q}.weight"] = torch.randn((cfg.num_audio_tokens, h),
                                                  generator=gen) * 0.5
    # Logit scale: row norm g. A few units keep sampling at temperature 0.3
    # varied rather than argmax-only, and EOS (id 625) rare but possible.
    out |= _weight_norm("head_text", (cfg.num_text_tokens, h), gen, 3.0)
    for q in range(cfg.num_vq):
        out |= _weight_norm(f"head_code.{q}", (cfg.num_audio_tokens, h), gen, 3.0)
    return out


def _speaker_stats(cfg: GptConfig, gen: torch.Generator) -> torch.Tensor:
    """Float16 ``[std; mean]`` (drawn after the GPT and Embed tensors)."""
    std = 0.5 + 0.5 * torch.rand(cfg.hidden_size, generator=gen)
    mean = 0.2 * torch.randn(cfg.hidden_size, generator=gen)
    return torch.cat([std, mean]).half()


def write_tiny_chattts(root: str | Path, *, shape: str = "tiny", seed: int = 0,
                       decoder: bool = True, spk_stat_file: bool = True) -> Path:
    """Write the layout under ``root/asset``; returns ``root``.

    ``shape``: "tiny" or "real". ``decoder``: also write Decoder/DVAE/Vocos
    with chattts-dec's writer (the LM alone does not need them).
    ``spk_stat_file``: also write ``asset/spk_stat.pt`` (the older layout);
    without it (and with ``decoder``) the folder is exactly ``UPSTREAM_FILES``.
    """
    if shape not in ("tiny", "real"):
        raise ValueError(f"shape {shape!r}: 'tiny' or 'real'")
    root = Path(root)
    asset = root / "asset"
    text_vocab = _write_tokenizer(asset / "tokenizer")
    base = TINY if shape == "tiny" else REAL
    if shape == "tiny":
        from dataclasses import replace

        base = replace(base, num_text_tokens=text_vocab)
    elif text_vocab > base.num_text_tokens:
        raise ValueError("tokenizer larger than upstream's text vocabulary")
    gen = torch.Generator().manual_seed(seed)
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    (asset / "gpt" / "config.json").write_text(json.dumps(_config_json(base), indent=1),
                                               encoding="utf-8")
    save_file(_gpt_tensors(base, gen), str(asset / "gpt" / "model.safetensors"))
    save_file(_embed_tensors(base, gen), str(asset / "Embed.safetensors"))
    # speaker statistics [std; mean] (the older upstream file layout)
    stats = _speaker_stats(base, gen)
    if spk_stat_file:
        torch.save(stats, str(asset / "spk_stat.pt"))
    if decoder:
        from rtserver.tools.layouts import chattts_decoder as dec

        if shape == "tiny":
            dec.write_tiny_decoder_assets(root, gpt_hidden=base.hidden_size, seed=seed)
        else:
            dec.write_real_shape_decoder_assets(root, seed=seed)
    return root


def tiny_speaker_stats(root: str | Path, *, seed: int = 0) -> str:
    """The speaker statistics ``write_tiny_chattts(root, seed=seed)`` draws, as
    upstream's ``Config.spk_stat`` string (base16384 of float16 ``[std; mean]``),
    for a folder written with ``spk_stat_file=False``. Replays the writer's
    generator over the tensor shapes the folder's ``gpt/config.json`` gives."""
    import pybase16384 as b14

    from rtserver.voices.chattts.assets import read_gpt_config

    cfg = read_gpt_config(Path(root) / "asset")
    gen = torch.Generator().manual_seed(seed)
    _gpt_tensors(cfg, gen)
    _embed_tensors(cfg, gen)
    return str(b14.encode_to_string(_speaker_stats(cfg, gen).numpy().tobytes()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=("tiny", "real"), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-decoder", action="store_true",
                    help="only the LM side (gpt, Embed, tokenizer, speaker statistics)")
    args = ap.parse_args()
    write_tiny_chattts(args.out, shape=args.shape, seed=args.seed, decoder=not args.no_decoder)
    print(args.out)


if __name__ == "__main__":
    main()
