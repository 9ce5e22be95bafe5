"""The event loop's CPU per second of ChatTTS audio, in one process on the CPU.

    python -m rtserver.tools.measure.chattts_loop [--streams 24] [--seconds 15]
        [--set stream_interval=8 ...]

N users of a tiny ChatTTS (random weights: the loop's work is the real model's, 24 kHz audio
in 512-sample steps; the sound is noise) speak one sentence after another through
``ChatTTSVoice.synthesize`` for the given time, no server and no ZMQ around it. Printed: the
event loop thread's CPU time (``time.thread_time``) per second of audio made, the part of
issue 24's worker loop the voice owns (the engine's hand-overs, the voice's stream, the
decoder's chunk plan and batcher hand-off). ``bench/cpu/worker_loop_cpu.sh`` measures the whole
worker loop behind a server (ZMQ, the bench's clients on the same cores, ~10 % run to run); this
one has no clients beside it. The engine's step loop and the decoder run in their own threads
as in the worker, so the loop still shares the GIL and the cores with them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.chattts.config import ChatTTSConfig
from rtserver.voices.chattts.voice import build_runtime

TEXT = "The quick brown fox jumps over the lazy dog near the river bank today."


@dataclasses.dataclass(frozen=True)
class LoopCost:
    streams: int
    loop_cpu_s: float
    wall_s: float
    audio_s: float

    @property
    def ms_per_audio_s(self) -> float:
        return 1000 * self.loop_cpu_s / self.audio_s if self.audio_s else float("nan")


async def measure(streams: int, seconds: float, settings: dict[str, Any], folder: Path
                  ) -> LoopCost:
    """Run ``streams`` users for ``seconds`` on a tiny model written under ``folder``."""
    root = write_tiny_chattts(folder / "chattts")  # with its speaker statistics: seed_1
    cfg = dataclasses.replace(
        ChatTTSConfig(asset_dir=str(root), device="cpu", slots=max(64, streams), max_len=512,
                      seeds=(1,), ignore_eos=True, warm_up_steps=2),
        **settings)
    runtime = await build_runtime(cfg)
    voice = runtime.voice("seed_1")
    try:
        await voice.warm_up()
        audio = 0.0
        stop = time.monotonic() + seconds

        async def user(i: int) -> None:
            nonlocal audio
            n = 0
            while time.monotonic() < stop:
                n += 1
                req = SynthesisRequest(text=TEXT, request_id=f"u{i}-{n}", first=n == 1)
                async for chunk in voice.synthesize(req):
                    audio += len(chunk.samples) / chunk.sample_rate

        cpu0, t0 = time.thread_time(), time.monotonic()
        await asyncio.gather(*(user(i) for i in range(streams)))
        return LoopCost(streams, time.thread_time() - cpu0, time.monotonic() - t0, audio)
    finally:
        await voice.close()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                    help="a [chattts] integer setting, e.g. stream_interval=8")
    a = ap.parse_args(argv)
    settings = {k: int(v) for k, v in (s.split("=", 1) for s in a.set)}
    import uvloop  # the server's loop

    with tempfile.TemporaryDirectory() as d:
        cost = uvloop.run(measure(a.streams, a.seconds, settings, Path(d)))
    print(f"streams={cost.streams} settings={settings} loop_cpu_s={cost.loop_cpu_s:.2f} "
          f"wall_s={cost.wall_s:.1f} audio_s={cost.audio_s:.1f} "
          f"ms_per_audio_s={cost.ms_per_audio_s:.3f}")


if __name__ == "__main__":
    main()
