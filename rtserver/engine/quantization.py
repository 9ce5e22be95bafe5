"""Which ``quantization=`` to hand vLLM, from a voice setting and the checkpoint.

Pure (json and pathlib only): config load checks a setting with it, and the
vLLM engine builds its arguments with it.

vLLM's rule (``ModelConfig._verify_quantization``, the same in 0.26 and 0.32):
a checkpoint that declares a ``quantization_config`` in ``config.json`` (or
``compression_config``, or ModelOpt's ``hf_quant_config.json``) is loaded with
that method; an explicit ``quantization`` argument must then equal the method
vLLM settles on, or it raises. Left unset, vLLM picks the fastest kernel for
the declared method itself (GPTQ and AWQ checkpoints run as ``gptq_marlin`` /
``awq_marlin`` on CUDA); an explicit ``"gptq"`` or ``"awq"`` forces the slower
non-Marlin kernels. Hence:

- checkpoint declares a method, setting empty or the same method: pass None
  (vLLM reads the checkpoint's and picks the kernel);
- setting names a kernel of the declared method (``gptq_marlin`` on a GPTQ
  checkpoint): pass it;
- setting names another method: ``ValueError`` naming both;
- checkpoint declares none: ``fp8`` quantizes the bf16 weights at load
  (dynamic per-tensor activations); the others need a checkpoint quantized
  that way and are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

# Methods the [orpheus] quantization setting accepts: each is a vLLM
# QuantizationMethods name in 0.26 and 0.32 (tests check the installed vLLM).
QUANTIZATION_SETTINGS: tuple[str, ...] = (
    "fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors",
    "modelopt", "modelopt_fp4",
)
# Quantize at load: need no quantized checkpoint.
AT_LOAD: frozenset[str] = frozenset({"fp8"})
# Names of one method (checkpoint spellings and kernels) -> the method.
_METHOD: dict[str, str] = {
    "auto_gptq": "gptq", "gptq_marlin": "gptq",
    "auto_awq": "awq", "awq_marlin": "awq",
    "compressed_tensors": "compressed-tensors",
}


# The quantization_config a 4-bit checkpoint of each method declares (AutoGPTQ
# and AutoAWQ defaults: 4 bits, groups of 128): written into a random-weights
# layout, vLLM's dummy loader builds that method's packed weights, so its
# kernels' speed can be measured without a quantized checkpoint.
CHECKPOINT_DECLARATIONS: dict[str, dict[str, object]] = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
            "version": "gemm"},
}


def declare_quantization(model_dir: str | Path, method: str, *, group_size: int = 128
                         ) -> None:
    """Add ``method``'s declaration (``CHECKPOINT_DECLARATIONS``, groups of
    ``group_size`` input channels: it must divide the layer widths) to a
    checkpoint folder's ``config.json`` (random-weights layouts only)."""
    if method not in CHECKPOINT_DECLARATIONS:
        raise ValueError(f"no declaration for {method!r}; one of "
                         f"{', '.join(CHECKPOINT_DECLARATIONS)}")
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["quantization_config"] = {**CHECKPOINT_DECLARATIONS[method],
                                     "group_size": group_size}
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def method_of(name: str) -> str:
    """The method a checkpoint's ``quant_method`` or a kernel name belongs to."""
    key = name.strip().lower()
    return _METHOD.get(key, key)


def declared_quantization(model_dir: str | Path) -> str | None:
    """The quantization method a checkpoint folder declares, or None.

    Reads what vLLM reads: ``config.json``'s ``quantization_config`` (then
    ``compression_config``) ``quant_method`` (ModelOpt: ``producer.name``), else
    ``hf_quant_config.json`` (older ModelOpt). ``ValueError`` if unreadable.
    """
    folder = Path(model_dir)
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    quant = config.get("quantization_config") or config.get("compression_config")
    if quant is None and (folder / "hf_quant_config.json").is_file():
        return "modelopt"
    if not isinstance(quant, dict):
        return None
    producer = quant.get("producer")
    if isinstance(producer, dict) and producer.get("name") == "modelopt":
        algo = str(quant.get("quantization", {}).get("quant_algo", "")).upper()
        return "modelopt_fp4" if algo == "NVFP4" else "modelopt"
    method = str(quant.get("quant_method", "")).strip()
    return method_of(method) if method else None


def check_setting(setting: str) -> None:
    """``ValueError`` unless ``setting`` is empty or an accepted method."""
    if setting and setting not in QUANTIZATION_SETTINGS:
        raise ValueError(f"quantization {setting!r} is not one of \"\", "
                         f"{', '.join(QUANTIZATION_SETTINGS)}")


def resolve_quantization(setting: str, declared: str | None) -> str | None:
    """vLLM's ``quantization`` argument for ``setting`` on a checkpoint that
    declares ``declared`` (see the module docstring); ``ValueError`` naming
    the field when they contradict."""
    check_setting(setting)
    if declared is None:
        if not setting:
            return None
        if setting in AT_LOAD:
            return setting
        raise ValueError(f"quantization {setting!r} needs a checkpoint quantized with "
                         f"{method_of(setting)} (config.json quantization_config); this one "
                         f"declares none (only {', '.join(sorted(AT_LOAD))} quantizes at load)")
    if not setting:
        return None
    if method_of(setting) != declared:
        raise ValueError(f"quantization {setting!r} contradicts the checkpoint, which is "
                         f"quantized with {declared!r}: leave quantization empty (vLLM uses "
                         f"the checkpoint's) or set it to {declared!r}")
    return None if setting == declared else setting
