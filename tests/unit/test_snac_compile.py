"""The SNAC decode for torch.compile: depthwise convolutions as shifted sums
give the convolution's output, and a compiled decode (traced by dynamo; the
CPU test runs the traced graph as is, without inductor's kernels: those need
a GPU's measurement, ``measure.snac --compile``) gives the eager decode's
audio for batches of windows of different lengths and positions, with four
traces for them all."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rtserver.tools.measure.snac import random_codes
from rtserver.vocoder.chunking import SNAC24_EXACT_SUPPORT
from rtserver.voices.orpheus.snac_model import CodeWindow, SnacDecoder
from rtserver.voices.orpheus.snac_net import (
    SNAC24_CONFIG,
    TINY_SNAC_CONFIG,
    ShiftedDepthwise,
    build_snac,
    decoder_support,
)


@pytest.mark.parametrize("dilation", [1, 3, 9])
def test_shifted_depthwise_is_the_convolution(dilation: int) -> None:
    torch.manual_seed(dilation)
    conv = nn.Conv1d(16, 16, kernel_size=7, dilation=dilation, padding=3 * dilation, groups=16)
    x = torch.randn(3, 16, 50)
    with torch.no_grad():
        torch.testing.assert_close(ShiftedDepthwise(conv)(x), conv(x), rtol=1e-5, atol=1e-5)


def test_only_depthwise_stride_one_convolutions_swap() -> None:
    with pytest.raises(ValueError, match="depthwise"):
        ShiftedDepthwise(nn.Conv1d(16, 16, kernel_size=7, padding=3))
    with pytest.raises(ValueError, match="depthwise"):
        ShiftedDepthwise(nn.Conv1d(16, 16, kernel_size=7, stride=2, groups=16))


def test_the_swap_keeps_the_reach() -> None:
    d = SnacDecoder(build_snac(SNAC24_CONFIG, seed=0), compile=True,
                    compile_backend="aot_eager")
    swapped = [m for m in d.decoder.modules() if isinstance(m, ShiftedDepthwise)]
    assert len(swapped) == 13  # the latent's depthwise conv and 3 per decoder block
    assert decoder_support(d.decoder, d.hop) == SNAC24_EXACT_SUPPORT


def test_a_compiled_decode_is_the_eager_decode() -> None:
    torch._dynamo.reset()
    traces: list[int] = []

    def traced(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        traces.append(len(gm.graph.nodes))
        return gm.forward  # the traced graph as is (inductor's kernels need a GPU's test)

    eager = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=4))
    compiled = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=4), compile=True,
                           compile_backend=traced)
    codes = random_codes(40, seed=5)
    rng = np.random.default_rng(6)
    scale = 0.0
    for batch in ([7], [5, 3, 9], [2, 2], [12, 1, 6, 4], [1], [3, 8], [4, 11, 2, 2, 5]):
        windows = []
        for n in batch:
            start = int(rng.integers(0, 40 - n))
            windows.append(CodeWindow(codes[start:start + n], start))
        want = eager.decode(windows)
        got = compiled.decode(windows)
        for w, g, e in zip(windows, got, want, strict=True):
            assert g.shape == e.shape == (w.n_frames * eager.samples_per_frame,)
            scale = scale or float(np.abs(e).mean())
            np.testing.assert_allclose(g, e, atol=1e-5 * max(scale, 1e-3), rtol=0)
    # one trace each for one row, one frame, rows of one length (no masks), and
    # the general case: later shapes reuse them (dynamic shapes)
    assert len(traces) == 4
