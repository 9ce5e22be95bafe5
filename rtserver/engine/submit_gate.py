"""Later segments submitted together: fewer engine steps that hold a prefill.

Every Orpheus text segment is a vLLM request, and a step that holds any prefill
runs outside vLLM's FULL CUDA graphs under its default graph mode (piecewise: its
attention and KV writes launched from Python layer by layer). At 256 streams
nearly every step held one, and on a slower host that Python set the step's pace
(py-spy of vLLM's EngineCore: 343 of 1,445 busy-loop samples in piecewise
forwards, 4 in FULL replays; bench/results/h100-2026-12-07-s31).

``SubmitGate`` holds a deferrable request (a later segment, whose listener has
audio in hand) until an urgent one is submitted (a context's first segment: that
step holds a prefill anyway) or until the oldest held one has waited ``hold_s``;
then every held request goes at once, so vLLM takes them into one step. A hold
of 0 lets everything through.
"""

from __future__ import annotations

import asyncio


class SubmitGate:
    """Holds deferrable submissions; releases them together (event loop only)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._batch: asyncio.Event | None = None  # the held requests' release
        self._timer: asyncio.TimerHandle | None = None
        self.held = 0  # requests that waited here, in all
        self.releases = 0  # times a held batch was let go

    async def wait(self, urgent: bool) -> None:
        """Return when this request may be submitted: at once if ``urgent``
        (releasing every held one too) or the gate is off, else with the batch."""
        if self.hold_s <= 0:
            return
        if urgent:
            self.release()
            return
        if self._batch is None:
            self._batch = asyncio.Event()
            self._timer = asyncio.get_running_loop().call_later(self.hold_s, self.release)
        self.held += 1
        await self._batch.wait()

    def release(self) -> None:
        """Let every held request go now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._batch is not None:
            self._batch.set()
            self._batch = None
            self.releases += 1


__all__ = ["SubmitGate"]
