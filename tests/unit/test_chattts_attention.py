"""The Triton decode attention (``chattts.decode_attention = "triton"``): equal to
torch's masked SDPA, kernel alone and through the engine (Triton's interpreter on
CPU tensors, in a subprocess: the interpreter is chosen when Triton is imported),
and compiled for an H100 (sm_90) by Triton's own compiler, which checks what the
interpreter does not (the loop's types)."""

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
    import asyncio, os, sys
    import numpy as np
    import torch
    import torch.nn.functional as F
    from rtserver.voices.chattts.engine.attention import decode_attention

    torch.manual_seed(0)
    # kernel alone: rows fewer than slots, grouped heads, a row at 0, rows past
    # the length (capped), a length off the 64-position block, bf16
    for b, heads, kv, slots, cap, length, dtype in (
            (5, 4, 4, 8, 300, 256, torch.float32), (3, 4, 2, 4, 130, 100, torch.float32),
            (6, 4, 4, 7, 200, 200, torch.bfloat16)):
        q = torch.randn(b, heads, 1, 64, dtype=dtype)
        kc = torch.randn(slots, kv, cap, 64, dtype=dtype)
        vc = torch.randn(slots, kv, cap, 64, dtype=dtype)
        pos = torch.randint(0, length + 20, (b, 3))[:, 1]  # a column, as the runner's
        pos[0] = 0
        got = decode_attention(q, kc, vc, pos, length)
        mask = (torch.arange(length)[None, :] <= pos[:, None])[:, None, None]
        k = kc[:b, :, :length].repeat_interleave(heads // kv, 1)
        v = vc[:b, :, :length].repeat_interleave(heads // kv, 1)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        tol = 2e-6 if dtype == torch.float32 else 1e-2
        err = (got.float() - ref).abs().max().item()
        assert got.shape == ref.shape and err < tol, (b, heads, kv, length, dtype, err)

    # through the engine: the same requests, the same codes either way
    from tests.unit.test_chattts_engine import collect, request, running
    from rtserver.voices.chattts.assets import load_lm_assets
    from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig
    from rtserver.voices.chattts.engine.model import ChatLM
    assets = load_lm_assets(sys.argv[1])

    async def run(attention):
        def factory():
            return ChatLM(assets.config, assets.gpt, assets.embed, slots=3, max_len=160,
                          attention=attention)
        engine = TorchCodeEngine(factory, TorchEngineConfig(), eos_id=assets.config.eos_id)
        reqs = [request(assets, "a", "hello world", 11, 14),
                request(assets, "b", "one two three", 12, 9),
                request(assets, "c", "good day", 13, 12)]
        async with running(engine):
            return await asyncio.gather(*(collect(engine, r) for r in reqs))

    dense, own = asyncio.run(run("sdpa")), asyncio.run(run("triton"))
    for (c1, h1), (c2, h2) in zip(dense, own, strict=True):
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_allclose(h1, h2, atol=1e-4)
    print("interpreted ok", [len(c) for c, _ in own])
''')


def test_equal_to_masked_sdpa_alone_and_through_the_engine(tmp_path: Path) -> None:
    from rtserver.tools.layouts.chattts import write_tiny_chattts

    write_tiny_chattts(tmp_path / "ck", decoder=False)
    script = tmp_path / "interpreted.py"
    script.write_text(INTERPRETED)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ck")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interpreted ok [14, 9, 12]" in done.stdout


def test_the_kernel_compiles_for_an_h100() -> None:
    """Triton's compiler (no GPU needed) builds it for sm_90 at the real head size."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rtserver.voices.chattts.engine.attention import _build

    names = ["q_ptr", "k_ptr", "v_ptr", "pos_ptr", "out_ptr", "length", "scale", "sp",
             "sq_b", "sq_h", "sk_b", "sk_h", "sk_t", "sv_b", "sv_h", "sv_t", "so_b", "so_h"]
    types = ["*bf16"] * 3 + ["*i64", "*bf16", "i32", "fp32"] + ["i32"] * 11
    signature = dict(zip(names, types, strict=True)) | dict.fromkeys(
        ("GROUP", "D", "BLOCK"), "constexpr")
    src = ASTSource(fn=_build(), signature=signature,
                    constexprs={"GROUP": 1, "D": 64, "BLOCK": 64})
    kernel = compile(src, target=GPUTarget("cuda", 90, 32))
    assert "decode_kernel" in kernel.asm["ptx"] and kernel.asm["cubin"]


def test_auto_picks_the_kernel_where_triton_can_run_it() -> None:
    """``decode_attention = "auto"`` (the default): the kernel where Triton can
    run it (``triton_usable``), where it measured faster; SDPA elsewhere."""
    import torch

    from rtserver.voices.chattts.config import ChatTTSConfig
    from rtserver.voices.chattts.engine.model import ATTENTIONS, resolve_attention

    cuda = torch.device("cuda")
    assert ChatTTSConfig().decode_attention == "auto"
    assert resolve_attention("auto", cuda, lambda d: True) == "triton"
    assert resolve_attention("auto", cuda, lambda d: False) == "sdpa"
    assert resolve_attention("auto", torch.device("cpu")) == "sdpa"
    assert resolve_attention("sdpa", cuda, lambda d: True) == "sdpa"
    with pytest.raises(ValueError, match="one of auto, sdpa, triton"):
        resolve_attention("flash", torch.device("cuda"))
    # the config (torch-free) accepts the same names, and refuses others at start
    for name in ATTENTIONS:
        ChatTTSConfig(decode_attention=name).check()
    with pytest.raises(ValueError, match=r"chattts\.decode_attention 'flash'"):
        ChatTTSConfig(decode_attention="flash").check()
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="runs on CUDA"):
            resolve_attention("triton", torch.device("cpu"))


def test_triton_usable_on_cuda_from_sm80_only() -> None:
    """Triton's supported NVIDIA GPUs are compute capability 8.0+: an older GPU
    or the CPU keeps torch's layers under "auto"."""
    import torch

    from rtserver.engine.triton_usable import triton_usable

    cuda = torch.device("cuda")
    assert triton_usable(cuda, lambda d: (9, 0))
    assert triton_usable(cuda, lambda d: (8, 0))
    assert not triton_usable(cuda, lambda d: (7, 5))
    assert not triton_usable(torch.device("cpu"), lambda d: (9, 0))
