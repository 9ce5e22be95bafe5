"""The [orpheus] quantization setting: checked at config load against the
checkpoint's own quantization_config, and what reaches vLLM's ``quantization``."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from rtserver.config import load_config
from rtserver.engine.quantization import (
    QUANTIZATION_SETTINGS,
    declared_quantization,
    resolve_quantization,
)
from rtserver.errors import ConfigError
from rtserver.voices.orpheus.config import KV_CACHE_DTYPES, OrpheusConfig
from rtserver.voices.orpheus.layout import write_tiny_orpheus

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def checkpoint(root: Path, name: str, quant: dict[str, object] | None = None,
               key: str = "quantization_config") -> Path:
    folder = write_tiny_orpheus(root / name, shape="tiny")
    if quant is not None:
        config = json.loads((folder / "config.json").read_text())
        config[key] = quant
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_checkpoint_declaration_is_read_as_vllm_reads_it(tmp_path: Path) -> None:
    assert declared_quantization(checkpoint(tmp_path, "plain")) is None
    assert declared_quantization(checkpoint(tmp_path, "gptq", GPTQ)) == "gptq"
    assert declared_quantization(checkpoint(tmp_path, "awq", {"quant_method": "AWQ"})) == "awq"
    assert declared_quantization(checkpoint(
        tmp_path, "ct", {"quant_method": "compressed-tensors"}, key="compression_config")
    ) == "compressed-tensors"
    assert declared_quantization(checkpoint(tmp_path, "mo", {
        "producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}})
    ) == "modelopt_fp4"
    old_modelopt = checkpoint(tmp_path, "mo-old")
    (old_modelopt / "hf_quant_config.json").write_text("{}")
    assert declared_quantization(old_modelopt) == "modelopt"
    with pytest.raises(ValueError, match="cannot read"):
        declared_quantization(tmp_path / "missing")


@pytest.mark.parametrize(("setting", "declared", "passed"), [
    ("", None, None),  # bf16 as it is
    ("fp8", None, "fp8"),  # quantized at load
    ("", "gptq", None),  # the checkpoint's own; vLLM picks the (Marlin) kernel
    ("gptq", "gptq", None),  # same: an explicit "gptq" would force the slow kernel
    ("gptq_marlin", "gptq", "gptq_marlin"),  # a kernel of the declared method
    ("awq_marlin", "awq", "awq_marlin"),
    ("fp8", "fp8", None),  # an FP8 checkpoint
])
def test_what_reaches_vllm(setting: str, declared: str | None, passed: str | None) -> None:
    assert resolve_quantization(setting, declared) == passed


@pytest.mark.parametrize(("setting", "declared", "message"), [
    ("awq", "gptq", "contradicts the checkpoint, which is quantized with 'gptq'"),
    ("fp8", "awq", "contradicts"),
    ("gptq", None, "needs a checkpoint quantized with gptq"),
    ("int3", None, "is not one of"),
])
def test_contradictions_are_refused(setting: str, declared: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_quantization(setting, declared)


def test_config_load_names_the_field(tmp_path: Path) -> None:
    assert load_config(env={}).family("orpheus", OrpheusConfig).quantization == ""
    fp8 = load_config(env={"RTSERVER_ORPHEUS_QUANTIZATION": "fp8"})
    assert fp8.family("orpheus", OrpheusConfig).quantization == "fp8"
    with pytest.raises(ConfigError, match=r"\[orpheus\] quantization 'fp4' is not one of"):
        load_config(env={}, flags={"orpheus.quantization": "fp4"})
    gptq = checkpoint(tmp_path, "gptq", GPTQ)
    file = tmp_path / "rt.toml"
    file.write_text(f'[orpheus]\nmodel_dir = "{gptq}"\nquantization = "awq"\n')
    with pytest.raises(ConfigError, match=r"\[orpheus\] quantization 'awq' contradicts"):
        load_config(file, env={})
    file.write_text(f'[orpheus]\nmodel_dir = "{gptq}"\nquantization = "gptq"\n')
    assert load_config(file, env={}).family("orpheus", OrpheusConfig).quantization == "gptq"
    # dummy weights without a folder: the layout written at load declares nothing
    with pytest.raises(ConfigError, match="needs a checkpoint quantized with awq"):
        load_config(env={}, flags={"orpheus.dummy_weights": True,
                                   "orpheus.quantization": "awq"})


def test_every_setting_is_a_vllm_method() -> None:
    quant = pytest.importorskip("vllm.model_executor.layers.quantization")
    assert set(QUANTIZATION_SETTINGS) <= set(quant.QUANTIZATION_METHODS)


def test_kv_cache_dtypes_are_vllm_cache_dtypes() -> None:
    cache = pytest.importorskip("vllm.config.cache")
    assert set(KV_CACHE_DTYPES) <= set(typing.get_args(cache.CacheDType))
    assert load_config(env={}).family("orpheus", OrpheusConfig).kv_cache_dtype == "auto"
    fp8 = load_config(env={"RTSERVER_ORPHEUS_KV_CACHE_DTYPE": "fp8"})
    assert fp8.family("orpheus", OrpheusConfig).kv_cache_dtype == "fp8"
    with pytest.raises(ConfigError, match=r"\[orpheus\] kv_cache_dtype 'int4' is not one of"):
        load_config(env={}, flags={"orpheus.kv_cache_dtype": "int4"})
