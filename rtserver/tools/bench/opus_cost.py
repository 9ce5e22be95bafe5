"""Opus encoding: CPU time and quality by complexity and encode rate.

``python -m rtserver.tools.bench.opus_cost [--rates 48000,24000] [--complexities 10,5,3,2,1,0]``

Speech from the embedded Piper voice (``rtserver[piper]``: 22050 Hz, four
sentences) is resampled to each rate and encoded with ``OpusFramer`` (20 ms
frames, the server's ``OpusConfig`` apart from the complexity). The figures
are the encoder's CPU time (``time.process_time``, best of three) per second
of audio, the bit rate, and, when the ``pesq`` package is installed (ITU-T
P.862; for measuring only, not a dependency), wide-band PESQ of the decoded
audio against the encoder's input, both at 16 kHz (1.0 bad .. 4.64 the
best a wide-band score reaches).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rtserver.audio.opus import OpusConfig, OpusFramer
from rtserver.audio.pcm import FloatArray
from rtserver.audio.quality import pesq_wb
from rtserver.audio.resample import Resampler
from rtserver.client import decode_frames

SENTENCES = (
    "Hello there, this is the browser demo speaking.",
    "The quick brown fox jumps over the lazy dog, then naps in the warm sun.",
    "Sure, I can help with that.",
    "It took twenty minutes to get there by train, and the coffee was cold.",
)


def piper_speech() -> tuple[FloatArray, int]:
    """The sentences spoken by the embedded voice, and its rate."""
    from rtserver.voices.piper.voice import _import_piper, embedded_voice_files

    files = embedded_voice_files()
    voice = _import_piper()[0].load(files.model, config_path=files.config)
    parts = [c.audio_float_array for s in SENTENCES for c in voice.synthesize(s)]
    return np.concatenate(parts).astype(np.float32), int(voice.config.sample_rate)


def encode(x: FloatArray, rate: int, complexity: int) -> tuple[float, list[bytes], int]:
    """``(best CPU seconds, packets, pre_skip)`` of encoding ``x`` at ``rate``."""
    best = float("inf")
    packets: list[bytes] = []
    pre_skip = 0
    for _ in range(3):
        framer = OpusFramer(rate, 20, config=OpusConfig(complexity=complexity))
        t = time.process_time()
        packets = framer.push(x) + framer.finish()
        best = min(best, time.process_time() - t)
        pre_skip = framer.pre_skip
    return best, packets, pre_skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.opus_cost")
    parser.add_argument("--rates", default="48000,24000")
    parser.add_argument("--complexities", default="10,5,3,2,1,0")
    args = parser.parse_args(argv)
    speech, native = piper_speech()
    print(f"{len(speech) / native:.2f} s of Piper speech at {native} Hz; 20 ms frames, "
          f"{OpusConfig().bitrate} bit/s VBR")
    for rate in (int(r) for r in args.rates.split(",")):
        resampler = Resampler(native, rate)
        x = np.concatenate([resampler.process(speech), resampler.flush()])
        seconds = len(x) / rate
        for complexity in (int(c) for c in args.complexities.split(",")):
            cpu, packets, pre_skip = encode(x, rate, complexity)
            y = decode_frames(packets, format="opus", sample_rate=rate, frame_ms=20,
                              pre_skip=pre_skip)[:len(x)]
            kbit = sum(len(p) for p in packets) * 8 / seconds / 1000
            score = pesq_wb(x, y, rate)
            quality = "" if score is None else f", PESQ-WB {score:.2f}"
            print(f"  {rate} Hz, complexity {complexity:2d}: {1000 * cpu / seconds:5.2f} ms CPU "
                  f"per audio s, {kbit:.1f} kbit/s{quality}")


if __name__ == "__main__":
    main()
