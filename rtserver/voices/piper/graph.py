"""Split a Piper (VITS) ONNX graph at its waveform decoder's input.

A Piper voice is one graph: text encoder, duration predictor and flow make
the latent ``z`` (``[batch, channels, frames]``), then a HiFi-GAN decoder
turns ``z`` into audio. The decoder is purely convolutional, so it can run
on windows of ``z`` (``rtserver.vocoder.chunking``); the front runs once per
sentence. ``split_voice`` cuts the graph with ``onnx.utils.Extractor`` at the
decoder's input, found from the graph's structure (any Piper export, however
its tensors are named), measures the decoder's hop and receptive field by
perturbation, and caches the two graphs and the figures on disk.

The decoder is stored with its 1-D convolutions as 2-D ones of height 1
(``as_conv2d``): onnxruntime's CPU kernels run those faster (joe-medium,
one thread: 12-15% less CPU time for 48-200 frames on this 2-core CPU; the
outputs agree to 2e-7). The split checks the two agree and keeps the 1-D
graph where the rewrite does not apply.

Finding the cut: the decoder's first upsampling layer is the graph's first
``ConvTranspose`` (the encoder, duration predictor and flow have none). Its
input is ``LeakyRelu(conv_pre(z))``, or ``LeakyRelu(conv_pre(z) + cond(g))``
for a multi-speaker voice (VITS ``Generator.forward``); ``z`` and the speaker
embedding ``g`` are those two convolutions' inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtserver.errors import ConfigError

# Bump when the files or the figures in the cache change meaning.
# 3: the front also outputs the phoneme durations (``find_durations``).
CACHE_VERSION = 3
_ACTIVATIONS = ("LeakyRelu", "Relu")
# Ops that work on a [batch, channels, 1, time] tensor as on [batch, channels, time]
_RANK_FREE = frozenset({"LeakyRelu", "Relu", "Tanh", "Add", "Sub", "Mul", "Div", "Identity"})


@dataclass(frozen=True, slots=True)
class DecoderCut:
    """Tensor names at the decoder's input: ``z``, and ``g`` if multi-speaker."""

    z: str
    g: str | None


@dataclass(frozen=True, slots=True)
class SplitVoice:
    """The two graphs of one voice and what was measured about the decoder."""

    front: Path  # phoneme ids, lengths, scales (, sid) -> z (, g) (, durations)
    decoder: Path  # z (, g) -> audio
    cut: DecoderCut
    hop: int  # output samples per frame of z
    # One-sided receptive field in output samples: changing frame t of z
    # changes no sample more than this before t's span or after it.
    support: int
    conv2d: bool = False  # the decoder's convolutions were made 2-D (``as_conv2d``)
    # The front's last output is each phoneme id's duration in frames of z
    # (VITS ``w_ceil``; ``find_durations``); False: the graph has none.
    durations: bool = False


def find_decoder_cut(model: Any) -> DecoderCut:
    """The decoder's input tensors in an ``onnx.ModelProto`` of a Piper voice."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    weights = {t.name: list(t.dims) for t in graph.initializer}
    up = next((n for n in graph.node if n.op_type == "ConvTranspose"), None)
    if up is None:
        raise ConfigError("not a Piper VITS graph: no ConvTranspose (decoder upsampling)")
    node = producer.get(up.input[0])
    while node is not None and node.op_type in _ACTIVATIONS:
        node = producer.get(node.input[0])
    if node is None:
        raise ConfigError("not a Piper VITS graph: nothing computes the decoder's input")
    convs = [node] if node.op_type == "Conv" else [
        producer[x] for x in node.input if x in producer and producer[x].op_type == "Conv"]
    if node.op_type not in ("Conv", "Add") or len(convs) != (1 if node.op_type == "Conv" else 2):
        raise ConfigError(f"not a Piper VITS graph: the decoder starts with {node.op_type}, "
                          "expected Conv (or Conv + speaker Conv)")
    if len(convs) == 1:
        return DecoderCut(z=convs[0].input[0], g=None)
    # conv_pre has a wide kernel (7); the speaker projection ``cond`` is 1 wide.
    kernels = [weights.get(c.input[1], [0, 0, 0])[-1] for c in convs]
    if kernels[0] == kernels[1]:
        raise ConfigError("not a Piper VITS graph: cannot tell conv_pre from the speaker conv")
    pre, cond = (convs[0], convs[1]) if kernels[0] > kernels[1] else (convs[1], convs[0])
    return DecoderCut(z=pre.input[0], g=cond.input[0])


def find_durations(model: Any) -> str | None:
    """The tensor holding each phoneme id's duration in frames of ``z``, or None.

    VITS ``infer`` (Piper's export): ``w = exp(logw) * x_mask * length_scale;
    w_ceil = ceil(w)``, and ``z`` has ``sum(w_ceil)`` frames (each id's
    encoder output repeated ``w_ceil`` times by ``generate_path``). The
    graph's only ``Ceil`` is that one; ``_split_into`` checks the sum on a
    real run before trusting it.
    """
    ceils = [n for n in model.graph.node if n.op_type == "Ceil"]
    return str(ceils[0].output[0]) if len(ceils) == 1 else None


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rtserver`` (``~/.cache/rtserver``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rtserver"


def split_voice(model_path: Path, cache_dir: Path | None = None) -> SplitVoice:
    """The voice's split graphs, from the cache or made (and cached) now.

    The cache key is the model file's SHA-256, so a changed file is split
    again. A cache folder that cannot be written falls back to a temporary
    one (the split then happens on every start: a few seconds).
    """
    digest = _sha256(model_path)
    root = (cache_dir.expanduser() if cache_dir else default_cache_dir()) / "piper-split"
    folder = root / f"{digest[:24]}-v{CACHE_VERSION}"
    found = _load_cached(folder)
    if found is not None:
        return found
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".split-", dir=root))
    except OSError:
        work = Path(tempfile.mkdtemp(prefix="rtserver-piper-split-"))
        folder = work / "split"
    try:
        _split_into(model_path, work)
        try:
            work.rename(folder)  # atomic: another process may have won; both are valid
        except OSError:
            if _load_cached(folder) is None:
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    split = _load_cached(folder)
    if split is None:
        raise ConfigError(f"Piper voice {model_path}: the split graphs did not load back")
    return split


def _split_into(model_path: Path, out: Path) -> None:
    import onnx
    import onnx.shape_inference
    import onnx.utils

    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # onnx raises DecodeError and friends
        raise ConfigError(f"Piper voice model {model_path}: {exc}") from None
    cut = find_decoder_cut(model)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    cut_names = [cut.z] + ([cut.g] if cut.g else [])
    # The extractor needs a value_info for each new input/output: infer them,
    # and declare any the inference missed (rank 3 float: [batch, ch, time]).
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is best effort; the declarations below suffice
        pass
    known = {v.name for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    for name in cut_names:
        if name not in known:
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT, ["batch", "channels", "time"]))
    extractor = onnx.utils.Extractor(model)
    durations = find_durations(model)
    front_outputs = cut_names + ([durations] if durations else [])
    onnx.save(extractor.extract_model(inputs, front_outputs), str(out / "front.onnx"))
    if durations and not _durations_match(out / "front.onnx"):
        durations = None  # not w_ceil after all: the front without it
        onnx.save(extractor.extract_model(inputs, cut_names), str(out / "front.onnx"))
    decoder = extractor.extract_model(cut_names, outputs)
    onnx.save(decoder, str(out / "decoder.onnx"))
    hop, support = measure_decoder(out / "front.onnx", out / "decoder.onnx", cut)
    flat = as_conv2d(decoder)
    two_d = flat is not None and _same_output(out, flat, cut)
    if flat is not None and two_d:
        onnx.save(flat, str(out / "decoder.onnx"))
    meta = {"version": CACHE_VERSION, "z": cut.z, "g": cut.g, "hop": hop, "support": support,
            "decoder_conv2d": two_d, "durations": durations is not None,
            "onnx": onnx.__version__}
    (out / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


def as_conv2d(decoder: Any) -> Any | None:
    """The decoder with each Conv/ConvTranspose made 2-D (height 1), its
    inputs unsqueezed to ``[b, c, 1, t]``; None if some node is not rank-free."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    inputs = {i.name for i in graph.input}
    outputs = {o.name for o in graph.output}
    convs = [n for n in graph.node if n.op_type in ("Conv", "ConvTranspose")]
    rest = [n for n in graph.node if n.op_type not in ("Conv", "ConvTranspose")]
    tail = [n for n in rest if n.op_type in ("Unsqueeze", "Squeeze") and n.output[0] in outputs]
    for node in rest:
        if node in tail:
            continue
        if node.op_type not in _RANK_FREE:
            return None
        for x in node.input:  # a constant of rank 3 would broadcast differently
            if x in weights and len(weights[x].dims) >= 3:
                return None
    for node in convs:
        w = weights.get(node.input[1])
        if w is None or len(w.dims) != 3:
            return None
        array = numpy_helper.to_array(w)
        w.CopyFrom(numpy_helper.from_array(array.reshape(*array.shape[:2], 1, array.shape[2]),
                                           w.name))
        attrs = []
        for a in node.attribute:
            ints = list(a.ints)
            if a.name in ("kernel_shape", "strides", "dilations"):
                attrs.append(helper.make_attribute(a.name, [1, *ints]))
            elif a.name == "pads":
                attrs.append(helper.make_attribute(a.name, [0, ints[0], 0, ints[1]]))
            elif a.name in ("output_padding", "output_shape"):
                attrs.append(helper.make_attribute(a.name, [0 if a.name == "output_padding"
                                                            else 1, *ints]))
            else:
                attrs.append(a)
        del node.attribute[:]
        node.attribute.extend(attrs)
    axis = "rtserver_axis2"
    graph.initializer.append(numpy_helper.from_array(np.asarray([2], dtype=np.int64), axis))
    head = []
    for name in inputs:
        head.append(helper.make_node("Unsqueeze", [name, axis], [f"{name}/rtserver_2d"]))
        for node in graph.node:
            node.input[:] = [f"{name}/rtserver_2d" if x == name else x for x in node.input]
    body = []
    for node in graph.node:
        if node in tail:  # [b, 1, t] -> [b, 1, 1, t] is already the 2-D shape: keep it
            body.append(helper.make_node("Identity", [node.input[0]], list(node.output)))
        else:
            body.append(node)
    if not tail:  # back to 3-D for outputs that were 3-D
        squeezes = []
        for node in body:
            for i, name in enumerate(node.output):
                if name in outputs:
                    node.output[i] = f"{name}/rtserver_4d"
                    squeezes.append(helper.make_node("Squeeze", [node.output[i], axis], [name]))
        body.extend(squeezes)
    del graph.node[:]
    graph.node.extend(head + body)
    del graph.value_info[:]  # outputs keep their rank (Identity or Squeeze above)
    used = {x for node in graph.node for x in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return None
    return model


def _same_output(folder: Path, flat: Any, cut: DecoderCut) -> bool:
    """The 2-D decoder gives the 1-D one's audio (random z of 64 frames)."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    try:
        one = onnxruntime.InferenceSession(str(folder / "decoder.onnx"), sess_options=opts,
                                           providers=["CPUExecutionProvider"])
        two = onnxruntime.InferenceSession(flat.SerializeToString(), sess_options=opts,
                                           providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feed = {name: rng.standard_normal((1, ch, 64 if name == cut.z else 1)).astype(np.float32)
                for name, ch in input_channels(flat).items()}
        a = np.asarray(one.run(None, feed)[0]).reshape(-1)
        b = np.asarray(two.run(None, feed)[0]).reshape(-1)
    except Exception:  # onnxruntime's own errors: the rewrite does not apply
        return False
    return a.shape == b.shape and float(np.max(np.abs(a - b))) <= 1e-4 * max(
        1e-6, float(np.max(np.abs(a))))


def input_channels(model: Any) -> dict[str, int]:
    """Graph input -> its channels, from the weight of the conv that reads it."""
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    found: dict[str, int] = {}
    names = {i.name for i in model.graph.input}
    unsqueezed = {n.output[0]: n.input[0] for n in model.graph.node
                  if n.op_type == "Unsqueeze" and n.input[0] in names}
    for node in model.graph.node:
        if node.op_type == "Conv":
            source = unsqueezed.get(node.input[0], node.input[0])
            if source in names and node.input[1] in weights:
                found[source] = weights[node.input[1]][1]
    return found


def _load_cached(folder: Path) -> SplitVoice | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    front, decoder = folder / "front.onnx", folder / "decoder.onnx"
    if meta.get("version") != CACHE_VERSION or not (front.is_file() and decoder.is_file()):
        return None
    return SplitVoice(front=front, decoder=decoder,
                      cut=DecoderCut(z=str(meta["z"]), g=meta["g"] and str(meta["g"])),
                      hop=int(meta["hop"]), support=int(meta["support"]),
                      conv2d=bool(meta.get("decoder_conv2d", False)),
                      durations=bool(meta.get("durations", False)))


def _durations_match(front: Path) -> bool:
    """The front's last output has one duration per phoneme id and they add
    up to the frames of ``z`` (its first output), on a few phoneme ids."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(front), sess_options=opts,
                                           providers=["CPUExecutionProvider"])
    ids = np.arange(1, 25, dtype=np.int64)[None, :] % 40 + 1
    try:
        got = session.run(None, _front_feed(session, ids))
    except Exception:  # onnxruntime's own errors: no usable durations
        return False
    z, durations = np.asarray(got[0]), np.asarray(got[-1]).reshape(-1)
    return durations.size == ids.shape[1] and round(float(durations.sum())) == z.shape[2]


def _front_feed(session: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The front's inputs for phoneme ``ids`` ([1, n]) with Piper's default scales."""
    feed: dict[str, np.ndarray] = {}
    for inp in session.get_inputs():
        if inp.name == "input":
            feed[inp.name] = ids
        elif inp.name == "input_lengths":
            feed[inp.name] = np.asarray([ids.shape[1]], dtype=np.int64)
        elif inp.name == "scales":
            feed[inp.name] = np.asarray([0.667, 1.0, 0.8], dtype=np.float32)
        elif inp.name == "sid":
            feed[inp.name] = np.asarray([0], dtype=np.int64)
        else:
            raise ConfigError(f"Piper front graph has an unknown input {inp.name!r}")
    return feed


def measure_decoder(front: Path, decoder: Path, cut: DecoderCut, *, frames: int = 96,
                    positions: int = 3, seed: int = 0) -> tuple[int, int]:
    """``(hop, support)`` of the decoder, measured by perturbation.

    ``z`` is random with the spread of a real one (from the front on a few
    phoneme ids); one frame at a time gets a large random change, and the
    support is the farthest output sample, beyond the frame's own span,
    that changed at all. Unaffected samples are bit-identical (same shapes,
    same kernels), so "at all" is exact. The window doubles until the change
    stays inside it.
    """
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    front_s = onnxruntime.InferenceSession(str(front), sess_options=opts,
                                           providers=["CPUExecutionProvider"])
    dec_s = onnxruntime.InferenceSession(str(decoder), sess_options=opts,
                                         providers=["CPUExecutionProvider"])
    feed = _front_feed(front_s, np.arange(1, 33, dtype=np.int64)[None, :] % 40 + 1)
    got = front_s.run(None, feed)
    z_real = np.asarray(got[0], dtype=np.float32)
    g = np.asarray(got[1], dtype=np.float32) if cut.g else None
    rng = np.random.default_rng(seed)
    while True:
        z = (rng.standard_normal((1, z_real.shape[1], frames)) * (z_real.std() or 1.0)
             ).astype(np.float32)
        base = _decode(dec_s, cut, z, g)
        hop = base.size // frames
        if hop * frames != base.size:
            raise ConfigError(f"Piper decoder: {base.size} samples for {frames} frames")
        support = 0
        for t in np.linspace(frames // 3, 2 * frames // 3, positions).astype(int):
            zp = z.copy()
            zp[:, :, t] += (3.0 * z.std() * rng.standard_normal(z.shape[1])).astype(np.float32)
            changed = np.nonzero(_decode(dec_s, cut, zp, g) != base)[0]
            if changed.size:
                support = max(support, int(t * hop - changed.min()),
                              int(changed.max() + 1 - (t + 1) * hop))
        if support < (frames // 3) * hop or frames >= 4096:
            return hop, support
        frames *= 2


def _decode(session: Any, cut: DecoderCut, z: np.ndarray, g: np.ndarray | None) -> np.ndarray:
    feed = {cut.z: z} if g is None or cut.g is None else {cut.z: z, cut.g: g}
    return np.asarray(session.run(None, feed)[0], dtype=np.float32).reshape(-1)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise ConfigError(f"Piper voice model {path}: {exc}") from None
    return h.hexdigest()
