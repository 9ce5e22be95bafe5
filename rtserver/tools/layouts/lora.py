"""Write a LoRA adapter folder in PEFT's layout, with random weights, for an
Orpheus (Llama) checkpoint of a given shape.

The layout is what ``peft``'s ``save_pretrained`` writes for a causal LM
(``peft`` itself is not needed): ``adapter_config.json`` (``peft_type``
``"LORA"``, ``r``, ``lora_alpha``, ``target_modules``, ...) and
``adapter_model.safetensors`` with one pair per adapted linear layer::

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   (r, in)
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   (out, r)

PEFT starts ``lora_B`` at zero (an untrained adapter changes nothing); here
both are random, so each seed is a different, audible voice (tests) and the
cost is that of a trained adapter of the same rank (benchmarks). Shapes follow
``rtserver.voices.orpheus.layout.tensor_shapes``: ``"tiny"`` for CPU tests,
``"3b"`` for the real Orpheus-3B projections.

    python -m rtserver.tools.layouts.lora OUT_DIR [--shape tiny|3b] [--rank 16] [--seed N]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rtserver.voices.orpheus.layout import Shape, llama_config, tensor_shapes

# The projections of a Llama decoder layer PEFT can adapt, by their module names.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_LINEAR = ATTENTION + MLP
PREFIX = "base_model.model."  # PEFT's prefix before the model's own names


def adapter_config(*, rank: int, alpha: float, target_modules: Sequence[str],
                   base_model: str) -> dict[str, object]:
    """``adapter_config.json`` as PEFT writes it for a causal-LM LoRA."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }


def lora_tensor_shapes(config: dict[str, object], rank: int,
                       target_modules: Sequence[str]) -> dict[str, tuple[int, int]]:
    """PEFT tensor name -> shape, for every targeted projection of every layer."""
    out: dict[str, tuple[int, int]] = {}
    for name, dims in tensor_shapes(config).items():
        if len(dims) != 2 or not name.startswith("model.layers."):
            continue
        module = name.rsplit(".", 2)[-2]  # "...self_attn.q_proj.weight" -> "q_proj"
        if module not in target_modules:
            continue
        out_features, in_features = dims
        stem = PREFIX + name.removesuffix(".weight")
        out[f"{stem}.lora_A.weight"] = (rank, in_features)
        out[f"{stem}.lora_B.weight"] = (out_features, rank)
    return out


def write_lora_adapter(directory: str | Path, *, shape: Shape = "tiny", rank: int = 8,
                       alpha: float | None = None, target_modules: Sequence[str] = ATTENTION,
                       seed: int = 0, std: float = 0.05, base_model: str = "",
                       dtype: str = "float16") -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors``; returns the folder.

    ``alpha`` defaults to ``2 * rank`` (scaling 2, a common fine-tuning choice);
    ``std``: the spread of both A and B. ``dtype``: "float16" or "float32"
    (numpy has no bfloat16; vLLM casts to its LoRA dtype when it loads)."""
    from safetensors.numpy import save_file

    unknown = set(target_modules) - set(ALL_LINEAR)
    if unknown or not target_modules:
        raise ValueError(f"target_modules {sorted(unknown) or '()'}: from {', '.join(ALL_LINEAR)}")
    if rank < 1:
        raise ValueError(f"rank {rank} must be >= 1")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = llama_config(shape)
    rng = np.random.default_rng(seed)
    np_dtype = np.dtype(dtype)
    tensors = {name: (rng.standard_normal(dims, dtype=np.float32) * std).astype(np_dtype)
               for name, dims in lora_tensor_shapes(config, rank, target_modules).items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = adapter_config(rank=rank, alpha=float(alpha if alpha is not None else 2 * rank),
                         target_modules=target_modules,
                         base_model=base_model or f"orpheus-{shape}")
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write a random LoRA adapter in PEFT layout.")
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=["tiny", "3b"], default="tiny")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=None)
    p.add_argument("--modules", default="attention",
                   help="attention (q,k,v,o), all (+ gate, up, down) or a comma list")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.05)
    a = p.parse_args(argv)
    modules = {"attention": ATTENTION, "all": ALL_LINEAR}.get(
        a.modules, tuple(m.strip() for m in a.modules.split(",") if m.strip()))
    print(write_lora_adapter(a.out, shape=a.shape, rank=a.rank, alpha=a.alpha,
                             target_modules=modules, seed=a.seed, std=a.std))


if __name__ == "__main__":
    main()
