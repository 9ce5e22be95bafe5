"""The ChatTTS GPT forward over a static KV cache of slots (torch, no Hugging Face).

A Llama body (RMSNorm, rotary positions, SiLU-gated MLP; transformers'
``LlamaModel`` arithmetic: norms in float32, rotary tables in float32) with
ChatTTS' embeddings around it: the prompt is text embeddings (a speaker
vector in place of ``[spk_emb]``), each later input the sum of the four
codebook embeddings of the step before; the output is the final-norm hidden
state and four code heads (float32, as upstream runs its heads).

The KV cache is one preallocated tensor per K and V, ``[layers, slots + 1,
kv_heads, max_len + 1, head_dim]``: a request owns a slot from prefill to its
end. Decode runs rows ``0..B-1`` = slots ``0..B-1`` (the scheduler keeps the
decoding requests there) and attends over the first ``L`` positions (a length
bucket), so a CUDA graph per ``(B, L)`` covers every step. Slot ``slots`` and
position ``max_len`` are scratch: padded rows of a graph write there, never
into a request's positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rtserver.engine.triton_usable import triton_usable
from rtserver.voices.chattts.engine.attention import decode_attention, interpreted
from rtserver.voices.chattts.engine.shapes import EmbedWeights, GptConfig


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: torch.Tensor  # [q + k + v, hidden]
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor


ATTENTIONS = ("auto", "sdpa", "triton")


def resolve_attention(attention: str, device: torch.device,
                      usable: Callable[[torch.device], bool] = triton_usable) -> str:
    """``"auto"`` as ``"triton"`` where ``usable`` (``triton_usable``: CUDA,
    sm_80 or newer, Triton imports), else ``"sdpa"`` (an H100 at 640 streams
    through the server: 0 of ~1,480 contexts underran with it against 40 of
    ~1,455 with SDPA, and 7.0 against 8.5 ms of GPU a step at 512 rows alone:
    ``bench/results/h100-2026-12-07-s29``); ``ValueError`` for a name not in
    ``ATTENTIONS`` or ``"triton"`` where it cannot run."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention {attention!r}: one of {', '.join(ATTENTIONS)}")
    if attention == "auto":
        return "triton" if usable(device) else "sdpa"
    if attention == "triton" and device.type != "cuda" and not interpreted():
        raise ValueError("triton decode attention runs on CUDA (or under TRITON_INTERPRET=1)")
    return attention


class ChatLM:
    """Weights on one device/dtype, the slot KV cache, and the forward passes."""

    def __init__(self, cfg: GptConfig, gpt: dict[str, torch.Tensor], embed: EmbedWeights, *,
                 slots: int, max_len: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, attention: str = "auto") -> None:
        self.cfg = cfg
        self.slots = slots
        self.max_len = max_len
        self.device = torch.device(device)
        self.dtype = dtype
        dev = self.device
        # a decode step's attention: "sdpa" (dense up to the step's length bucket,
        # masked), "triton" (each row's own positions only: ``attention.py``; CUDA,
        # or CPU tensors under Triton's interpreter) or "auto" (``resolve_attention``)
        self.attention = resolve_attention(attention, dev)

        def w(name: str) -> torch.Tensor:
            return gpt[name].to(dev, dtype)

        self.layers: list[_Layer] = []
        for n in range(cfg.num_hidden_layers):
            p = f"layers.{n}."
            self.layers.append(_Layer(
                ln1=gpt[p + "input_layernorm.weight"].to(dev, dtype),
                qkv=torch.cat([w(p + "self_attn.q_proj.weight"), w(p + "self_attn.k_proj.weight"),
                               w(p + "self_attn.v_proj.weight")]).contiguous(),
                o=w(p + "self_attn.o_proj.weight"),
                ln2=gpt[p + "post_attention_layernorm.weight"].to(dev, dtype),
                gate_up=torch.cat([w(p + "mlp.gate_proj.weight"),
                                   w(p + "mlp.up_proj.weight")]).contiguous(),
                down=w(p + "mlp.down_proj.weight")))
        self.norm = gpt["norm.weight"].to(dev, dtype)
        self.emb_text = embed.emb_text.to(dev, dtype)
        self.emb_code = embed.emb_code.to(dev, dtype)  # [vq, audio, hidden]
        # heads in float32, as upstream (its Embed module stays float32)
        self.head_code = embed.head_code.to(dev, torch.float32)  # [vq, audio, hidden]
        self.head_text = embed.head_text.to(dev, torch.float32)
        d = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(max_len + 1, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        # [max_len + 1, head_dim]: computed in float32 and cast to the model's
        # dtype (as transformers' rotary embedding), the sine's first half
        # negated so that ``_rotate`` needs no negation (x * -s == -x * s)
        half = d // 2
        self.cos = emb.cos().to(dev, dtype)
        self.signed_sin = torch.cat([-emb[:, :half].sin(), emb[:, half:].sin()], dim=-1
                                    ).to(dev, dtype)
        # slot ``slots`` and position ``max_len``: scratch (see the module docstring)
        shape = (cfg.num_hidden_layers, slots + 1, cfg.num_key_value_heads, max_len + 1, d)
        self.k_cache = torch.zeros(shape, device=dev, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=dev, dtype=dtype)
        self._q = cfg.num_attention_heads * d
        self._kv = cfg.num_key_value_heads * d
        self._vq_index = torch.arange(cfg.num_vq, device=dev)

    # --- pieces -------------------------------------------------------------

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """transformers ``apply_rotary_pos_emb``: x * cos + rotate_half(x) * sin,
        with rotate_half(x) * sin as roll(x) * signed_sin (``signed_sin``)."""
        return (x * cos) + (x.roll(x.shape[-1] // 2, dims=-1) * signed_sin)

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` ``[n, T, hidden]`` -> q, k, v ``[n, heads, T, head_dim]`` (q and
        k rotated, in one pass over both), the attention's input in prefill,
        chunked prefill and decode; ``cos, sin``: rows of ``cos``, ``signed_sin``."""
        n, t, _ = x.shape
        d = self.cfg.head_dim
        qkv = F.linear(self._rms(x, layer.ln1), layer.qkv)
        qk = self._rotate(qkv[..., :self._q + self._kv].view(n, t, -1, d).transpose(1, 2),
                          cos, sin)
        heads = self.cfg.num_attention_heads
        v = qkv[..., self._q + self._kv:].view(n, t, -1, d).transpose(1, 2)
        return qk[:, :heads], qk[:, heads:], v

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gu = F.linear(x, layer.gate_up)
        g, u = gu.chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, layer.down)

    def _expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return t if rep == 1 else t.repeat_interleave(rep, dim=1)

    # --- embeddings and heads ---------------------------------------------------

    def prompt_embeds(self, ids: torch.Tensor, inject_id: int | None = None,
                      vector: torch.Tensor | None = None) -> torch.Tensor:
        """``[T, hidden]`` text embeddings; ``vector`` where the prompt holds ``inject_id``."""
        emb = self.emb_text[ids]
        if inject_id is not None and vector is not None:
            emb = torch.where((ids == inject_id)[:, None], vector.to(emb.dtype)[None, :], emb)
        return emb

    def code_embeds(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, vq]`` codes -> ``[B, hidden]``: the sum of the codebook embeddings."""
        return self.emb_code[self._vq_index[None, :], codes].sum(dim=1)

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` float32 -> ``[N, vq, audio]`` float32."""
        return torch.einsum("nh,qvh->nqv", hidden, self.head_code)

    # --- forward passes -----------------------------------------------------------

    def prefill(self, embeds: torch.Tensor, lengths: torch.Tensor,
                slots: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        """Run ``embeds`` ``[n, T, hidden]`` (right-padded; row i real for
        ``lengths[i]`` positions) from position 0, writing slot ``slots[i]``'s KV
        cache; returns each row's final-norm hidden state at its last real
        position, float32 ``[n, hidden]``.

        Padding sits after the real positions, so causal attention keeps it out
        of every real position; what it writes to the cache lies past the
        request's length, where decode masks it until overwriting it.
        ``cache``: another (K, V) pair than the slots' (the refine-text lane).
        """
        kcache, vcache = cache if cache is not None else (self.k_cache, self.v_cache)
        n, t, _ = embeds.shape
        cos, sin = self.cos[:t][None, None], self.signed_sin[:t][None, None]
        x = embeds.to(self.dtype)
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            kcache[li, slots, :, :t] = k
            vcache[li, slots, :, :t] = v
            a = F.scaled_dot_product_attention(q, self._expand_kv(k), self._expand_kv(v),
                                               is_causal=True)
            x = x + F.linear(a.transpose(1, 2).reshape(n, t, -1), layer.o)
            x = x + self._mlp(layer, self._rms(x, layer.ln2))
        last = x[torch.arange(n, device=x.device), lengths - 1]
        return self._rms(last, self.norm).float()

    def prefill_chunk(self, embeds: torch.Tensor, slots: torch.Tensor, start: torch.Tensor,
                      last: torch.Tensor, length: int) -> torch.Tensor:
        """Run ``embeds`` ``[n, T, hidden]`` at positions ``start[i] ..
        start[i] + T - 1`` of slot ``slots[i]`` (chunked prefill: the earlier
        positions are already in the cache), attending over the first
        ``length`` cache positions; returns the final-norm hidden state of
        position ``last[i]`` of each row (float32 ``[n, hidden]``). Graph-safe.

        Positions past a row's real ones hold padding: causal masking keeps
        it out of every real position, and what it writes to the cache lies
        past the prompt, where decode overwrites it before attending to it
        (past ``max_len``: the scratch position)."""
        n, t, _ = embeds.shape
        posn = (start[:, None] + torch.arange(t, device=embeds.device)[None, :]
                ).clamp(max=self.max_len)  # [n, T]
        cos, sin = self.cos[posn][:, None], self.signed_sin[posn][:, None]  # [n, 1, T, d]
        keys = torch.arange(length, device=embeds.device)
        mask = (keys[None, None, :] <= posn[:, :, None])[:, None]  # [n, 1, T, L]
        rows = slots[:, None]
        x = embeds.to(self.dtype)
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[rows, :, posn] = k.transpose(1, 2)  # [n, T, heads, d]
            vc[rows, :, posn] = v.transpose(1, 2)
            a = F.scaled_dot_product_attention(
                q, self._expand_kv(kc[slots, :, :length]), self._expand_kv(vc[slots, :, :length]),
                attn_mask=mask)
            x = x + F.linear(a.transpose(1, 2).reshape(n, t, -1), layer.o)
            x = x + self._mlp(layer, self._rms(x, layer.ln2))
        out = x[torch.arange(n, device=x.device), last]
        return self._rms(out, self.norm).float()

    def decode(self, codes: torch.Tensor, pos: torch.Tensor, length: int) -> torch.Tensor:
        """One step for slots ``0..B-1``: ``codes`` ``[B, vq]`` at positions
        ``pos`` ``[B]``; attention over the first ``length`` cache positions.
        Returns the final-norm hidden state, float32 ``[B, hidden]``."""
        return self.decode_embeds(self.code_embeds(codes), pos, length,
                                  (self.k_cache, self.v_cache))

    def decode_embeds(self, x0: torch.Tensor, pos: torch.Tensor, length: int,
                      cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``decode`` from input embeddings ``[B, hidden]`` on the rows
        ``0..B-1`` of ``cache`` (K, V)."""
        b = x0.shape[0]
        kcache, vcache = cache
        rows = torch.arange(b, device=x0.device)
        cos, sin = self.cos[pos][:, None, None], self.signed_sin[pos][:, None, None]
        own = self.attention == "triton"
        mask = (None if own else
                (torch.arange(length, device=x0.device)[None, :] <= pos[:, None])[:, None, None])
        x = x0.to(self.dtype)[:, None, :]  # [B, 1, hidden]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            kc, vc = kcache[li], vcache[li]
            kc[rows, :, pos] = k[:, :, 0]
            vc[rows, :, pos] = v[:, :, 0]
            if own:
                a = decode_attention(q, kc, vc, pos, length)
            else:
                a = F.scaled_dot_product_attention(
                    q, self._expand_kv(kc[:b, :, :length]), self._expand_kv(vc[:b, :, :length]),
                    attn_mask=mask)
            x = x + F.linear(a.transpose(1, 2).reshape(b, 1, -1), layer.o)
            x = x + self._mlp(layer, self._rms(x, layer.ln2))
        return self._rms(x[:, 0], self.norm).float()

    # --- the refine-text lane -------------------------------------------------------

    def text_cache(self, slots: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A separate (K, V) pair for text generation (refine), ``max_len <= self.max_len``."""
        c = self.cfg
        shape = (c.num_hidden_layers, slots, c.num_key_value_heads, min(max_len, self.max_len),
                 c.head_dim)
        return (torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype))

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` float32 -> ``[N, 1, text vocab]`` (upstream ``head_text``)."""
        return (hidden @ self.head_text.T)[:, None, :]
