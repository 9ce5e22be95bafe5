"""The engine arguments built for each quantization setting, taken through
vLLM's own config checks (``create_engine_config``: no weights, no engine),
on the CPU wheel. Whether a method's kernels run is for the GPU: on the CPU
this shows only that vLLM accepts what we pass and settles on the method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from rtserver.engine.quantization import declare_quantization, declared_quantization
from rtserver.engine.vllm_engine import VllmEngine, VllmEngineConfig
from rtserver.errors import ConfigError
from rtserver.voices.orpheus.layout import write_tiny_orpheus

pytestmark = [pytest.mark.vllm]


def engine(root: Path, setting: str, quant: dict[str, object] | None) -> VllmEngine:
    folder = write_tiny_orpheus(root, shape="tiny")
    if quant is not None:
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = quant
        (folder / "config.json").write_text(json.dumps(config))
    return VllmEngine(VllmEngineConfig(model=str(folder), dummy_weights=True,
                                       quantization=setting, enforce_eager=True,
                                       max_model_len=512, max_num_seqs=4))


@pytest.mark.parametrize(("setting", "quant", "arg", "settled"), [
    ("", None, None, None),
    ("fp8", None, "fp8", "fp8"),
    ("fp8", {"quant_method": "fp8", "activation_scheme": "dynamic"}, None, "fp8"),
    # on the CPU vLLM runs a GPTQ checkpoint as auto_gptq (gptq_marlin on CUDA):
    # passing "gptq" would have made it refuse
    ("gptq", {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
              "sym": True}, None, "auto_gptq"),
])
def test_vllm_accepts_the_arguments(tmp_path: Path, setting: str,
                                    quant: dict[str, object] | None, arg: str | None,
                                    settled: str | None) -> None:
    args = engine(tmp_path, setting, quant).engine_args()
    assert args.quantization == arg
    assert args.create_engine_config().model_config.quantization == settled


@pytest.mark.parametrize(("method", "settled"), [("gptq", "auto_gptq"), ("awq", "awq")])
def test_declared_random_layouts_load_as_that_method(tmp_path: Path, method: str,
                                                     settled: str) -> None:
    """What the bench's --declare-quantization writes: vLLM settles on the method
    (on the CPU; gptq_marlin / awq_marlin are CUDA's choices)."""
    folder = write_tiny_orpheus(tmp_path, shape="tiny")
    declare_quantization(folder, method)
    assert declared_quantization(folder) == method
    args = VllmEngine(VllmEngineConfig(model=str(folder), dummy_weights=True,
                                       enforce_eager=True, max_model_len=512,
                                       max_num_seqs=4)).engine_args()
    assert args.create_engine_config().model_config.quantization == settled


def test_a_contradiction_fails_before_vllm(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'awq' contradicts the checkpoint"):
        engine(tmp_path, "awq", {"quant_method": "fp8"}).engine_args()


@pytest.mark.parametrize("kv", ["auto", "fp8", "fp8_e5m2"])
def test_vllm_accepts_the_kv_cache_dtype(tmp_path: Path, kv: str) -> None:
    """``[orpheus] kv_cache_dtype`` reaches vLLM's cache config as given."""
    folder = write_tiny_orpheus(tmp_path, shape="tiny")
    args = VllmEngine(VllmEngineConfig(model=str(folder), dummy_weights=True, kv_cache_dtype=kv,
                                       enforce_eager=True, max_model_len=512,
                                       max_num_seqs=4)).engine_args()
    assert args.create_engine_config().cache_config.cache_dtype == kv
