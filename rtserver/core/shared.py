"""What every context of a speech core shares (``SpeechCore`` is one): the
narrow seam through which a context reads its core without importing it."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Protocol

from rtserver.audio.opus import OpusConfig
from rtserver.clock import Clock
from rtserver.core.stats import ServerLoad
from rtserver.metrics import Metrics
from rtserver.pacing.hints import HintConfig
from rtserver.text.segmenter import SegmenterConfig


class Shared(Protocol):
    @property
    def segmenter_config(self) -> SegmenterConfig: ...

    @property
    def hint_config(self) -> HintConfig: ...

    @property
    def opus_config(self) -> OpusConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def encode_pool(self) -> Executor | None:
        """Threads for Opus encoding; None: inline."""
        ...

    @property
    def load(self) -> ServerLoad: ...

    @property
    def max_text_chars(self) -> int:
        """Characters of text one context takes in all (``ContextInput``)."""
        ...


__all__ = ["Shared"]
