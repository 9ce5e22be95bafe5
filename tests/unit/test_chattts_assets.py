"""The ChatTTS loader (upstream layout) and speaker strings."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import numpy as np
import pybase16384 as b14
import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from rtserver.errors import ConfigError, UnknownVoice  # noqa: E402
from rtserver.tools.layouts.chattts import write_tiny_chattts  # noqa: E402
from rtserver.voices.chattts.assets import AssetError, load_lm_assets  # noqa: E402
from rtserver.voices.chattts.speaker import (  # noqa: E402
    SpeakerStats,
    decode_speaker,
    encode_speaker,
    normalised,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chattts")
    write_tiny_chattts(root, decoder=False)
    return root


@pytest.fixture
def root(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path / "m")
    return tmp_path / "m"


def test_loads_and_folds_weight_norm(root: Path) -> None:
    a = load_lm_assets(root)
    assert a.config.num_vq == 4 and a.config.num_audio_tokens == 626
    assert a.config.eos_id == 625
    raw = load_file(str(root / "asset" / "Embed.safetensors"))
    g = raw["head_code.2.parametrizations.weight.original0"]
    v = raw["head_code.2.parametrizations.weight.original1"]
    # torch's own weight_norm parametrization computes the same weight
    lin = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Linear(v.shape[1], v.shape[0], bias=False))
    lin.parametrizations.weight.original0.data.copy_(g)
    lin.parametrizations.weight.original1.data.copy_(v)
    torch.testing.assert_close(a.embed.head_code[2], lin.weight.detach())
    assert a.speaker_stats is not None and a.speaker_stats.dim == a.config.hidden_size
    # the asset folder itself works as the root too
    assert load_lm_assets(root / "asset").config == a.config


@pytest.mark.parametrize("rel", ["gpt/config.json", "gpt/model.safetensors",
                                 "Embed.safetensors", "tokenizer/tokenizer.json"])
def test_missing_file_is_named(root: Path, rel: str) -> None:
    (root / "asset" / rel).unlink()
    with pytest.raises(AssetError) as exc:
        load_lm_assets(root)
    assert rel.split("/")[-1] in str(exc.value)
    assert isinstance(exc.value, ConfigError)


def test_wrong_shape_is_named(root: Path) -> None:
    path = root / "asset" / "Embed.safetensors"
    t = load_file(str(path))
    t["emb_code.1.weight"] = t["emb_code.1.weight"][:600]
    save_file(t, str(path))
    with pytest.raises(AssetError, match=r"Embed\.safetensors.*emb_code\.1\.weight.*600"):
        load_lm_assets(root)


def test_missing_key_and_config_key(root: Path) -> None:
    path = root / "asset" / "gpt" / "model.safetensors"
    t = load_file(str(path))
    del t["layers.1.mlp.down_proj.weight"]
    save_file(t, str(path))
    with pytest.raises(AssetError, match=r"model\.safetensors.*layers\.1\.mlp\.down_proj"):
        load_lm_assets(root)
    cfg_path = root / "asset" / "gpt" / "config.json"
    data = json.loads(cfg_path.read_text())
    del data["num_vq"]
    cfg_path.write_text(json.dumps(data))
    with pytest.raises(AssetError, match=r"config\.json.*num_vq"):
        load_lm_assets(root)


def test_prefixed_keys_load(root: Path) -> None:
    """Weights saved from a wrapper (``model.layers...``) load the same."""
    path = root / "asset" / "gpt" / "model.safetensors"
    t = load_file(str(path))
    before = load_lm_assets(root).gpt
    save_file({f"model.{k}": v for k, v in t.items()}, str(path))
    after = load_lm_assets(root).gpt
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_speaker_stats_from_upstream_string(root: Path) -> None:
    a = load_lm_assets(root)
    assert a.speaker_stats is not None
    text = a.speaker_stats.to_string()
    b = load_lm_assets(root, speaker_stats=text)
    assert b.speaker_stats is not None
    np.testing.assert_allclose(b.speaker_stats.mean, a.speaker_stats.mean, atol=1e-3)
    with pytest.raises(AssetError, match="speaker statistics of"):
        load_lm_assets(root, speaker_stats=SpeakerStats(
            std=np.ones(8, np.float32), mean=np.zeros(8, np.float32)).to_string())


def test_speaker_string_round_trip() -> None:
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(768).astype(np.float32)
    text = encode_speaker(vec)
    back = decode_speaker(text, 768)
    np.testing.assert_array_equal(back, vec.astype(np.float16).astype(np.float32))
    # upstream's own decoding of the string (ChatTTS Speaker._decode)
    raw = lzma.decompress(b14.decode_from_string(text), format=lzma.FORMAT_RAW,
                          filters=[{"id": lzma.FILTER_LZMA2,
                                    "preset": 9 | lzma.PRESET_EXTREME}])
    np.testing.assert_array_equal(np.frombuffer(raw, np.float16), vec.astype(np.float16))
    n = normalised(back)  # in float16, as upstream: unit length within float16 rounding
    assert abs(float(np.linalg.norm(n)) - 1.0) < 2e-3


@pytest.mark.parametrize("text,why", [
    ("", "empty"),
    ("hello", "base16384|decompress"),
    ("__SHORT__", "holds 16 values"),
    ("__LONG__", "more than the 768"),
])
def test_bad_speaker_string(text: str, why: str) -> None:
    if text == "__SHORT__":
        text = encode_speaker(np.ones(16, np.float32))
    elif text == "__LONG__":  # 100,000 values: refused without inflating them all
        text = encode_speaker(np.zeros(100_000, np.float32))
    with pytest.raises(UnknownVoice, match=why):
        decode_speaker(text, 768)


def test_seeded_samples(root: Path) -> None:
    stats = load_lm_assets(root).speaker_stats
    assert stats is not None
    a, b, c = stats.sample(1), stats.sample(1), stats.sample(2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert decode_speaker(encode_speaker(a), stats.dim).tolist() == a.tolist()
