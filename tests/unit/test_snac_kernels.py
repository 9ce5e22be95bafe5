"""SNAC's fused Snake and depthwise-convolution kernels (``[orpheus.vocoder]
snake_conv = "triton"``): equal to torch's layers, kernels alone and through a
decoder's batched decode (Triton's interpreter on CPU tensors, in a subprocess:
the interpreter is chosen when Triton is imported); compiled for an H100
(sm_90) by Triton's own compiler; refused where they cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

INTERPRETED = textwrap.dedent('''
    import numpy as np
    import torch
    from snac.layers import snake as upstream_snake
    from torch import nn
    from rtserver.tools.measure.snac import random_codes
    from rtserver.voices.orpheus.snac_kernels import (
        FusedResidualUnit, MaskedSnake, depthwise_snake, snake)
    from rtserver.voices.orpheus.snac_model import CodeWindow, SnacDecoder
    from rtserver.voices.orpheus.snac_net import TINY_SNAC_CONFIG, build_snac

    torch.manual_seed(0)
    # kernels alone: rows longer than a program's block, a mask scale, bf16
    x = torch.randn(3, 5, 2100) * 3
    alpha = torch.rand(1, 5, 1) + 0.3
    ref = upstream_snake(x, alpha)
    assert (snake(x, alpha) - ref).abs().max() < 1e-5
    keep = torch.tensor([2, 5, 1])
    kept = torch.arange(2100)[None, None, :] < (keep * 400)[:, None, None]
    assert (snake(x, alpha, keep, 400) - ref * kept).abs().max() < 1e-5
    for dilation in (1, 3, 9):
        conv = nn.Conv1d(5, 5, 7, dilation=dilation, padding=3 * dilation, groups=5)
        with torch.no_grad():
            want = upstream_snake(conv(x), alpha)
            got = depthwise_snake(x, conv.weight, conv.bias, dilation, 3 * dilation, alpha)
            assert (got - want).abs().max() < 1e-4, dilation
            half = depthwise_snake(x.bfloat16(), conv.weight.bfloat16(), conv.bias.bfloat16(),
                                   dilation, 3 * dilation, alpha.bfloat16())
            assert half.dtype == torch.bfloat16
            assert (half.float() - want).abs().max() < 0.1 * want.abs().max(), dilation

    # through a decoder: windows of one length (no masks) and of several (masks)
    eager = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=4), snake_conv="torch")
    fused = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=4), snake_conv="triton")
    kinds = [type(m).__name__ for m in fused.decoder.modules()]
    assert kinds.count("FusedResidualUnit") == 12 and kinds.count("MaskedSnake") == 5, kinds
    assert fused.support == eager.support
    codes = random_codes(30, seed=5)
    for starts in ([4], [0, 11]):
        sizes = [1] if len(starts) == 1 else [2, 1]
        windows = [CodeWindow(codes[s:s + n], s) for s, n in zip(starts, sizes)]
        for w, g, e in zip(windows, fused.decode(windows), eager.decode(windows), strict=True):
            assert g.shape == e.shape == (w.n_frames * 2048,)
            err = float(np.abs(g - e).max())
            assert err < 1e-5 * float(np.abs(e).mean()) + 1e-7, (starts, err)
    print("interpreted ok")
''')


def test_equal_to_torch_layers_alone_and_through_a_decode(tmp_path: Path) -> None:
    script = tmp_path / "interpreted.py"
    script.write_text(INTERPRETED)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interpreted ok" in done.stdout


@pytest.mark.parametrize("which", [0, 1])
def test_the_kernels_compile_for_an_h100(which: int) -> None:
    """Triton's compiler (no GPU needed) builds both for sm_90, float32 activations."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rtserver.voices.orpheus.snac_kernels import BLOCK_T, _build

    if which == 0:
        names = ["x_ptr", "alpha_ptr", "keep_ptr", "out_ptr", "channels", "t_len", "scale"]
        types = ["*fp32", "*fp32", "*i64", "*fp32", "i32", "i32", "i32"]
        constexprs = {"HAS_KEEP": True, "BLOCK": BLOCK_T}
    else:
        names = ["x_ptr", "w_ptr", "bias_ptr", "alpha_ptr", "out_ptr", "channels", "t_len",
                 "dilation", "padding"]
        types = ["*fp32"] * 5 + ["i32"] * 4
        constexprs = {"K": 7, "BLOCK": BLOCK_T}
    kernel_fn = _build()[which]
    signature = dict(zip(names, types, strict=True)) | dict.fromkeys(constexprs, "constexpr")
    kernel = compile(ASTSource(fn=kernel_fn, signature=signature, constexprs=constexprs),
                     target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"] and kernel_fn.__name__ in kernel.asm["ptx"]


def test_auto_picks_the_kernels_on_cuda_only() -> None:
    """The default: torch's layers on the CPU and with compile (CUDA: the kernels,
    which the GPU run checks, bench/results/h100-2026-12-06-s24)."""
    from rtserver.vocoder.config import VocoderConfig
    from rtserver.voices.orpheus.snac_kernels import FusedResidualUnit
    from rtserver.voices.orpheus.snac_model import SnacDecoder
    from rtserver.voices.orpheus.snac_net import TINY_SNAC_CONFIG, build_snac

    assert VocoderConfig().snake_conv == "auto"
    for compile in (False, True):
        d = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), compile=compile,
                        compile_backend="aot_eager")
        assert d.snake_conv == "torch"
        assert not any(isinstance(m, FusedResidualUnit) for m in d.decoder.modules())


def test_refused_where_they_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from rtserver.vocoder.config import VocoderConfig
    from rtserver.voices.orpheus.snac_model import SnacDecoder
    from rtserver.voices.orpheus.snac_net import TINY_SNAC_CONFIG, build_snac

    with pytest.raises(ValueError, match="snake_conv"):
        VocoderConfig(snake_conv="cuda")
    with pytest.raises(ValueError, match="exclude each other"):
        VocoderConfig(snake_conv="triton", compile=True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), snake_conv="triton")
    with pytest.raises(ValueError, match="snake_conv must be one of"):
        SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), snake_conv="cuda")
