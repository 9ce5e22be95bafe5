"""Shapes of ChatTTS's audio checkpoints and the decoders' receptive field. Pure.

The numbers are upstream's (2noise/ChatTTS ``ChatTTS/config/config.py``: classes
``Decoder``, ``DVAE``, ``VQ`` and ``Vocos``); the tensor names and shapes per file
follow the modules upstream loads them into (``ChatTTS/model/dvae.py`` ``DVAE``,
whose decode path the Decoder also uses, and gemelo-ai/vocos ``Vocos`` with
``VocosBackbone`` + ``ISTFTHead``, ``padding="center"``).

One GPT step is two mel frames (the DVAE class splits each step's vector into
two halves, the first half is frame ``2t``, the second ``2t+1``) of hop 256 at
24 kHz: 512 samples, 46.875 steps per second.
"""

from __future__ import annotations

from dataclasses import dataclass

SAMPLE_RATE = 24000
STEP_SAMPLES = 512  # 2 mel frames x hop 256 (upstream FeatureExtractorInitArgs)
SHAPE = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MelDecoderDims:
    """One ``DVAEDecoder`` stack (conv_in, ``n_layer`` dilated ConvNeXt blocks, conv_out)."""

    idim: int  # channels per mel frame in; a step carries 2 * idim values
    odim: int  # conv_out channels (== idim for the decoders: out_conv reads idim)
    hidden: int
    n_layer: int
    bn_dim: int
    kernel: int = 7  # upstream DVAEDecoder defaults
    dilation: int = 2

    def __post_init__(self) -> None:
        for name in ("idim", "odim", "hidden", "n_layer", "bn_dim", "kernel", "dilation"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kernel % 2 != 1:
            raise ValueError("kernel must be odd")

    def reach_frames(self) -> int:
        """Mel frames one input frame reaches on either side: conv_in's two
        kernel-3 convs, each block's dilated depthwise conv (conv_out is 1x1)."""
        return 2 + self.n_layer * self.dilation * (self.kernel // 2)


@dataclass(frozen=True, slots=True)
class VQDims:
    """The DVAE's GFSQ: ``G`` groups of ``R`` residual FSQ layers over ``levels``."""

    dim: int = 1024
    levels: tuple[int, ...] = (5, 5, 5, 5)
    groups: int = 2
    residual: int = 2

    @property
    def n_codes(self) -> int:
        """Codes per GPT step (``num_vq``): one per group and residual layer."""
        return self.groups * self.residual

    @property
    def codebook_size(self) -> int:
        size = 1
        for level in self.levels:
            size *= level
        return size


@dataclass(frozen=True, slots=True)
class VocosDims:
    """Vocos: ``VocosBackbone`` (ConvNeXt, kernel 7) and ``ISTFTHead``."""

    n_mels: int = 100
    dim: int = 512
    intermediate: int = 1536
    n_layers: int = 8
    n_fft: int = 1024
    hop: int = 256
    kernel: int = 7  # vocos.models / vocos.modules, fixed upstream

    def reach_frames(self) -> int:
        """Frames one mel frame reaches on either side before the ISTFT."""
        return (self.kernel // 2) * (1 + self.n_layers)


@dataclass(frozen=True, slots=True)
class ChatTTSAudioDims:
    """Everything in the three files (the DVAE encoder only so the layout is whole)."""

    decoder: MelDecoderDims
    dvae_decoder: MelDecoderDims
    dvae_encoder: MelDecoderDims
    vq: VQDims
    vocos: VocosDims
    n_mels: int = 100

    def __post_init__(self) -> None:
        if self.vocos.hop * 2 != STEP_SAMPLES:
            raise ValueError(f"vocos hop must be {STEP_SAMPLES // 2} (2 frames per GPT step)")
        if self.vq.dim != 2 * self.dvae_decoder.idim:
            raise ValueError("vq dim must be twice the DVAE decoder idim")
        if self.vq.dim % self.vq.groups:
            raise ValueError("vq dim must divide into its groups")
        for d in (self.decoder, self.dvae_decoder):
            if d.odim != d.idim:
                raise ValueError("a decoder's odim must equal its idim (out_conv reads idim)")
        if self.vocos.n_mels != self.n_mels:
            raise ValueError(f"Vocos reads {self.vocos.n_mels} mel bins, "
                             f"the decoder makes {self.n_mels}")

    @property
    def gpt_hidden(self) -> int:
        """Width of one hidden state the Decoder route takes (768 upstream)."""
        return 2 * self.decoder.idim


REAL_DIMS = ChatTTSAudioDims(
    decoder=MelDecoderDims(idim=384, odim=384, hidden=512, n_layer=12, bn_dim=128),
    dvae_decoder=MelDecoderDims(idim=512, odim=512, hidden=256, n_layer=12, bn_dim=128),
    dvae_encoder=MelDecoderDims(idim=512, odim=1024, hidden=256, n_layer=12, bn_dim=128),
    vq=VQDims(),
    vocos=VocosDims(),
)


def tiny_dims(gpt_hidden: int = 768) -> ChatTTSAudioDims:
    """Tiny widths and depths; the real kernels, dilation, mel count, FFT and hop."""
    if gpt_hidden < 2 or gpt_hidden % 2:
        raise ValueError("gpt_hidden must be even (each step splits into two mel frames)")
    return ChatTTSAudioDims(
        decoder=MelDecoderDims(idim=gpt_hidden // 2, odim=gpt_hidden // 2, hidden=16,
                               n_layer=2, bn_dim=8),
        dvae_decoder=MelDecoderDims(idim=8, odim=8, hidden=16, n_layer=2, bn_dim=8),
        dvae_encoder=MelDecoderDims(idim=8, odim=16, hidden=16, n_layer=1, bn_dim=8),
        vq=VQDims(dim=16),
        vocos=VocosDims(dim=16, intermediate=24, n_layers=2),
    )


def exact_support(decoder: MelDecoderDims, vocos: VocosDims) -> int:
    """Output samples one GPT step can change beyond its own 512, on either side.

    Step t feeds mel frames 2t and 2t+1; the mel decoder spreads them by
    ``decoder.reach_frames()`` frames (+1 for out_conv, kernel 3), Vocos by
    ``vocos.reach_frames()``, and the ISTFT puts frame f's window on samples
    ``[f*hop - n_fft/2, f*hop + n_fft/2)``. Left reach ``R*hop + n_fft/2``, right
    ``(R+1)*hop + n_fft/2 - hop``; the larger is returned. Real shapes: R = 75 + 27
    = 102 frames, 26624 samples = 52 steps = 1.11 s (upstream's "about +-1.1 s").
    """
    r = decoder.reach_frames() + 1 + vocos.reach_frames()
    left = r * vocos.hop + vocos.n_fft // 2
    right = (r + 1) * vocos.hop + vocos.n_fft // 2 - STEP_SAMPLES
    return max(left, right)


def decoder_file_shapes(d: ChatTTSAudioDims) -> dict[str, SHAPE]:
    """``asset/Decoder.safetensors``: a ``DVAE`` without encoder or VQ."""
    shapes: dict[str, SHAPE] = {"coef": (1, d.n_mels, 1)}
    shapes.update(_stack_shapes(d.decoder, "decoder."))
    shapes["out_conv.weight"] = (d.n_mels, d.decoder.idim, 3)
    return shapes


def dvae_decode_shapes(d: ChatTTSAudioDims) -> dict[str, SHAPE]:
    """The part of ``asset/DVAE.safetensors`` the decode path reads."""
    shapes: dict[str, SHAPE] = {"coef": (1, d.n_mels, 1)}
    shapes.update(_stack_shapes(d.dvae_decoder, "decoder."))
    shapes["out_conv.weight"] = (d.n_mels, d.dvae_decoder.idim, 3)
    per_group = d.vq.dim // d.vq.groups
    cdim = len(d.vq.levels)
    for g in range(d.vq.groups):
        p = f"vq_layer.quantizer.rvqs.{g}."
        shapes[p + "project_in.weight"] = (cdim, per_group)
        shapes[p + "project_in.bias"] = (cdim,)
        shapes[p + "project_out.weight"] = (per_group, cdim)
        shapes[p + "project_out.bias"] = (per_group,)
    return shapes


def dvae_encoder_shapes(d: ChatTTSAudioDims) -> dict[str, SHAPE]:
    """The rest of ``asset/DVAE.safetensors`` (the encoder: unused here, present upstream)."""
    dim = d.dvae_decoder.idim
    n_bins = d.vocos.n_fft // 2 + 1
    shapes: dict[str, SHAPE] = {
        "downsample_conv.0.weight": (dim, d.n_mels, 3), "downsample_conv.0.bias": (dim,),
        "downsample_conv.2.weight": (dim, dim, 4), "downsample_conv.2.bias": (dim,),
        "preprocessor_mel.mel_spec.spectrogram.window": (d.vocos.n_fft,),
        "preprocessor_mel.mel_spec.mel_scale.fb": (n_bins, d.n_mels),
    }
    shapes.update(_stack_shapes(d.dvae_encoder, "encoder."))
    return shapes


def vocos_file_shapes(d: ChatTTSAudioDims) -> dict[str, SHAPE]:
    """``asset/Vocos.safetensors``: feature extractor buffers, backbone, ISTFT head."""
    v = d.vocos
    n_bins = v.n_fft // 2 + 1
    shapes: dict[str, SHAPE] = {
        "feature_extractor.mel_spec.spectrogram.window": (v.n_fft,),
        "feature_extractor.mel_spec.mel_scale.fb": (n_bins, v.n_mels),
        "backbone.embed.weight": (v.dim, v.n_mels, v.kernel), "backbone.embed.bias": (v.dim,),
        "backbone.norm.weight": (v.dim,), "backbone.norm.bias": (v.dim,),
        "backbone.final_layer_norm.weight": (v.dim,), "backbone.final_layer_norm.bias": (v.dim,),
        "head.out.weight": (v.n_fft + 2, v.dim), "head.out.bias": (v.n_fft + 2,),
        "head.istft.window": (v.n_fft,),
    }
    for i in range(v.n_layers):
        p = f"backbone.convnext.{i}."
        shapes.update({
            p + "dwconv.weight": (v.dim, 1, v.kernel), p + "dwconv.bias": (v.dim,),
            p + "norm.weight": (v.dim,), p + "norm.bias": (v.dim,),
            p + "pwconv1.weight": (v.intermediate, v.dim), p + "pwconv1.bias": (v.intermediate,),
            p + "pwconv2.weight": (v.dim, v.intermediate), p + "pwconv2.bias": (v.dim,),
            p + "gamma": (v.dim,),
        })
    return shapes


def _stack_shapes(m: MelDecoderDims, prefix: str) -> dict[str, SHAPE]:
    h = m.hidden
    shapes: dict[str, SHAPE] = {
        prefix + "conv_in.0.weight": (m.bn_dim, m.idim, 3), prefix + "conv_in.0.bias": (m.bn_dim,),
        prefix + "conv_in.2.weight": (h, m.bn_dim, 3), prefix + "conv_in.2.bias": (h,),
        prefix + "conv_out.weight": (m.odim, h, 1),
    }
    for i in range(m.n_layer):
        p = f"{prefix}decoder_block.{i}."
        shapes.update({
            p + "dwconv.weight": (h, 1, m.kernel), p + "dwconv.bias": (h,),
            p + "norm.weight": (h,), p + "norm.bias": (h,),
            p + "pwconv1.weight": (4 * h, h), p + "pwconv1.bias": (4 * h,),
            p + "pwconv2.weight": (h, 4 * h), p + "pwconv2.bias": (h,),
            p + "weight": (h,),
        })
    return shapes


def narrow_dims(gpt_hidden: int = 768) -> ChatTTSAudioDims:
    """The real depths, kernels and dilation (so the real receptive field) with
    narrow widths: seam tests of the real reach at a fraction of the cost."""
    if gpt_hidden < 2 or gpt_hidden % 2:
        raise ValueError("gpt_hidden must be even (each step splits into two mel frames)")
    return ChatTTSAudioDims(
        decoder=MelDecoderDims(idim=gpt_hidden // 2, odim=gpt_hidden // 2, hidden=64,
                               n_layer=12, bn_dim=32),
        dvae_decoder=MelDecoderDims(idim=32, odim=32, hidden=64, n_layer=12, bn_dim=32),
        dvae_encoder=MelDecoderDims(idim=32, odim=64, hidden=32, n_layer=1, bn_dim=16),
        vq=VQDims(dim=64),
        vocos=VocosDims(dim=64, intermediate=192, n_layers=8),
    )
