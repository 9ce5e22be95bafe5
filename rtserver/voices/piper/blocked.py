"""The Piper decoder in onnxruntime's blocked channel layout from end to end.

onnxruntime's CPU optimizer runs 2-D convolutions with its NCHWc kernels
(channels in blocks of 16 with AVX-512, 8 with AVX2), reordering each
convolution's input into the blocked layout and its output back, because the
ops between them have no blocked form: LeakyRelu, the residual Adds (they
read a ConvTranspose's output) and ConvTranspose. Profiled on
en_US-joe-medium (140 frames, one thread): convolutions 67 %, ConvTranspose
14 %, Add 7 %, the 34 reorders 9 %, LeakyRelu 3 %.

``blocked_decoder`` keeps the whole decoder blocked:

- ``polyphase`` (standard ONNX): a ConvTranspose of stride ``s``, kernel
  ``2s`` and padding ``s/2`` becomes two 2-tap Convs (the output phases that
  read input frames ``t-1, t`` and ``t, t+1``), a channel Concat and an
  interleave (Reshape, Transpose, Reshape). The same sums, as convolutions.
- ``block`` (onnxruntime's optimized graph, so for this machine only):
  elementwise ops run on blocked tensors as they are (layout does not matter
  to them, and every tensor they combine has the same shape), each residual
  Add becomes its convolution's sum input, and the interleave is done on the
  blocked layout.

The result is checked against the plain decoder on random input; when it
differs, or the optimizer made no blocked kernels, the plain decoder is used.
On this 2-core x86 (AVX-512), windows of 20-300 frames: 8-13 % less CPU time
per frame, outputs equal to 1e-7 (``python -m
rtserver.tools.measure.piper blocked``).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("rtserver.piper")

NCHWC = "com.microsoft.nchwc"
# Ops that compute each element from the same element of their inputs.
_ELEMENTWISE = frozenset({"Add", "LeakyRelu", "Div", "Mul", "Sub", "Tanh", "Relu", "Identity"})
# Channel block sizes of onnxruntime's NCHWc kernels (MLAS): AVX-512, AVX2.
_BLOCKS = (16, 8)


def blocked_decoder(decoder: Path, z: str) -> bytes | None:
    """The blocked decoder (a serialized model) for this machine, or None.

    ``decoder``: the 2-D decoder graph; ``z``: its latent input (any other
    input is a speaker embedding, one frame long).
    """
    import onnx

    from rtserver.voices.piper.graph import input_channels

    try:
        model = onnx.load(str(decoder))
        inputs = input_channels(model)
        if z not in inputs:
            return None
        poly = polyphase(model)
        with tempfile.TemporaryDirectory(prefix="rtserver-piper-") as tmp:
            optimized = _optimized(poly, Path(tmp))
        if not any(n.domain == NCHWC for n in optimized.graph.node):
            return None  # no blocked kernels on this machine: nothing to keep
        plain = model.SerializeToString()
        for block in _BLOCKS:
            candidate = block_layout(optimized, block, z).SerializeToString()
            if _same_output(plain, candidate, inputs, z):
                return candidate
    except Exception as exc:  # onnx/onnxruntime errors: keep the plain decoder
        log.warning("blocked Piper decoder not used: %s", exc)
    return None


def session_options(threads: int) -> Any:
    """Options for the blocked graph: already optimized, so not again."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Spinning threads steal the cores other streams' calls need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def polyphase(model: Any) -> Any:
    """``model`` with each ConvTranspose of kernel ``2s`` and padding ``s/2``
    (2-D, height 1) made two Convs, a Concat and an interleave; others stay."""
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    nodes: list[Any] = []
    for node in graph.node:
        parts = _polyphase_nodes(node, weights, graph.initializer, helper, numpy_helper)
        nodes.extend(parts if parts is not None else [node])
    del graph.node[:]
    graph.node.extend(nodes)
    used = {x for n in graph.node for x in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out


def _polyphase_nodes(node: Any, weights: dict[str, Any], initializers: Any, helper: Any,
                     numpy_helper: Any) -> list[Any] | None:
    if node.op_type != "ConvTranspose" or node.input[1] not in weights:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    w = numpy_helper.to_array(weights[node.input[1]])  # [c_in, c_out, 1, k]
    if w.ndim != 4 or w.shape[2] != 1:
        return None
    s = int(attrs.get("strides", [1, 1])[1])
    k = int(w.shape[3])
    pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    plain = (attrs.get("group", 1) == 1 and list(attrs.get("dilations", [1, 1])) == [1, 1]
             and not any(attrs.get("output_padding", [])) and "output_shape" not in attrs)
    if not (plain and s >= 2 and k == 2 * s and 2 * pads[1] == s and pads[1] == pads[3]
            and pads[0] == pads[2] == 0):
        return None
    c_in, c_out = int(w.shape[0]), int(w.shape[1])
    p = s // 2
    if len(node.input) > 2 and node.input[2] in weights:
        bias = numpy_helper.to_array(weights[node.input[2]]).astype(np.float32)
    else:
        bias = np.zeros(c_out, dtype=np.float32)
    # Output sample t*s + r reads kernel tap m = r + p (input t) and, for r < s - p,
    # tap r + p + s (input t - 1), else tap r + p - s (input t + 1).
    name = node.name or node.output[0]
    parts: list[Any] = []
    outs: list[str] = []
    for group, label, conv_pads in (((r for r in range(s) if r < s - p), "a", [0, 1, 0, 0]),
                                    ((r for r in range(s) if r >= s - p), "b", [0, 0, 0, 1])):
        phases = list(group)
        kernel = np.zeros((len(phases) * c_out, c_in, 1, 2), dtype=np.float32)
        for j, r in enumerate(phases):
            rows = slice(j * c_out, (j + 1) * c_out)
            q = r + p
            if label == "a":  # taps: input t - 1, input t
                kernel[rows, :, 0, 0], kernel[rows, :, 0, 1] = w[:, :, 0, q + s].T, w[:, :, 0, q].T
            else:  # taps: input t, input t + 1
                kernel[rows, :, 0, 0], kernel[rows, :, 0, 1] = w[:, :, 0, q].T, w[:, :, 0, q - s].T
        wn, bn, on = f"{name}/poly_{label}.w", f"{name}/poly_{label}.b", f"{name}/poly_{label}"
        initializers.append(numpy_helper.from_array(kernel, wn))
        initializers.append(numpy_helper.from_array(np.tile(bias, len(phases)), bn))
        parts.append(helper.make_node("Conv", [node.input[0], wn, bn], [on], kernel_shape=[1, 2],
                                      pads=conv_pads, strides=[1, 1], dilations=[1, 1]))
        outs.append(on)
    cat, split, merged = f"{name}/poly", f"{name}/poly_phases", f"{name}/poly_shape"
    initializers.append(numpy_helper.from_array(np.asarray([0, s, c_out, -1], np.int64), split))
    initializers.append(numpy_helper.from_array(np.asarray([0, c_out, 1, -1], np.int64), merged))
    parts += [helper.make_node("Concat", outs, [cat], axis=1),  # channel r * c_out + c
              helper.make_node("Reshape", [cat, split], [cat + "/split"]),  # [n, s, c, t]
              helper.make_node("Transpose", [cat + "/split"], [cat + "/t"], perm=[0, 2, 3, 1]),
              helper.make_node("Reshape", [cat + "/t", merged], list(node.output))]
    return parts


def _optimized(model: Any, tmp: Path) -> Any:
    """onnxruntime's own optimized graph of ``model`` on this machine."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # it warns that the file is machine-specific: it is
    options.optimized_model_filepath = str(tmp / "optimized.onnx")
    onnxruntime.InferenceSession(model.SerializeToString(), sess_options=options,
                                 providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp / "optimized.onnx"))


def _toposort(graph: Any) -> list[Any]:
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, order = list(graph.node), []
    while pending:
        left = []
        for node in pending:
            if all(x in ready for x in node.input):
                order.append(node)
                ready.update(node.output)
            else:
                left.append(node)
        if len(left) == len(pending):
            raise ValueError("the optimized graph has a cycle or a missing input")
        pending = left
    return order


class _Layouts:
    """Each tensor's plain (NCHW) and blocked names, made on demand."""

    def __init__(self, nodes: list[Any], helper: Any) -> None:
        self.nodes = nodes
        self.helper = helper
        self.plain: dict[str, str] = {}
        self.blocked: dict[str, str] = {}
        self.channels: dict[str, int] = {}  # blocked name -> logical channels

    def need_plain(self, t: str) -> str:
        if t not in self.plain:
            b = self.blocked[t]
            self.plain[t] = b + "/plain"
            self.nodes.append(self.helper.make_node(
                "ReorderOutput", [b], [self.plain[t]], domain=NCHWC, channels=self.channels[b]))
        return self.plain[t]

    def need_blocked(self, t: str) -> str:
        if t not in self.blocked:
            self.blocked[t] = self.plain[t] + "/blocked"
            self.nodes.append(self.helper.make_node(
                "ReorderInput", [self.plain[t]], [self.blocked[t]], domain=NCHWC))
        return self.blocked[t]


def block_layout(optimized: Any, block: int, z: str) -> Any:
    """``optimized`` (onnxruntime's graph) kept in the blocked layout, for
    channel blocks of ``block``; ``z`` is the input as long as the audio."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(optimized)
    graph = model.graph
    consts = {t.name for t in graph.initializer} | {""}
    dims = {t.name: list(t.dims) for t in graph.initializer}
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer
              if len(t.dims) <= 1 and t.data_type == onnx.TensorProto.INT64}
    order = _toposort(graph)
    # What onnxruntime left blocked, and what depends on small inputs only (a
    # speaker embedding: broadcast, so never combined with a blocked tensor).
    scalars = {t.name for t in graph.initializer if int(np.prod(t.dims)) == 1}
    blocked_out, small = set(), {i.name for i in graph.input} - {z}
    for node in order:
        data = [x for x in node.input if x not in consts]
        if (node.domain == NCHWC and node.op_type != "ReorderOutput") or (
                node.domain != NCHWC and any(x in blocked_out for x in data)):
            blocked_out.update(node.output)
        if data and all(x in small for x in data):
            small.update(node.output)
    nodes: list[Any] = []
    lay = _Layouts(nodes, helper)
    lay.plain.update({i.name: i.name for i in graph.input})
    producer: dict[str, Any] = {}
    for node in order:
        data = [x for x in node.input if x not in consts]
        if node.domain == NCHWC and node.op_type == "ReorderOutput":
            b = lay.blocked[node.input[0]]
            lay.channels[b] = next(a.i for a in node.attribute if a.name == "channels")
            lay.blocked[node.output[0]] = b  # the plain copy only if something needs it
            continue
        if node.domain == NCHWC and node.op_type == "ReorderInput":
            if node.input[0] in lay.blocked:
                lay.blocked[node.output[0]] = lay.blocked[node.input[0]]
                continue
            node.input[0] = lay.need_plain(node.input[0])
            nodes.append(node)
            lay.blocked[node.output[0]] = node.output[0]
            continue
        interleave = _blocked_interleave(node, lay, producer, values, block, helper, numpy_helper,
                                         graph.initializer)
        if interleave is not None:
            lay.blocked[node.output[0]] = interleave
            continue
        to_blocked = (node.domain == NCHWC or node.output[0] in blocked_out or (
            node.op_type in _ELEMENTWISE and any(x in lay.blocked for x in data)
            and not any(x in small for x in data)
            and all(x in scalars for x in node.input if x in consts and x)))
        if to_blocked:
            for k, x in enumerate(node.input):
                if x in consts or (node.domain == NCHWC and k in (1, 2)):
                    continue  # weights and bias
                # a blocked kernel reads plain what onnxruntime gave it plain (a
                # convolution of under 8 channels)
                plain_in = node.domain == NCHWC and x not in blocked_out
                node.input[k] = lay.need_plain(x) if plain_in else lay.need_blocked(x)
            nodes.append(node)
            channels = _channels(node, lay, dims)
            for o in node.output:
                lay.blocked[o] = o
                lay.channels[o] = channels
                producer[o] = node
        else:
            for k, x in enumerate(node.input):
                if x not in consts:
                    node.input[k] = lay.need_plain(x)
            nodes.append(node)
            for o in node.output:
                lay.plain[o] = o
                producer[o] = node
    for out in graph.output:
        if out.name not in lay.plain:
            name = lay.need_plain(out.name)
            for node in nodes:
                node.output[:] = [out.name if x == name else x for x in node.output]
    _fuse_residuals(nodes, [o.name for o in graph.output])
    _drop_unused(nodes, [o.name for o in graph.output])
    del graph.node[:]
    graph.node.extend(nodes)
    used = {x for n in nodes for x in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def _channels(node: Any, lay: _Layouts, dims: dict[str, list[int]]) -> int:
    if node.domain == NCHWC and node.op_type == "Conv":
        return int(dims[node.input[1]][0])
    if node.op_type == "Concat":
        return sum(lay.channels[x] for x in node.input)
    return next(lay.channels[x] for x in node.input if x in lay.channels)


def _blocked_interleave(node: Any, lay: _Layouts, producer: dict[str, Any],
                        values: dict[str, Any], block: int, helper: Any, numpy_helper: Any,
                        initializers: Any) -> str | None:
    """The last Reshape of ``polyphase``'s interleave, done on the blocked
    input: ``[n, s*c/B, 1, t, B]`` viewed as ``[n, s, c/B, t, B]``, transposed
    to ``[n, c/B, t, s, B]``, which is ``[n, c, 1, t*s]`` blocked."""
    if node.op_type != "Reshape" or node.domain:
        return None
    transpose = producer.get(node.input[0])
    if transpose is None or transpose.op_type != "Transpose":
        return None
    split = producer.get(transpose.input[0])
    if split is None or split.op_type != "Reshape" or not split.input[0].endswith("/plain"):
        return None
    source = next((t for t, p in lay.plain.items() if p == split.input[0]), None)
    if source is None or source not in lay.blocked:
        return None
    shape = values.get(split.input[1])
    perm = [a.ints for a in transpose.attribute if a.name == "perm"]
    if shape is None or len(shape) != 4 or not perm or list(perm[0]) != [0, 2, 3, 1]:
        return None
    s, c = int(shape[1]), int(shape[2])
    if c % block:
        return None
    b = lay.blocked[source]
    name = node.output[0] + "/blocked"
    view = name + "/shape"
    initializers.append(numpy_helper.from_array(
        np.asarray([0, s, c // block, -1, block], np.int64), view))
    back = name + "/back"
    initializers.append(numpy_helper.from_array(np.asarray([0, c, 1, -1], np.int64), back))
    # the plain interleave (and its reorder) go unless something else reads them
    lay.nodes += [helper.make_node("Reshape", [b, view], [name + "/v"]),
                  helper.make_node("Transpose", [name + "/v"], [name + "/t"], perm=[0, 2, 3, 1, 4]),
                  helper.make_node("Reshape", [name + "/t", back], [name])]
    lay.channels[name] = c
    return name


def _fuse_residuals(nodes: list[Any], outputs: Iterable[str]) -> None:
    """``Add(conv(x), y)`` -> ``conv(x)`` with ``y`` as its sum input (NCHWc
    Conv adds its fourth input to the result) where the conv's output is used
    only there and the conv has no activation."""
    uses: dict[str, int] = {}
    for node in nodes:
        for x in node.input:
            uses[x] = uses.get(x, 0) + 1
    for o in outputs:
        uses[o] = uses.get(o, 0) + 1
    producer = {o: n for n in nodes for o in n.output}
    gone: set[int] = set()
    for node in nodes:
        if node.op_type != "Add" or node.domain or len(node.input) != 2:
            continue
        for k in (0, 1):
            conv = producer.get(node.input[k])
            if (conv is not None and conv.domain == NCHWC and conv.op_type == "Conv"
                    and uses[node.input[k]] == 1 and len(conv.input) < 4
                    and not any(a.name == "activation" for a in conv.attribute)):
                conv.input.extend([""] * (3 - len(conv.input)) + [node.input[1 - k]])
                conv.output[0] = node.output[0]
                gone.add(id(node))
                break
    nodes[:] = [n for n in nodes if id(n) not in gone]


def _drop_unused(nodes: list[Any], outputs: Iterable[str]) -> None:
    """Remove nodes whose outputs nothing reads, until none is left."""
    while True:
        used = {x for n in nodes for x in n.input} | set(outputs)
        kept = [n for n in nodes if any(o in used for o in n.output)]
        if len(kept) == len(nodes):
            return
        nodes[:] = kept


def _same_output(plain: bytes, blocked: bytes, inputs: dict[str, int], z: str) -> bool:
    """Both decoders give the same audio for random input of 37 and 64 frames."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    one = onnxruntime.InferenceSession(plain, sess_options=opts,
                                       providers=["CPUExecutionProvider"])
    two = onnxruntime.InferenceSession(blocked, sess_options=session_options(1),
                                       providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for frames in (37, 64):
        feed = {name: rng.standard_normal((1, ch, frames if name == z else 1)).astype(np.float32)
                for name, ch in inputs.items()}
        try:
            a = np.asarray(one.run(None, feed)[0]).reshape(-1)
            b = np.asarray(two.run(None, feed)[0]).reshape(-1)
        except Exception:  # onnxruntime's own errors: the rewrite does not run here
            return False
        if a.shape != b.shape or float(np.max(np.abs(a - b))) > 1e-4 * max(
                1e-6, float(np.max(np.abs(a)))):
            return False
    return True


__all__ = ["block_layout", "blocked_decoder", "polyphase", "session_options"]
