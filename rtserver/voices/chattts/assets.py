"""Load the ChatTTS LM from the upstream folder layout (Hugging Face ``2Noise/ChatTTS``).

``<root>/asset/`` (or ``<root>`` itself when it is the asset folder) holds:

- ``gpt/config.json``: a Llama config plus ``num_audio_tokens``,
  ``num_text_tokens`` and ``num_vq``; ``gpt/model.safetensors``: the Llama
  body (keys with or without a ``model.`` prefix; ``embed_tokens`` ignored);
- ``Embed.safetensors``: ``emb_text``, ``emb_code.0-3``, ``head_text`` and
  ``head_code.0-3``, the heads under weight-norm parametrizations
  (``parametrizations.weight.original0`` = g ``[out, 1]``, ``original1`` = v
  ``[out, in]``; folded here to ``g * v / ||v||`` per output row, as
  ``torch.nn.utils.parametrizations.weight_norm`` with ``dim=0`` computes it);
- ``tokenizer/tokenizer.json``: the BERT word-piece tokenizer with the
  control tokens (``[Stts]``, ``[spk_emb]``, ``[Ptts]``, ``[uv_break]``...);
- speaker statistics: ``spk_stat.pt`` (older upstream layout) unless the
  config gives upstream's ``spk_stat`` string.

Every shape is checked against the config; a missing file, key or shape is an
``AssetError`` naming the file. The shapes it reads into (``GptConfig``,
``EmbedWeights``) are the torch engine's (``rtserver.voices.chattts.engine.shapes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rtserver.errors import ConfigError
from rtserver.voices.chattts.engine.shapes import EmbedWeights, GptConfig
from rtserver.voices.chattts.speaker import SpeakerStats

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

GPT_CONFIG = "gpt/config.json"
GPT_WEIGHTS = "gpt/model.safetensors"
EMBED = "Embed.safetensors"
TOKENIZER = "tokenizer/tokenizer.json"
SPK_STAT = "spk_stat.pt"

# Control tokens the prompt layout needs (upstream Speaker.decorate_code_prompts).
REQUIRED_TOKENS = ("[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]")


class AssetError(ConfigError):
    """A ChatTTS asset is missing or does not fit; ``path`` names the file."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"ChatTTS asset {path}: {problem}")
        self.path = str(path)


def find_asset_dir(root: str | Path) -> Path:
    """``root/asset`` when it exists, else ``root`` (which must hold ``gpt/``)."""
    base = Path(root)
    if not base.is_dir():
        raise AssetError(base, "folder does not exist")
    asset = base / "asset"
    return asset if asset.is_dir() else base


def read_gpt_config(asset: Path) -> GptConfig:
    path = asset / GPT_CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AssetError(path, "missing") from None
    except (OSError, ValueError) as exc:
        raise AssetError(path, f"unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise AssetError(path, "not a JSON object")
    for key in ("num_audio_tokens", "num_text_tokens", "num_vq", "hidden_size",
                "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key not in data:
            raise AssetError(path, f"has no {key!r}")
    heads = int(data["num_attention_heads"])
    try:
        cfg = GptConfig(
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(data.get("num_key_value_heads") or heads),
            num_hidden_layers=int(data["num_hidden_layers"]),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(data.get("rope_theta", 10000.0)),
            max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
            num_audio_tokens=int(data["num_audio_tokens"]),
            num_text_tokens=int(data["num_text_tokens"]),
            num_vq=int(data["num_vq"]),
        )
    except (TypeError, ValueError) as exc:
        raise AssetError(path, f"bad value: {exc}") from None
    if cfg.hidden_size % heads or heads % cfg.num_key_value_heads:
        raise AssetError(path, "hidden_size / heads / kv heads do not divide")
    if data.get("rope_scaling"):
        raise AssetError(path, "rope_scaling is not supported")
    return cfg


def _open_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise AssetError(path, "missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AssetError(path, f"unreadable: {exc}") from None


def _take(tensors: dict[str, torch.Tensor], key: str, shape: tuple[int, ...],
          path: Path) -> torch.Tensor:
    t = tensors.get(key)
    if t is None:
        raise AssetError(path, f"has no tensor {key!r}")
    if tuple(t.shape) != shape:
        raise AssetError(path, f"{key} has shape {tuple(t.shape)}, the config needs {shape}")
    return t.float()


def gpt_weight_shapes(cfg: GptConfig) -> dict[str, tuple[int, ...]]:
    """Every Llama-body tensor the engine reads, ``layers.N...`` names."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    kv = cfg.num_key_value_heads * d
    out: dict[str, tuple[int, ...]] = {"norm.weight": (h,)}
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        out |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    return out


def load_gpt_weights(asset: Path, cfg: GptConfig) -> dict[str, torch.Tensor]:
    """The Llama body, float32, keyed ``layers.N...``/``norm.weight``, shapes checked."""
    path = asset / GPT_WEIGHTS
    raw = _open_safetensors(path)
    tensors = {k.removeprefix("model."): v for k, v in raw.items()}
    return {k: _take(tensors, k, s, path) for k, s in gpt_weight_shapes(cfg).items()}


def _fold_weight_norm(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, int],
                      path: Path) -> torch.Tensor:
    """``name``'s weight under a weight-norm parametrization (dim 0), folded."""
    g_key = f"{name}.parametrizations.weight.original0"
    v_key = f"{name}.parametrizations.weight.original1"
    if g_key not in tensors and f"{name}.weight" in tensors:  # already folded
        return _take(tensors, f"{name}.weight", shape, path)
    g = _take(tensors, g_key, (shape[0], 1), path)
    v = _take(tensors, v_key, shape, path)
    return g * v / v.norm(dim=1, keepdim=True)


def load_embed(asset: Path, cfg: GptConfig) -> EmbedWeights:
    import torch

    path = asset / EMBED
    t = _open_safetensors(path)
    h, vt, va = cfg.hidden_size, cfg.num_text_tokens, cfg.num_audio_tokens
    return EmbedWeights(
        emb_text=_take(t, "emb_text.weight", (vt, h), path),
        emb_code=torch.stack([_take(t, f"emb_code.{q}.weight", (va, h), path)
                              for q in range(cfg.num_vq)]),
        head_text=_fold_weight_norm(t, "head_text", (vt, h), path),
        head_code=torch.stack([_fold_weight_norm(t, f"head_code.{q}", (va, h), path)
                               for q in range(cfg.num_vq)]),
    )


def load_speaker_stats(asset: Path, dim: int, stat_string: str = "") -> SpeakerStats | None:
    """The model's speaker statistics: ``stat_string`` (upstream ``spk_stat``) if
    given, else ``spk_stat.pt``; None when neither exists."""
    if stat_string:
        try:
            stats = SpeakerStats.from_string(stat_string, "chattts speaker_stats")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        where: Path | str = "chattts speaker_stats"
    else:
        path = asset / SPK_STAT
        if not path.is_file():
            return None
        import torch

        try:
            data: Any = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises assorted unpickling errors
            raise AssetError(path, f"unreadable: {exc}") from None
        if not isinstance(data, torch.Tensor):
            raise AssetError(path, "is not a tensor")
        try:
            stats = SpeakerStats.from_array(data.float().numpy(), str(path))
        except ValueError as exc:
            raise AssetError(path, str(exc)) from None
        where = path
    if stats.dim != dim:
        raise AssetError(where, f"speaker statistics of {stats.dim} dims, the model's "
                                f"hidden size is {dim}")
    if not (np.isfinite(stats.std).all() and np.isfinite(stats.mean).all()):
        raise AssetError(where, "speaker statistics hold non-finite values")
    return stats


class ChatTokenizer:
    """The upstream BERT tokenizer (``tokenizers``), with the prompt's control ids."""

    def __init__(self, asset: Path, cfg: GptConfig) -> None:
        from tokenizers import Tokenizer

        path = asset / TOKENIZER
        if not path.is_file():
            raise AssetError(path, "missing")
        try:
            self._tok: Tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise AssetError(path, f"unreadable: {exc}") from None
        size = self._tok.get_vocab_size(with_added_tokens=True)
        if size > cfg.num_text_tokens:
            raise AssetError(path, f"{size} tokens, more than num_text_tokens "
                                   f"{cfg.num_text_tokens} in {GPT_CONFIG}")
        ids: dict[str, int] = {}
        for tok in REQUIRED_TOKENS:
            tid = self._tok.token_to_id(tok)
            if tid is None:
                raise AssetError(path, f"has no {tok} token")
            ids[tok] = tid
        self.spk_emb_id = ids["[spk_emb]"]
        self.vocab_size = size

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without [CLS]/[SEP] (upstream ``add_special_tokens=False``)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def has_token(self, token: str) -> bool:
        return self._tok.token_to_id(token) is not None

    def token_id(self, token: str) -> int | None:
        tid = self._tok.token_to_id(token)
        return None if tid is None else int(tid)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))


@dataclass(frozen=True)
class LmAssets:
    """Everything the LM side loads: config, weights, tokenizer, speaker stats."""

    asset_dir: Path
    config: GptConfig
    gpt: dict[str, torch.Tensor]
    embed: EmbedWeights
    tokenizer: ChatTokenizer
    speaker_stats: SpeakerStats | None


def load_lm_assets(root: str | Path, *, speaker_stats: str = "") -> LmAssets:
    """Load and check the LM side of a ChatTTS folder (float32 CPU tensors)."""
    asset = find_asset_dir(root)
    cfg = read_gpt_config(asset)
    return LmAssets(asset_dir=asset, config=cfg, gpt=load_gpt_weights(asset, cfg),
                    embed=load_embed(asset, cfg), tokenizer=ChatTokenizer(asset, cfg),
                    speaker_stats=load_speaker_stats(asset, cfg.hidden_size, speaker_stats))
