"""Fixtures of the parity suite: one tiny random checkpoint in upstream's exact
layout, loaded by upstream's ``Chat.load(source="custom")`` and by rtserver.

Runs only in the parity venv (``scripts/setup-parity.sh``), where the
``chattts`` 0.2.5 package imports; ``tests/unit/test_chattts_parity.py`` runs
it from the main suite. Upstream's widths are set on its own ``Chat.config``
before ``load`` (its modules are built from that config; the GPT's shape comes
from ``gpt/config.json``), from the same ``tiny_dims`` the writer used.
``Chat.load(source="custom")`` checks every file of ``res/sha256_map.json``
against a hash; the map is pointed at the tiny files' hashes, so the check
still requires exactly upstream's list of files.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ChatTTS
import pytest
import torch
from ChatTTS.config import config as upcfg

from rtserver.tools.layouts.chattts import UPSTREAM_FILES, tiny_speaker_stats, write_tiny_chattts
from rtserver.voices.chattts.assets import LmAssets, load_lm_assets
from rtserver.voices.chattts.decoder.dims import ChatTTSAudioDims, MelDecoderDims, tiny_dims

SEED = 3


def sha_key(rel: str) -> str:
    """Upstream's ``check_folder`` key of ``asset/<rel>``."""
    return "sha256_asset_" + rel.replace("/", "_").replace(".", "_")


def _mel(d: MelDecoderDims) -> upcfg.Decoder:
    return upcfg.Decoder(idim=d.idim, odim=d.odim, hidden=d.hidden, n_layer=d.n_layer,
                         bn_dim=d.bn_dim)


def upstream_config(lm: LmAssets, dims: ChatTTSAudioDims, spk_stat: str) -> upcfg.Config:
    """Upstream's ``Config`` with the tiny checkpoint's widths."""
    g = lm.config
    c = upcfg.Config()
    c.gpt = upcfg.GPT(hidden_size=g.hidden_size, intermediate_size=g.intermediate_size,
                      num_attention_heads=g.num_attention_heads,
                      num_hidden_layers=g.num_hidden_layers,
                      max_position_embeddings=g.max_position_embeddings,
                      num_audio_tokens=g.num_audio_tokens, num_text_tokens=g.num_text_tokens,
                      num_vq=g.num_vq)
    c.embed = upcfg.Embed(hidden_size=g.hidden_size, num_audio_tokens=g.num_audio_tokens,
                          num_text_tokens=g.num_text_tokens, num_vq=g.num_vq)
    c.decoder = _mel(dims.decoder)
    c.dvae = upcfg.DVAE(encoder=_mel(dims.dvae_encoder), decoder=_mel(dims.dvae_decoder),
                        vq=upcfg.VQ(dim=dims.vq.dim, levels=dims.vq.levels, G=dims.vq.groups,
                                    R=dims.vq.residual))
    v = dims.vocos
    c.vocos = upcfg.Vocos(
        feature_extractor=upcfg.FeatureExtractor(init_args=upcfg.FeatureExtractorInitArgs(
            n_fft=v.n_fft, hop_length=v.hop, n_mels=v.n_mels)),
        backbone=upcfg.Backbone(init_args=upcfg.BackboneInitArgs(
            input_channels=v.n_mels, dim=v.dim, intermediate_dim=v.intermediate,
            num_layers=v.n_layers)),
        head=upcfg.FourierHead(init_args=upcfg.FourierHeadInitArgs(
            dim=v.dim, n_fft=v.n_fft, hop_length=v.hop)))
    c.spk_stat = spk_stat
    return c


@dataclass
class Pair:
    """The same checkpoint, loaded by both sides."""

    root: Path
    chat: Any  # ChatTTS.Chat
    lm: LmAssets
    dims: ChatTTSAudioDims
    spk_stat: str


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("chattts-upstream-layout")
    write_tiny_chattts(root, seed=SEED, spk_stat_file=False)
    asset = root / "asset"
    written = sorted(p.relative_to(asset).as_posix() for p in asset.rglob("*") if p.is_file())
    assert written == sorted(UPSTREAM_FILES)
    spk_stat = tiny_speaker_stats(root, seed=SEED)
    lm = load_lm_assets(root, speaker_stats=spk_stat)
    dims = tiny_dims(lm.config.hidden_size)

    chat = ChatTTS.Chat(logging.getLogger("chattts-upstream"))
    # every key upstream checks, and only those: exactly the files it downloads
    assert sorted(chat.sha256_map) == sorted(sha_key(f) for f in UPSTREAM_FILES)
    chat.sha256_map = {sha_key(f): hashlib.sha256((asset / f).read_bytes()).hexdigest()
                       for f in UPSTREAM_FILES}
    chat.config = upstream_config(lm, dims, spk_stat)
    assert chat.load(source="custom", custom_path=str(root), device=torch.device("cpu"),
                     compile=False), "upstream Chat.load refused the checkpoint"
    return Pair(root=root, chat=chat, lm=lm, dims=dims, spk_stat=spk_stat)
