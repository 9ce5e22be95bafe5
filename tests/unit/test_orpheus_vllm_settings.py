"""[orpheus] settings of how vLLM steps: cudagraph_mode (vLLM's own CUDA graph
modes, checked at config load and handed to vLLM's ``compilation_config``; "auto"
is FULL on a CUDA GPU and vLLM's choice elsewhere, engine/graph_mode.py) and
later_hold_ms (the engine's submit gate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserver.config import load_config
from rtserver.engine.graph_mode import graph_settings, largest_graphed_batch
from rtserver.errors import ConfigError
from rtserver.voices.orpheus.config import CUDAGRAPH_MODES, OrpheusConfig
from rtserver.voices.orpheus.layout import write_tiny_orpheus
from rtserver.voices.orpheus.voice import _engine_config


def test_every_mode_is_a_vllm_cudagraph_mode() -> None:
    compilation = pytest.importorskip("vllm.config.compilation")
    assert set(CUDAGRAPH_MODES) - {"auto"} <= set(compilation.CUDAGraphMode.__members__)


def test_the_setting_is_read_and_checked() -> None:
    assert load_config(env={}).family("orpheus", OrpheusConfig).cudagraph_mode == "auto"
    full = load_config(env={"RTSERVER_ORPHEUS_CUDAGRAPH_MODE": "FULL"})
    assert full.family("orpheus", OrpheusConfig).cudagraph_mode == "FULL"
    with pytest.raises(ConfigError, match=r"\[orpheus\] cudagraph_mode 'full' is not one of"):
        load_config(env={}, flags={"orpheus.cudagraph_mode": "full"})


def test_auto_is_full_on_cuda_with_tokens_capped_at_the_largest_graph() -> None:
    assert graph_settings("auto", 256, None, cuda=True, eager=False) == ("FULL", 512)
    assert graph_settings("auto", 64, None, cuda=True, eager=False) == ("FULL", 128)
    # never under max_num_seqs (vLLM refuses fewer tokens a step than rows)
    assert graph_settings("auto", 768, None, cuda=True, eager=False) == ("FULL", 768)
    # an operator's token budget stands
    assert graph_settings("auto", 256, 2048, cuda=True, eager=False) == ("FULL", 2048)
    # vLLM's own choice on the CPU, and with no graphs at all
    assert graph_settings("auto", 256, None, cuda=False, eager=False) == (None, None)
    assert graph_settings("auto", 256, None, cuda=True, eager=True) == (None, None)
    assert graph_settings("FULL", 256, 300, cuda=True, eager=True) == (None, 300)
    # a named mode goes as named; only FULL caps the tokens
    assert graph_settings("FULL", 256, None, cuda=False, eager=False) == ("FULL", 512)
    assert graph_settings("FULL_AND_PIECEWISE", 256, None, cuda=True, eager=False) == (
        "FULL_AND_PIECEWISE", None)
    assert largest_graphed_batch(300) == 512


def test_full_caps_the_tokens_vllm_gets_a_step(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from rtserver.engine.vllm_engine import VllmEngine

    folder = str(write_tiny_orpheus(tmp_path / "m", shape="tiny"))
    for seqs, tokens in ((4, 8), (256, 512), (384, 512)):
        config = _engine_config(OrpheusConfig(cudagraph_mode="FULL", max_num_seqs=seqs),
                                "none", folder)
        args = VllmEngine(config).engine_args()
        assert args.max_num_batched_tokens == tokens
        assert args.create_engine_config().scheduler_config.max_num_batched_tokens == tokens
    # vLLM's own budget where the mode is not FULL (this CPU: "auto" is vLLM's choice)
    auto = VllmEngine(_engine_config(OrpheusConfig(), "none", folder)).engine_args()
    assert auto.max_num_batched_tokens is None


def test_the_mode_reaches_vllm_and_auto_leaves_its_default(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode

    from rtserver.engine.vllm_engine import VllmEngine

    folder = str(write_tiny_orpheus(tmp_path / "m", shape="tiny"))
    auto = _engine_config(OrpheusConfig(), "none", folder)
    default = CompilationConfig().cudagraph_mode
    assert VllmEngine(auto).engine_args().compilation_config.cudagraph_mode == default
    for name in ("FULL", "PIECEWISE", "FULL_AND_PIECEWISE"):
        config = _engine_config(OrpheusConfig(cudagraph_mode=name), "none", folder)
        args = VllmEngine(config).engine_args()
        assert args.compilation_config.cudagraph_mode == CUDAGraphMode[name]


def test_later_hold_reaches_the_engines_gate(tmp_path: Path) -> None:
    assert load_config(env={}).family("orpheus", OrpheusConfig).later_hold_ms == 0.0
    cfg = load_config(env={"RTSERVER_ORPHEUS_LATER_HOLD_MS": "30"}).family(
        "orpheus", OrpheusConfig)
    assert cfg.later_hold_ms == 30.0
    with pytest.raises(ConfigError, match=r"later_hold_ms 300.0: from 0 \(off\) to 250"):
        load_config(env={}, flags={"orpheus.later_hold_ms": 300})
    folder = str(write_tiny_orpheus(tmp_path / "m", shape="tiny"))
    engine_config = _engine_config(cfg, "none", folder)
    assert engine_config.later_hold_s == pytest.approx(0.03)
    pytest.importorskip("vllm")
    from rtserver.engine.vllm_engine import VllmEngine

    assert VllmEngine(engine_config).gate.hold_s == pytest.approx(0.03)
