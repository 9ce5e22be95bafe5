"""Load ChatTTS's audio checkpoints from the upstream folder layout; never a hub.

    root/asset/Decoder.safetensors   hidden states -> mel (the default route)
    root/asset/DVAE.safetensors      codes -> mel (the DVAE route; its encoder is skipped)
    root/asset/Vocos.safetensors     mel -> 24 kHz audio

Widths and depths are read off the tensors (so tiny test checkpoints load with
the same code) and every tensor the decode path needs is checked against the
shapes they imply (``dims``); a missing file, a missing tensor or a wrong shape
raises ``CheckpointError`` naming the file and the tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from rtserver.errors import ConfigError
from rtserver.voices.chattts.decoder.dims import (
    ChatTTSAudioDims,
    MelDecoderDims,
    VocosDims,
    VQDims,
    decoder_file_shapes,
    dvae_decode_shapes,
    vocos_file_shapes,
)
from rtserver.voices.chattts.decoder.modules import MelDecoder, Vocos, init_random_

Route = Literal["decoder", "dvae"]
DECODER_FILE = "asset/Decoder.safetensors"
DVAE_FILE = "asset/DVAE.safetensors"
VOCOS_FILE = "asset/Vocos.safetensors"


class CheckpointError(ConfigError):
    """A model file is missing, unreadable or does not have the expected tensors."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of one file (CPU), or ``CheckpointError`` naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


def check_shapes(path: Path, state: dict[str, torch.Tensor],
                 expected: dict[str, tuple[int, ...]]) -> None:
    """Every expected tensor present with its shape and a float dtype."""
    missing = sorted(k for k in expected if k not in state)
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"{path}: missing tensor(s) {', '.join(missing[:3])}{more}")
    for key, shape in expected.items():
        got = tuple(state[key].shape)
        if got != shape:
            raise CheckpointError(f"{path}: tensor {key} has shape {got}, expected {shape}")
        if not state[key].is_floating_point():
            raise CheckpointError(f"{path}: tensor {key} has dtype {state[key].dtype}, "
                                  "expected a float type")


def _count(state: dict[str, torch.Tensor], prefix: str) -> int:
    n = 0
    while f"{prefix}{n}.dwconv.weight" in state:
        n += 1
    return n


def _need(path: Path, state: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"{path}: missing tensor {key}")
    return state[key]


def _stack_dims(path: Path, state: dict[str, torch.Tensor], prefix: str) -> MelDecoderDims:
    w0 = _need(path, state, prefix + "conv_in.0.weight")
    w1 = _need(path, state, prefix + "conv_in.2.weight")
    wo = _need(path, state, prefix + "conv_out.weight")
    dw = _need(path, state, prefix + "decoder_block.0.dwconv.weight")
    if w0.ndim != 3 or w1.ndim != 3 or wo.ndim != 3 or dw.ndim != 3:
        raise CheckpointError(f"{path}: {prefix}conv weights must be 3-d")
    try:
        return MelDecoderDims(idim=int(w0.shape[1]), odim=int(wo.shape[0]),
                              hidden=int(w1.shape[0]),
                              n_layer=_count(state, prefix + "decoder_block."),
                              bn_dim=int(w0.shape[0]), kernel=int(dw.shape[2]))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {prefix}stack: {exc}") from exc


def _vocos_dims(path: Path, state: dict[str, torch.Tensor]) -> VocosDims:
    embed = _need(path, state, "backbone.embed.weight")
    pw1 = _need(path, state, "backbone.convnext.0.pwconv1.weight")
    out = _need(path, state, "head.out.weight")
    if embed.ndim != 3 or pw1.ndim != 2 or out.ndim != 2:
        raise CheckpointError(f"{path}: unexpected backbone/head weight ranks")
    return VocosDims(n_mels=int(embed.shape[1]), dim=int(embed.shape[0]),
                     intermediate=int(pw1.shape[0]), n_layers=_count(state, "backbone.convnext."),
                     n_fft=int(out.shape[0]) - 2)


def _load_into(module: nn.Module, path: Path, state: dict[str, torch.Tensor],
               expected: dict[str, tuple[int, ...]]) -> None:
    own = module.state_dict()
    if set(own) != set(expected):  # a bug in dims/modules, not in the file
        diff = sorted(set(own) ^ set(expected))
        raise AssertionError(f"module keys differ from the spec: {diff}")
    module.load_state_dict({k: state[k].float() for k in expected}, strict=True)


def _dims(mel_path: Path, mstate: dict[str, torch.Tensor], vocos_path: Path,
          mel: MelDecoderDims, vq: VQDims, vocos: VocosDims) -> ChatTTSAudioDims:
    n_mels = int(_need(mel_path, mstate, "out_conv.weight").shape[0])
    try:
        return ChatTTSAudioDims(decoder=mel, dvae_decoder=mel, dvae_encoder=mel, vq=vq,
                                vocos=vocos, n_mels=n_mels)
    except ValueError as exc:
        raise CheckpointError(f"{mel_path} and {vocos_path} do not fit together: {exc}") from exc


def load_audio_models(root: Path, route: Route = "decoder"
                      ) -> tuple[MelDecoder, Vocos, ChatTTSAudioDims]:
    """The mel decoder of ``route`` and Vocos from ``root`` (the folder holding ``asset/``)."""
    if route not in ("decoder", "dvae"):
        raise ValueError(f"route must be 'decoder' or 'dvae', not {route!r}")
    root = Path(root)
    vocos_path = root / VOCOS_FILE
    vstate = read_safetensors(vocos_path)
    vdims = _vocos_dims(vocos_path, vstate)
    if vdims.n_fft % 2 or vdims.n_fft < 2 * vdims.hop:
        raise CheckpointError(f"{vocos_path}: head.out gives n_fft {vdims.n_fft}; expected an "
                              f"even n_fft >= {2 * vdims.hop} (upstream: 1024)")
    if route == "decoder":
        mel_path = root / DECODER_FILE
        mstate = read_safetensors(mel_path)
        mdims = _stack_dims(mel_path, mstate, "decoder.")
        vq = None
        dims = _dims(mel_path, mstate, vocos_path, mdims, VQDims(dim=2 * mdims.idim), vdims)
        expected = decoder_file_shapes(dims)
    else:
        mel_path = root / DVAE_FILE
        mstate = read_safetensors(mel_path)
        mdims = _stack_dims(mel_path, mstate, "decoder.")
        pin = _need(mel_path, mstate, "vq_layer.quantizer.rvqs.0.project_in.weight")
        groups = 0
        while f"vq_layer.quantizer.rvqs.{groups}.project_out.weight" in mstate:
            groups += 1
        levels = VQDims().levels
        if int(pin.shape[0]) != len(levels):
            raise CheckpointError(f"{mel_path}: vq_layer project_in has {pin.shape[0]} outputs, "
                                  f"expected {len(levels)} (FSQ levels {levels})")
        vq = VQDims(dim=int(pin.shape[1]) * groups, levels=levels, groups=groups)
        dims = _dims(mel_path, mstate, vocos_path, mdims, vq, vdims)
        expected = dvae_decode_shapes(dims)
    check_shapes(mel_path, mstate, expected)
    check_shapes(vocos_path, vstate, vocos_file_shapes(dims))
    mel = MelDecoder(mdims, dims.n_mels, vq)
    _load_into(mel, mel_path, mstate, expected)
    vocos = Vocos(vdims)
    vexpected = {k: s for k, s in vocos_file_shapes(dims).items()
                 if not k.startswith("feature_extractor.")}
    _load_into(vocos, vocos_path, vstate, vexpected)
    return mel.eval(), vocos.eval(), dims


def random_audio_models(dims: ChatTTSAudioDims, *, seed: int = 0, layer_scale: float = 0.5
                        ) -> tuple[MelDecoder, MelDecoder, Vocos]:
    """(Decoder, DVAE decode path, Vocos) with random weights (``init_random_``),
    the same the test writer puts in the files for ``seed``."""
    decoder = MelDecoder(dims.decoder, dims.n_mels)
    init_random_(decoder, seed, layer_scale=layer_scale)
    dvae = MelDecoder(dims.dvae_decoder, dims.n_mels, dims.vq)
    init_random_(dvae, seed + 1, layer_scale=layer_scale)
    vocos = Vocos(dims.vocos)
    init_random_(vocos, seed + 3, layer_scale=layer_scale)
    return decoder.eval(), dvae.eval(), vocos.eval()
