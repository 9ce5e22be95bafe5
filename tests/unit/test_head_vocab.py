"""The logits head: its renumbering (engine/head_vocab.py), the engine's checks
and ``[orpheus] audio_head``'s resolution (when it runs, when it refuses)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rtserver.engine.base import SamplingSettings
from rtserver.engine.head_vocab import HeadVocab, merge_ranges, vocab_order
from rtserver.errors import ConfigError
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus import voice as orpheus_voice
from rtserver.voices.orpheus.config import OrpheusConfig


def test_merge_ranges_joins_runs() -> None:
    assert merge_ranges([5, 3, 4, 9, 4, 1]) == ((1, 2), (3, 6), (9, 10))
    assert merge_ranges([]) == ()


def test_order_puts_the_head_first_and_keeps_the_rest_in_order() -> None:
    order = vocab_order([(6, 8), (2, 3)], 10)
    assert order.tolist() == [6, 7, 2, 0, 1, 3, 4, 5, 8, 9]
    assert sorted(order.tolist()) == list(range(10))


def test_order_refuses_overlaps_and_ids_out_of_range() -> None:
    with pytest.raises(ValueError, match="overlap"):
        vocab_order([(1, 4), (3, 5)], 10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        vocab_order([(8, 11)], 10)


def test_ids_round_trip_through_the_models_numbering() -> None:
    head = HeadVocab.of([7, 2, 6], 10)
    assert head.head_size == 3
    assert head.to_model([2, 6, 7]) == [0, 1, 2]
    assert head.to_model([0, 1, 3, 9]) == [3, 4, 5, 9]
    every = list(range(10))
    assert head.from_model(head.to_model([2, 7, 6])) == [2, 7, 6]
    assert sorted(head.to_model(every)) == every
    assert [head.in_head(t) for t in (1, 2, 6, 7, 8)] == [False, True, True, True, False]


def test_a_model_id_outside_the_head_is_an_error() -> None:
    head = HeadVocab.of([7, 2, 6], 10)
    with pytest.raises(ValueError, match="outside its head of 3"):
        head.from_model([0, 3])
    assert head.from_model([]) == [] and head.to_model([]) == []


def test_orpheus_head_is_its_audio_and_end_tokens() -> None:
    head = HeadVocab.of([*range(ot.AUDIO_TOKENS_START, ot.AUDIO_TOKENS_END),
                         *ot.STOP_TOKEN_IDS], ot.VOCAB_SIZE)
    assert head.head_size == 7 * 4096 + 2
    model = head.to_model([ot.END_OF_SPEECH, ot.AUDIO_TOKENS_START, ot.AUDIO_TOKENS_END - 1,
                           ot.END_OF_TEXT])
    assert model[:3] == [0, 2, head.head_size - 1] and model[3] >= head.head_size
    rng = np.random.default_rng(0)
    ids = rng.integers(0, ot.VOCAB_SIZE, 1000).tolist()
    mapped = head.to_model(ids)
    back = [head.from_model([m])[0] if m < head.head_size else None for m in mapped]
    assert all(b is None or b == i for b, i in zip(back, ids, strict=True))


# --- the engine's checks -------------------------------------------------------

def test_engine_refuses_a_head_with_a_mask_lora_tensor_parallel_or_quantization(
        tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from rtserver.engine.vllm_engine import VllmEngine, VllmEngineConfig, head_refusal

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100}))
    head = HeadVocab.of(range(10), 100)
    ok = VllmEngineConfig(model=str(tmp_path), token_guard="none", head=head)
    assert head_refusal(ok) == ""
    VllmEngine(ok).engine_args()
    for bad, why in (({"token_guard": "mask"}, "token_guard is 'mask', not 'none'"),
                     ({"token_guard": "allowed"}, "token_guard is 'allowed', not 'none'"),
                     ({"tensor_parallel_size": 2}, "tensor_parallel_size is not 1"),
                     ({"max_loras": 1}, "LoRA is on"),
                     ({"quantization": "awq"}, "quantization is 'awq'")):
        config = dataclasses.replace(ok, **bad)
        assert head_refusal(config) == why
        with pytest.raises(ConfigError, match="a logits head cannot serve"):
            VllmEngine(config).engine_args()
    (tmp_path / "config.json").write_text(json.dumps(
        {"vocab_size": 100, "quantization_config": {"quant_method": "gptq"}}))
    assert head_refusal(ok) == "the checkpoint is quantized (gptq)"


# --- [orpheus] audio_head ---------------------------------------------------------

@pytest.fixture
def model_dir(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": ot.VOCAB_SIZE}))
    return str(tmp_path)


def _resolve(cfg: OrpheusConfig, model_dir: str, *, v2: bool, guard: str = "none",
             monkeypatch: pytest.MonkeyPatch) -> tuple[HeadVocab | None, bool]:
    """(head, without penalties) as the voice resolves ``cfg`` with vLLM's V2
    runner expected or not."""
    pytest.importorskip("vllm")
    from rtserver.engine import vllm_engine

    monkeypatch.setattr(vllm_engine, "v2_model_runner_expected", lambda: v2)
    engine = orpheus_voice._resolve_head(cfg, orpheus_voice._engine_config(cfg, guard,
                                                                           model_dir))
    return engine.head, engine.head_without_penalties


def test_auto_is_on_where_vllm_runs_its_v2_runner(model_dir: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    head, without_penalties = _resolve(OrpheusConfig(), model_dir, v2=True,
                                       monkeypatch=monkeypatch)
    assert head is not None and head.head_size == 7 * 4096 + 2 and not without_penalties
    assert head.size == ot.VOCAB_SIZE


@pytest.mark.parametrize(("changes", "guard", "v2"), [
    ({}, "none", False),  # the CPU: vLLM's V1 runner
    ({}, "mask", True),  # dummy weights' mask
    ({"tensor_parallel_size": 2}, "none", True),
    ({"lora": True}, "none", True),
    ({"quantization": "awq"}, "none", True),
    ({"audio_head": "off"}, "none", True),
])
def test_auto_is_off_where_the_head_cannot_serve(changes: dict[str, object], guard: str,
                                                 v2: bool, model_dir: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = OrpheusConfig(**changes)  # type: ignore[arg-type]
    assert _resolve(cfg, model_dir, v2=v2, guard=guard, monkeypatch=monkeypatch) == (None, False)


def test_on_says_why_it_cannot_serve(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="token_guard is 'mask', not 'none'"):
        _resolve(OrpheusConfig(audio_head="on"), model_dir, v2=True, guard="mask",
                 monkeypatch=monkeypatch)
    with pytest.raises(ConfigError, match="LoRA is on"):
        _resolve(OrpheusConfig(audio_head="on", lora=True), model_dir, v2=True,
                 monkeypatch=monkeypatch)
    with pytest.raises(ConfigError, match=r"repetition_penalty 1\.0"):
        _resolve(OrpheusConfig(audio_head="on"), model_dir, v2=False, monkeypatch=monkeypatch)


def test_on_without_the_v2_runner_serves_without_penalties(
        model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = OrpheusConfig(audio_head="on", sampling=SamplingSettings(repetition_penalty=1.0))
    head, without_penalties = _resolve(cfg, model_dir, v2=False, monkeypatch=monkeypatch)
    assert head is not None and without_penalties


def test_audio_head_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="audio_head 'yes' is not one of auto, on, off"):
        OrpheusConfig(audio_head="yes").check()


def test_the_plugin_is_installed_with_rtserver() -> None:
    from rtserver.engine import vllm_plugin

    assert vllm_plugin.installed()  # pyproject's entry point, as vLLM's processes find it


def test_without_the_plugin_installed_auto_is_off_and_on_says_so(
        model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rtserver.engine import vllm_plugin

    monkeypatch.setattr(vllm_plugin, "installed", lambda: False)
    assert _resolve(OrpheusConfig(), model_dir, v2=True, monkeypatch=monkeypatch) == (None, False)
    with pytest.raises(ConfigError, match=r"plugin .* is not installed"):
        _resolve(OrpheusConfig(audio_head="on"), model_dir, v2=True, monkeypatch=monkeypatch)


def test_engine_maps_stop_ids_clamps_top_k_and_refuses_what_the_head_cannot_serve() -> None:
    pytest.importorskip("vllm")
    from rtserver.engine.base import TokenRequest
    from rtserver.engine.vllm_engine import VllmEngine, VllmEngineConfig
    from rtserver.errors import EngineFailed

    head = HeadVocab.of([*range(50, 60), 7], 100)
    request = TokenRequest(request_id="r", prompt_token_ids=(1, 2, 55), max_tokens=8,
                           sampling=SamplingSettings(top_k=50), stop_token_ids=(7,))
    params = VllmEngine(VllmEngineConfig(model="m", token_guard="none", head=head)
                        ).sampling_params(request)
    assert params.stop_token_ids == [0] and params.top_k == head.head_size == 11
    with pytest.raises(EngineFailed, match="outside the model's logits head"):
        VllmEngine(VllmEngineConfig(model="m", token_guard="none", head=head)).sampling_params(
            TokenRequest(request_id="r", prompt_token_ids=(1,), max_tokens=8,
                         sampling=SamplingSettings(), stop_token_ids=(8,)))
    without = VllmEngine(VllmEngineConfig(model="m", token_guard="none", head=head,
                                          head_without_penalties=True))
    with pytest.raises(EngineFailed, match="no repetition penalty"):
        without.sampling_params(request)
    ok = TokenRequest(request_id="r", prompt_token_ids=(1,), max_tokens=8,
                      sampling=SamplingSettings(repetition_penalty=1.0), stop_token_ids=(7,))
    assert without.sampling_params(ok).repetition_penalty == 1.0
