"""ChatTTS audio checkpoints: the upstream layout, loading, shape errors, the modules.

The modules were also checked once against upstream's own code (ChatTTS
``DVAE`` + vocos ``VocosBackbone``/``ISTFTHead`` on the same files): mel equal,
audio within 2e-8 (upstream's istft stops half a hop earlier); that check needs
torchaudio, so it is not repeated here. These tests pin what it established.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rtserver.errors import ConfigError
from rtserver.tools.layouts.chattts_decoder import write_tiny_decoder_assets
from rtserver.voices.chattts.decoder.checkpoint import CheckpointError, load_audio_models
from rtserver.voices.chattts.decoder.dims import (
    REAL_DIMS,
    decoder_file_shapes,
    dvae_decode_shapes,
    dvae_encoder_shapes,
    exact_support,
    tiny_dims,
    vocos_file_shapes,
)
from rtserver.voices.chattts.decoder.modules import MaskedISTFT, MelDecoder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_decoder_assets(tmp_path_factory.mktemp("chattts"), gpt_hidden=64, seed=1)


def test_files_are_in_the_upstream_layout_with_upstream_names(root: Path) -> None:
    dims = tiny_dims(64)
    files = sorted(p.name for p in (root / "asset").iterdir())
    assert files == ["DVAE.safetensors", "Decoder.safetensors", "Vocos.safetensors"]

    def shapes(name: str) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in load_file(str(root / "asset" / name)).items()}

    assert shapes("Decoder.safetensors") == decoder_file_shapes(dims)
    assert shapes("DVAE.safetensors") == {**dvae_decode_shapes(dims), **dvae_encoder_shapes(dims)}
    assert shapes("Vocos.safetensors") == vocos_file_shapes(dims)


def test_real_shapes_match_upstream_config() -> None:
    s = decoder_file_shapes(REAL_DIMS)
    assert s["decoder.conv_in.0.weight"] == (128, 384, 3)  # idim 384 -> bn_dim 128
    assert s["decoder.decoder_block.11.pwconv1.weight"] == (2048, 512)  # hidden 512, 12 layers
    assert s["out_conv.weight"] == (100, 384, 3) and s["coef"] == (1, 100, 1)
    d = dvae_decode_shapes(REAL_DIMS)
    assert d["vq_layer.quantizer.rvqs.1.project_out.weight"] == (512, 4)  # 1024 / G=2, 4 levels
    v = vocos_file_shapes(REAL_DIMS)
    assert v["backbone.convnext.7.pwconv1.weight"] == (1536, 512)
    assert v["head.out.weight"] == (1026, 512)  # n_fft + 2
    # upstream's theoretical reach: about +-52 steps, +-1.1 s
    assert exact_support(REAL_DIMS.decoder, REAL_DIMS.vocos) == 26624 == 52 * 512


@pytest.mark.parametrize("route", ["decoder", "dvae"])
def test_loader_reads_widths_from_the_files(root: Path, route: str) -> None:
    mel, _, dims = load_audio_models(root, route)  # type: ignore[arg-type]
    assert dims.gpt_hidden == 64 if route == "decoder" else dims.vq.n_codes == 4
    written = load_file(str(root / "asset" / ("Decoder.safetensors" if route == "decoder"
                                              else "DVAE.safetensors")))
    for k, v in mel.state_dict().items():
        assert torch.equal(v, written[k]), k


def test_missing_file_is_named(tmp_path: Path) -> None:
    write_tiny_decoder_assets(tmp_path, gpt_hidden=32)
    (tmp_path / "asset" / "Vocos.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"Vocos\.safetensors: file not found") as info:
        load_audio_models(tmp_path)
    assert isinstance(info.value, ConfigError)  # reported at start-up, never to a client
    # the DVAE file is only needed for the DVAE route
    (tmp_path / "asset" / "DVAE.safetensors").unlink()
    write_tiny_decoder_assets(tmp_path / "b", gpt_hidden=32)
    (tmp_path / "b" / "asset" / "DVAE.safetensors").unlink()
    load_audio_models(tmp_path / "b", "decoder")
    with pytest.raises(CheckpointError, match=r"DVAE\.safetensors: file not found"):
        load_audio_models(tmp_path / "b", "dvae")


def _rewrite(path: Path, edit: dict[str, torch.Tensor | None]) -> None:
    state = load_file(str(path))
    for k, v in edit.items():
        if v is None:
            del state[k]
        else:
            state[k] = v
    save_file(state, str(path))


def test_missing_or_misshapen_tensor_is_named(tmp_path: Path) -> None:
    write_tiny_decoder_assets(tmp_path, gpt_hidden=32)
    dec = tmp_path / "asset" / "Decoder.safetensors"
    _rewrite(dec, {"out_conv.weight": None})
    with pytest.raises(CheckpointError, match=r"Decoder\.safetensors: missing tensor.*out_conv"):
        load_audio_models(tmp_path)
    write_tiny_decoder_assets(tmp_path, gpt_hidden=32)
    _rewrite(dec, {"decoder.decoder_block.1.pwconv2.weight": torch.zeros(3, 3)})
    with pytest.raises(CheckpointError, match=r"decoder_block\.1\.pwconv2\.weight has shape"):
        load_audio_models(tmp_path)
    write_tiny_decoder_assets(tmp_path, gpt_hidden=32)
    voc = tmp_path / "asset" / "Vocos.safetensors"
    _rewrite(voc, {"backbone.convnext.1.gamma": torch.zeros(5)})
    with pytest.raises(CheckpointError, match=r"Vocos\.safetensors: tensor backbone\.convnext"):
        load_audio_models(tmp_path)
    (tmp_path / "asset" / "Vocos.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"Vocos\.safetensors: not a readable"):
        load_audio_models(tmp_path)


def test_decoder_and_vocos_that_do_not_fit_are_named(tmp_path: Path) -> None:
    write_tiny_decoder_assets(tmp_path, gpt_hidden=32)
    voc = tmp_path / "asset" / "Vocos.safetensors"
    _rewrite(voc, {"backbone.embed.weight": torch.zeros(16, 80, 7)})  # 80 mels, decoder has 100
    with pytest.raises(CheckpointError, match="Vocos"):
        load_audio_models(tmp_path)


def test_masked_istft_is_torch_istft_center() -> None:
    gen = torch.Generator().manual_seed(0)
    spec = torch.randn(2, 513, 9, 2, generator=gen)
    istft = MaskedISTFT(1024, 256)
    ours = istft(spec[..., 0], spec[..., 1], torch.ones(2, 1, 9))
    ref = torch.istft(torch.complex(spec[..., 0], spec[..., 1]), 1024, 256, 1024,
                      torch.hann_window(1024), center=True, length=9 * 256)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    # a masked row equals its unpadded self
    short = istft(spec[:1, :, :5, 0], spec[:1, :, :5, 1], torch.ones(1, 1, 5))
    mask = (torch.arange(9) < 5).float().view(1, 1, 9)
    padded = istft(spec[:1, ..., 0], spec[:1, ..., 1], mask)
    torch.testing.assert_close(padded[:, :5 * 256], short, rtol=1e-5, atol=1e-6)


def test_padding_is_exact_in_the_mel_decoder(root: Path) -> None:
    mel, vocos, _ = load_audio_models(root)
    assert isinstance(mel, MelDecoder)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 64, 30, generator=gen)
    alone = vocos(mel(x[..., :17], torch.ones(1, 1, 34)), torch.ones(1, 1, 34))
    garbage = x.clone()
    garbage[..., 17:] = 1e3  # whatever sits in the padding must not leak
    mask = (torch.arange(60) < 34).float().view(1, 1, 60)
    padded = vocos(mel(garbage, mask), mask)
    torch.testing.assert_close(padded[:, :17 * 512], alone, rtol=1e-5, atol=1e-6)
