"""The Piper decoder in onnxruntime's blocked layout: same audio, no reorders.

Small generated decoders in Piper's shape (conv_pre, LeakyRelu, stride-2 and
stride-4 ConvTranspose upsampling, residual blocks, the multi-resolution
average, conv_post, Tanh), with channel counts that onnxruntime's NCHWc
kernels take (multiples of 16).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from rtserver.voices.piper.blocked import blocked_decoder, polyphase, session_options
from rtserver.voices.piper.graph import as_conv2d


def _plain(model: onnx.ModelProto | bytes) -> onnxruntime.InferenceSession:
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return onnxruntime.InferenceSession(data, sess_options=opts,
                                        providers=["CPUExecutionProvider"])


def _decoder(*, speakers: bool) -> onnx.ModelProto:
    """A 1-D Piper-like decoder z [1, 32, T] (, g [1, 3, 1]) -> [1, 1, 8T], made 2-D."""
    rng = np.random.default_rng(3)
    inits: list[onnx.TensorProto] = []

    def w(name: str, *shape: int) -> str:
        scale = 1.0 / np.sqrt(np.prod(shape[1:]))
        inits.append(numpy_helper.from_array(
            (scale * rng.standard_normal(shape)).astype(np.float32), name))
        return name

    inputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 32, "T"])]
    nodes = [helper.make_node("Conv", ["z", w("pre.w", 64, 32, 7), w("pre.b", 64)], ["pre"],
                              pads=[3, 3])]
    x = "pre"
    if speakers:
        inputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 3, 1]))
        nodes += [helper.make_node("Conv", ["g", w("cond.w", 64, 3, 1)], ["cond"]),
                  helper.make_node("Add", ["pre", "cond"], ["pre_g"])]
        x = "pre_g"
    inits.append(numpy_helper.from_array(np.asarray(2.0, dtype=np.float32), "two"))
    for i, (c_in, c_out, s) in enumerate(((64, 32, 2), (32, 16, 4))):
        nodes += [
            helper.make_node("LeakyRelu", [x], [f"a{i}"], alpha=0.1),
            helper.make_node("ConvTranspose", [f"a{i}", w(f"up{i}.w", c_in, c_out, 2 * s),
                                               w(f"up{i}.b", c_out)], [f"u{i}"],
                             strides=[s], pads=[s // 2, s // 2]),
        ]
        branches = []
        for k, kernel in enumerate((3, 5)):  # two residual blocks, averaged
            y = f"u{i}"
            for j in range(2):
                name = f"r{i}{k}{j}"
                nodes += [helper.make_node("LeakyRelu", [y], [name + "a"], alpha=0.1),
                          helper.make_node("Conv", [name + "a", w(name + ".w", c_out, c_out,
                                                                   kernel),
                                                    w(name + ".b", c_out)], [name + "c"],
                                           pads=[kernel // 2, kernel // 2]),
                          helper.make_node("Add", [name + "c", y], [name])]
                y = name
            branches.append(y)
        nodes += [helper.make_node("Add", branches, [f"sum{i}"]),
                  helper.make_node("Div", [f"sum{i}", "two"], [f"avg{i}"])]
        x = f"avg{i}"
    nodes += [helper.make_node("LeakyRelu", [x], ["last"], alpha=0.01),
              helper.make_node("Conv", ["last", w("post.w", 1, 16, 7)], ["post"], pads=[3, 3]),
              helper.make_node("Tanh", ["post"], ["output"])]
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, "S"])
    model = helper.make_model(helper.make_graph(nodes, "decoder", inputs, [out], inits),
                              opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    flat = as_conv2d(model)
    assert flat is not None
    return flat


def _feed(frames: int, speakers: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {"z": rng.standard_normal((1, 32, frames)).astype(np.float32)}
    if speakers:
        feed["g"] = rng.standard_normal((1, 3, 1)).astype(np.float32)
    return feed


def test_polyphase_convolutions_equal_the_conv_transpose() -> None:
    model = _decoder(speakers=False)
    poly = polyphase(model)
    assert not [n for n in poly.graph.node if n.op_type == "ConvTranspose"]
    a, b = _plain(model), _plain(poly)
    for frames in (1, 2, 13, 40):
        want = a.run(None, _feed(frames, False))[0]
        got = b.run(None, _feed(frames, False))[0]
        assert got.shape == want.shape == (1, 1, 8 * frames)
        assert np.max(np.abs(got - want)) <= 1e-5


def test_a_conv_transpose_of_another_shape_is_left_alone() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1, "T"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 1, "S"])
    weight = numpy_helper.from_array(np.ones((16, 16, 1, 3), dtype=np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[1, 2],
                            pads=[0, 1, 0, 1])  # kernel 3, stride 2: not 2s
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [weight]))
    assert [n.op_type for n in polyphase(model).graph.node] == ["ConvTranspose"]


@pytest.mark.parametrize("speakers", [False, True])
def test_the_blocked_decoder_gives_the_same_audio(tmp_path: Path, speakers: bool) -> None:
    model = _decoder(speakers=speakers)
    path = tmp_path / "decoder.onnx"
    onnx.save(model, str(path))
    blocked = blocked_decoder(path, "z")
    if blocked is None:  # onnxruntime made no NCHWc kernels: only on CPUs without AVX
        opts = onnxruntime.SessionOptions()
        opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
        onnxruntime.InferenceSession(str(path), sess_options=opts,
                                     providers=["CPUExecutionProvider"])
        ops = {n.domain for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
        assert "com.microsoft.nchwc" not in ops
        pytest.skip("no NCHWc kernels on this CPU")
    graph = onnx.load_from_string(blocked).graph
    kinds = [n.op_type for n in graph.node]
    # one reorder in (after z) and one out (before the output conv's result)
    assert kinds.count("ReorderInput") == 1 and kinds.count("ReorderOutput") == 1
    assert "ConvTranspose" not in kinds
    # the residual adds went into the convolutions (their sum input)
    assert kinds.count("Add") < 4 + speakers
    plain = _plain(model)
    fast = onnxruntime.InferenceSession(blocked, sess_options=session_options(1),
                                        providers=["CPUExecutionProvider"])
    for frames in (1, 5, 17, 64):
        feed = _feed(frames, speakers, seed=frames)
        want = plain.run(None, feed)[0]
        got = fast.run(None, feed)[0]
        assert got.shape == want.shape
        assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))
