"""The decode step's op count: each op is a kernel in the step's CUDA graph."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.tools.measure.chattts_ops import count_decode_ops


def test_a_layer_of_a_decode_step_runs_31_ops(tmp_path: Path) -> None:
    ckpt = str(write_tiny_chattts(tmp_path, shape="tiny", decoder=False))
    c = count_decode_ops(ckpt, "bfloat16")
    # 2 norms x 8, qkv, rotary (q and k in one pass: roll, 2 mul, add), 2 cache
    # writes, attention, o, residual, gate/up, silu, mul, down, residual; 41 with
    # the rotary tables cast in every layer and q, k rotated apart
    assert c.per_layer == 31
    # outside the layers: the table rows (2), the mask (arange, le), the code
    # embeddings (index, sum), the final norm (8): no table is cast or negated
    assert c.rest == 17
    assert c.by_name["aten::roll"] == c.layers  # one rotary pass a layer
    assert "aten::neg" not in c.by_name  # the sine's sign is in its table
