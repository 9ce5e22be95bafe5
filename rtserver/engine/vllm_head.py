"""A Llama whose logits cover only its head: the ids a speech model may write
(``engine/head_vocab.py``), renumbered ``0 .. K-1``.

vLLM's ``LlamaForCausalLM`` with two changes, selected through
``hf_overrides`` (``architectures`` = ``RtserverHeadLlamaForCausalLM``, the
head's ``rtserver_head_ranges`` in old ids):

- ``load_weights`` reorders the rows of the embedding (and of an untied
  ``lm_head``) into the head-first numbering, so every id the engine sends is
  in that numbering;
- ``compute_logits`` multiplies by the first K rows only: the logits are
  ``[tokens, K]`` and vLLM's sampler (penalties, temperature, top-k/top-p,
  sampling) reads K columns instead of the whole vocabulary.

vLLM's V2 model runner sizes the prompt's penalty bins by the model's whole
vocabulary, so a prompt's ids past K are counted and the penalties touch the
head's K columns; the V1 runner (vLLM on the CPU, or with a custom logits
processor) bins the prompt by the logits' width, so a repetition penalty
there would index past it: the model refuses V1 unless the engine vouches
that no request uses penalties (``rtserver_head_allow_v1``).
Tensor parallel, LoRA and a quantized embedding are refused: each changes
how the head's rows are laid out or used.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
from vllm.model_executor.models.llama import LlamaForCausalLM

from rtserver.engine.head_vocab import vocab_order
from rtserver.engine.vllm_plugin import HF_HEAD_ALLOW_V1, HF_HEAD_RANGES

_REORDERED = ("model.embed_tokens.weight", "lm_head.weight")


class HeadLlamaForCausalLM(LlamaForCausalLM):
    """Llama with logits for its head's ids only (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        config = self.config
        ranges = getattr(config, HF_HEAD_RANGES, None)
        if not ranges:
            raise ValueError(f"{type(self).__name__} needs hf_overrides {HF_HEAD_RANGES}")
        order = vocab_order(ranges, int(config.vocab_size))
        self.head_size = sum(int(hi) - int(lo) for lo, hi in ranges)
        self._order = torch.from_numpy(order)
        if get_tensor_model_parallel_world_size() != 1:
            raise ValueError("the head model runs with tensor_parallel_size 1 only")
        if vllm_config.lora_config is not None:
            raise ValueError("the head model runs without LoRA")
        if not isinstance(self.lm_head.quant_method, UnquantizedEmbeddingMethod):
            raise ValueError("the head model needs an unquantized embedding / lm_head")
        if not vllm_config.use_v2_model_runner and not getattr(config, HF_HEAD_ALLOW_V1, False):
            raise ValueError("the head model needs vLLM's V2 model runner (Triton): its V1 "
                             "runner's penalties index a prompt's ids past the head")
        self._scale = float(getattr(config, "logit_scale", 1.0))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        weight = self.lm_head.weight
        assert isinstance(weight, torch.Tensor)
        logits = F.linear(hidden_states, weight[: self.head_size])
        return logits * self._scale if self._scale != 1.0 else logits

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.compute_logits(hidden_states)
        assert logits is not None
        return logits.argmax(dim=-1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._reordered(weights))

    def _reordered(self, weights: Iterable[tuple[str, torch.Tensor]]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if name in _REORDERED:
                if tensor.shape[0] != self._order.numel():
                    raise ValueError(f"{name} has {tensor.shape[0]} rows; the config's "
                                     f"vocab_size is {self._order.numel()}")
                tensor = tensor[self._order.to(tensor.device)]
            yield name, tensor
