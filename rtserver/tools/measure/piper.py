"""Measurements behind the Piper chunking and scheduling numbers.

``python -m rtserver.tools.measure.piper rf|costs|plans|blocked|batch|bf16 [--model X.onnx]``
(default: the embedded voice). Times are CPU seconds of this process
(``time.process_time``, best of a few runs), so other programs sharing the
machine disturb them less than wall time; one onnxruntime thread per call;
the decoder as the server runs it (blocked layout where that applies).

- ``rf``: the decoder's hop and receptive field (``graph.measure_decoder``),
  plus how far a change reaches above -120/-80/-60/-40 dB re the RMS.
- ``costs``: CPU seconds per second of audio of the front, the whole-sentence
  decoder, and the eager, near and bulk chunk plans, on four sentences.
- ``plans``: decoder frames run per frame of audio (windows overlap by the
  receptive field) and decodes per sentence, by plan and sentence length.
- ``blocked``: CPU time per second of audio of the plain decoder and of the
  blocked one (``blocked``), windows of 20-300 frames, runs interleaved.
- ``batch``: one onnxruntime call on B equal-length windows vs B calls; a
  ratio under 1 means batching the streams' chunks pays.
- ``bf16``: the decoder's CPU per audio s by plan, float32 (as above) vs bf16
  (``bf16``, in its shape buckets), and bf16's distance from float32
  per sentence: RMS error in dB and, with the ``pesq`` package, wide-band PESQ.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rtserver.vocoder.chunking import DecodeJob
from rtserver.voices.piper.graph import DecoderCut, split_voice
from rtserver.voices.piper.plan import PLANS, PiperChunking, chunk_config, sentence_jobs

SENTENCES = (
    "Hello there, this is the browser demo speaking.",
    "The quick brown fox jumps over the lazy dog, then naps in the warm sun.",
    "Sure, I can help with that.",
    "It took twenty minutes to get there by train, and the coffee was cold.",
)


def _session(path: Path) -> Any:
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), sess_options=opts,
                                        providers=["CPUExecutionProvider"])


def _decoder_session(path: Path, cut: DecoderCut) -> Any:
    """The decoder as the server runs it: blocked where that applies."""
    import onnxruntime

    from rtserver.voices.piper.blocked import blocked_decoder, session_options

    model = blocked_decoder(path, cut.z)
    if model is None:
        return _session(path)
    return onnxruntime.InferenceSession(model, sess_options=session_options(1),
                                        providers=["CPUExecutionProvider"])


def _cpu_s(fn: Callable[[], object], reps: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def _feed(ids: list[int]) -> dict[str, np.ndarray]:
    return {"input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([0.667, 1.0, 0.8], dtype=np.float32)}


def _dec_feed(cut: DecoderCut, z: np.ndarray) -> dict[str, np.ndarray]:
    return {cut.z: np.ascontiguousarray(z)}


def _decode_all(dec: Any, cut: DecoderCut, plans: list[tuple[np.ndarray, list[DecodeJob]]]
                ) -> None:
    for z, jobs in plans:
        for j in jobs:
            dec.run(None, _dec_feed(cut, z[:, :, j.start_frame:j.end_frame]))


def _compare_blocked(decoder: Path, cut: DecoderCut, z: np.ndarray, frame_rate: float) -> None:
    import onnxruntime

    from rtserver.voices.piper.blocked import blocked_decoder, session_options

    model = blocked_decoder(decoder, cut.z)
    if model is None:
        print("  the blocked decoder does not apply on this machine")
        return
    plain = _session(decoder)
    blocked = onnxruntime.InferenceSession(model, sess_options=session_options(1),
                                           providers=["CPUExecutionProvider"])
    print("CPU ms per audio s, one thread, median of 9 interleaved runs:")
    for length in (20, 48, 140, 300):
        feed = _dec_feed(cut, z[:, :, :length])
        times: dict[str, list[float]] = {"plain": [], "blocked": []}
        for _ in range(9):
            for name, session in (("plain", plain), ("blocked", blocked)):
                t = time.process_time()
                session.run(None, feed)
                times[name].append(time.process_time() - t)
        med = {k: sorted(v)[len(v) // 2] * 1000 * frame_rate / length for k, v in times.items()}
        print(f"  {length} frames: plain {med['plain']:.1f}, blocked {med['blocked']:.1f} "
              f"({med['blocked'] / med['plain']:.3f}x)")


def _decode_all_bf16(bf16: Any, plans: list[tuple[np.ndarray, list[DecodeJob]]]) -> None:
    for z, jobs in plans:
        for j in jobs:
            bf16.decode(z, j.start_frame, j.end_frame)


def _compare_bf16(split: Any, dec: Any, zs: list[np.ndarray], rate: int, audio_s: float
                  ) -> None:
    from rtserver.audio.quality import pesq_wb
    from rtserver.voices.piper.bf16 import Bf16Decoder, native_bf16
    from rtserver.voices.piper.plan import max_window_frames

    configs = {name: chunk_config(split.hop, split.support, rate, PiperChunking(), plan=name)
               for name in PLANS}

    bf16 = Bf16Decoder(split.decoder, split.cut, split.hop, streams=1,
                       max_frames=max(max_window_frames(c) for c in configs.values()))
    print(f"native bf16: {native_bf16()}; buckets {bf16.sizes}")
    print("decoder CPU s per audio s, one thread (float32 onnxruntime -> bf16 OpenVINO):")
    for name, cfg in configs.items():
        plans = [(z, sentence_jobs(cfg, int(z.shape[2]))) for z in zs]
        t32 = _cpu_s(functools.partial(_decode_all, dec, split.cut, plans))
        t16 = _cpu_s(functools.partial(_decode_all_bf16, bf16, plans))
        print(f"  {name}: {t32 / audio_s:.4f} -> {t16 / audio_s:.4f} ({t16 / t32:.2f}x)")
    for z in zs:
        a = np.asarray(dec.run(None, _dec_feed(split.cut, z))[0]).reshape(-1)
        b = bf16.decode(z, 0, int(z.shape[2]))
        err = 20 * np.log10(np.sqrt(np.mean((b - a) ** 2) / np.mean(a ** 2)))
        score = pesq_wb(a, b, rate)
        print(f"  {z.shape[2]} frames: bf16 {err:.1f} dB from float32 (RMS), PESQ-WB "
              f"{'n/a (no pesq package)' if score is None else f'{score:.2f}'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rtserver.tools.measure.piper")
    parser.add_argument("what", choices=["rf", "costs", "plans", "blocked", "batch", "bf16"])
    parser.add_argument("--model", type=Path, help="a Piper .onnx (default: the embedded voice)")
    args = parser.parse_args(argv)
    from rtserver.voices.piper.voice import embedded_voice_files, voice_files_from_path

    files = voice_files_from_path(args.model) if args.model else embedded_voice_files()
    split = split_voice(files.model)
    if split.cut.g is not None:
        raise SystemExit("multi-speaker voices: measure with a single-speaker one")
    front, dec = _session(split.front), _decoder_session(split.decoder, split.cut)
    from rtserver.voices.piper.voice import _import_piper

    piper = _import_piper()[0].load(files.model, config_path=files.config)
    zs = [np.asarray(front.run(None, _feed(piper.phonemes_to_ids(piper.phonemize(t)[0])))[0])
          for t in SENTENCES]
    frames = sum(int(z.shape[2]) for z in zs)
    rate = int(piper.config.sample_rate)
    audio_s = frames * split.hop / rate
    print(f"voice {files.name}: hop {split.hop}, receptive field {split.support} samples "
          f"({split.support / split.hop:.2f} frames)")
    if args.what == "rf":
        z = np.concatenate(zs, axis=2)
        base = np.asarray(dec.run(None, _dec_feed(split.cut, z))[0]).reshape(-1)
        rms = float(np.sqrt(np.mean(base ** 2)))
        rng = np.random.default_rng(0)
        reach: dict[int, int] = {}
        n = int(z.shape[2])
        for t in np.linspace(n // 4, 3 * n // 4, 5).astype(int):
            zp = z.copy()
            zp[:, :, t] += (3 * z.std() * rng.standard_normal(z.shape[1])).astype(np.float32)
            d = np.abs(np.asarray(dec.run(None, _dec_feed(split.cut, zp))[0]).reshape(-1) - base)
            for db in (-120, -80, -60, -40):
                idx = np.nonzero(d > rms * 10 ** (db / 20))[0]
                if idx.size:
                    lo, hi = t * split.hop, (t + 1) * split.hop
                    reach[db] = max(reach.get(db, 0), int(lo - idx.min()), int(idx.max() + 1 - hi))
        for db, samples in sorted(reach.items()):
            print(f"  change above {db} dB re RMS reaches {samples} samples")
    elif args.what == "costs":
        t_front = _cpu_s(lambda: [front.run(None, _feed(piper.phonemes_to_ids(
            piper.phonemize(t)[0]))) for t in SENTENCES])
        t_dec = _cpu_s(lambda: [dec.run(None, _dec_feed(split.cut, z)) for z in zs])
        print(f"{audio_s:.2f} s of audio, {frames} frames; CPU s per audio s, one thread:")
        print(f"  front (with phonemizing) {t_front / audio_s:.4f}, decoder whole "
              f"{t_dec / audio_s:.4f} (front/decoder {t_front / t_dec:.2f})")
        for name in PLANS:
            cfg = chunk_config(split.hop, split.support, rate, PiperChunking(), plan=name)
            plans = [(z, sentence_jobs(cfg, int(z.shape[2]))) for z in zs]
            window = sum(j.n_frames for _, js in plans for j in js)
            t = _cpu_s(functools.partial(_decode_all, dec, split.cut, plans))
            print(f"  decoder {name}: {sum(len(js) for _, js in plans)} chunks, windows "
                  f"{window / frames:.2f}x the frames, {t / audio_s:.4f} ({t / t_dec:.2f}x whole)")
    elif args.what == "blocked":
        _compare_blocked(split.decoder, split.cut, np.concatenate(zs, axis=2), rate / split.hop)
    elif args.what == "plans":
        lengths = (40, 80, 120, 200, 300)
        print(f"decoder frames per audio frame (decodes) for sentences of {lengths} frames:")
        for name in PLANS:
            cfg = chunk_config(split.hop, split.support, rate, PiperChunking(), plan=name)
            row = []
            for n in lengths:
                jobs = sentence_jobs(cfg, n)
                row.append(f"{sum(j.n_frames for j in jobs) / n:.2f}x ({len(jobs)})")
            print(f"  {name}: " + ", ".join(row))
    elif args.what == "bf16":
        _compare_bf16(split, dec, zs, rate, audio_s)
    else:
        z = np.concatenate(zs, axis=2)
        for length in (16, 48, 85, 140):
            w = np.ascontiguousarray(z[:, :, :length])
            one = _cpu_s(functools.partial(dec.run, None, _dec_feed(split.cut, w)), reps=5)
            row = [f"window {length} frames: 1 call {1000 * one:.1f} ms"]
            for b in (2, 4, 8):
                wb = np.ascontiguousarray(np.repeat(w, b, axis=0))
                t = _cpu_s(functools.partial(dec.run, None, _dec_feed(split.cut, wb)), reps=5)
                row.append(f"B={b} {t / b / one:.2f}x per window")
            print("  " + ", ".join(row))


if __name__ == "__main__":
    main()
