"""LoRA voices without vLLM: the PEFT layout the tools write, the `[orpheus]
adapters` setting, and the reasons a folder is refused before vLLM sees it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from rtserver.errors import BadAdapter, UnknownVoice
from rtserver.tools.layouts.lora import ALL_LINEAR, lora_tensor_shapes, write_lora_adapter
from rtserver.voices.orpheus.config import OrpheusConfig, check_adapter_folder
from rtserver.voices.orpheus.layout import llama_config


def test_adapter_tensors_are_named_and_shaped_as_peft_writes_them() -> None:
    """Orpheus-3B, rank 64 on every projection: PEFT's names, A is (r, in), B (out, r)."""
    shapes = lora_tensor_shapes(llama_config("3b"), 64, ALL_LINEAR)
    p = "base_model.model.model.layers.0."
    assert shapes[p + "self_attn.q_proj.lora_A.weight"] == (64, 3072)
    assert shapes[p + "self_attn.q_proj.lora_B.weight"] == (3072, 64)
    assert shapes[p + "self_attn.k_proj.lora_B.weight"] == (1024, 64)  # 8 KV heads of 128
    assert shapes[p + "mlp.down_proj.lora_A.weight"] == (64, 8192)
    assert len(shapes) == 28 * 7 * 2


def test_written_adapter_reads_back(tmp_path: Path) -> None:
    out = write_lora_adapter(tmp_path / "a", shape="tiny", rank=8, seed=3)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["peft_type"], cfg["r"], cfg["lora_alpha"]) == ("LORA", 8, 16.0)
    assert cfg["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert set(tensors) == set(lora_tensor_shapes(llama_config("tiny"), 8, cfg["target_modules"]))
    b = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    assert b.shape == (32, 8) and float(abs(b).max()) > 0  # random, not PEFT's zeros
    assert check_adapter_folder(str(out)) == out.resolve()


def test_adapters_setting_names_voices_and_refuses_bad_entries() -> None:
    cfg = OrpheusConfig(adapters=("alice=/a", "bob@tara=/b"))
    assert cfg.adapter_specs() == [("alice", "alice", "/a"), ("bob", "tara", "/b")]
    assert cfg.lora_on and not OrpheusConfig().lora_on
    for bad, why in ((("alice",), "<name>=<folder>"), (("tara=/a",), "stock speaker"),
                     (("a b=/a",), "letters"), (("x=/a", "x=/b"), "twice")):
        with pytest.raises(ValueError, match=why):
            OrpheusConfig(adapters=bad).check()


def test_folder_checks_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(BadAdapter, match="does not exist"):
        check_adapter_folder(str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadAdapter, match=r"no adapter_config\.json"):
        check_adapter_folder(str(tmp_path / "empty"))
    (tmp_path / "empty" / "adapter_config.json").write_text('{"peft_type": "PREFIX_TUNING"}')
    with pytest.raises(BadAdapter, match="not a LoRA"):
        check_adapter_folder(str(tmp_path / "empty"))
    write_lora_adapter(tmp_path / "root" / "ok", seed=0)
    assert check_adapter_folder("ok", str(tmp_path / "root")).name == "ok"
    with pytest.raises(BadAdapter, match="outside the adapter root"):
        check_adapter_folder("../empty", str(tmp_path / "root"))
    assert issubclass(BadAdapter, UnknownVoice)  # the client sees unknown_voice
