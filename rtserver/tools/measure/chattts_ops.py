"""How many ops one ChatTTS decode step runs: each is a kernel (a node of the
step's CUDA graph) on a GPU, so at few rows, where a kernel's work is small,
their number sets the step's GPU time and its graph's launch.

    python -m rtserver.tools.measure.chattts_ops [--ckpt DIR] [--dtype bfloat16]

Counted on the CPU with torch's profiler: the top-level aten ops of
``ChatLM.decode`` (the GPT body, without the heads and sampling), views and
other ops that launch nothing left out. Reported per step, per layer (the step
with every layer less the step with one layer fewer) and the per-step rest.
Without ``--ckpt`` the tiny checkpoint is written to a temporary folder;
``python -m rtserver.tools.layouts.chattts DIR --shape real --no-decoder``
writes the real shapes.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from dataclasses import dataclass

# ops that make a view or read metadata: no kernel
_NO_KERNEL = frozenset({
    "aten::slice", "aten::view", "aten::transpose", "aten::select", "aten::unsqueeze",
    "aten::expand", "aten::as_strided", "aten::reshape", "aten::chunk", "aten::split",
    "aten::t", "aten::detach", "aten::alias", "aten::empty", "aten::_unsafe_view",
    "aten::lift_fresh", "aten::empty_like", "aten::resolve_conj", "aten::resolve_neg",
    "aten::result_type", "aten::permute", "aten::squeeze", "aten::unbind"})


@dataclass(frozen=True, slots=True)
class OpCount:
    layers: int
    per_step: int
    per_layer: int
    by_name: dict[str, int]  # the whole step's ops by name

    @property
    def rest(self) -> int:
        """Ops a step runs outside its layers (tables, masks, embeddings, final norm)."""
        return self.per_step - self.layers * self.per_layer


def count_decode_ops(ckpt: str, dtype_name: str = "bfloat16", rows: int = 2) -> OpCount:
    """One decode step of ``rows`` rows on the CPU, counted as the module says."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rtserver.voices.chattts.assets import load_lm_assets
    from rtserver.voices.chattts.engine.model import ChatLM

    assets = load_lm_assets(ckpt)
    cfg = assets.config
    m = ChatLM(cfg, assets.gpt, assets.embed, slots=rows, max_len=64, device="cpu",
               dtype=getattr(torch, dtype_name))
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, cfg.num_audio_tokens, (rows, cfg.num_vq), generator=gen)
    pos = torch.arange(rows) + 4

    def step() -> Counter[str]:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            m.decode(codes, pos, 16)
        return Counter(e.name for e in prof.events()
                       if e.cpu_parent is None and e.name.startswith("aten::")
                       and e.name not in _NO_KERNEL)

    full = step()
    m.layers = m.layers[:-1]
    fewer = step()
    n = sum(full.values())
    return OpCount(layers=cfg.num_hidden_layers, per_step=n,
                   per_layer=n - sum(fewer.values()), by_name=dict(full))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="", help="a ChatTTS folder (default: the tiny one)")
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args(argv)
    ckpt = a.ckpt
    if not ckpt:
        from rtserver.tools.layouts.chattts import write_tiny_chattts

        ckpt = str(write_tiny_chattts(tempfile.mkdtemp(), shape="tiny", decoder=False))
    c = count_decode_ops(ckpt, a.dtype)
    print(f"{c.per_step} ops a decode step ({a.dtype}): {c.layers} layers x {c.per_layer} "
          f"+ {c.rest}")
    print(", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in
                    sorted(c.by_name.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
