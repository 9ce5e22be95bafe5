"""What the torch engine's ChatTTS LM is made of: its shape (``GptConfig``,
upstream ``ChatTTS/config/config.py``'s GPT) and its embedding tables and heads
(``EmbedWeights``). The loader (``rtserver.voices.chattts.assets``) fills them
from the upstream files; the engine's forward (``model``) reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class GptConfig:
    """The shape of the ChatTTS GPT (upstream ``config.GPT`` defaults)."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    num_hidden_layers: int = 20
    rms_norm_eps: float = 1e-6  # transformers LlamaConfig default
    rope_theta: float = 10000.0  # transformers LlamaConfig default
    max_position_embeddings: int = 4096
    num_audio_tokens: int = 626
    num_text_tokens: int = 21178
    num_vq: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_id(self) -> int:
        """Upstream ``num_code = num_audio_tokens - 1`` ends the audio."""
        return self.num_audio_tokens - 1


@dataclass(frozen=True)
class EmbedWeights:
    emb_text: torch.Tensor  # [text vocab, hidden]
    emb_code: torch.Tensor  # [num_vq, audio vocab, hidden]
    head_text: torch.Tensor  # [text vocab, hidden]
    head_code: torch.Tensor  # [num_vq, audio vocab, hidden]
