"""What the torch engine's step loop did, as plain numbers (pure: no torch).

The loop (``engine.py``) adds each launched step's host time (wall and CPU,
by phase), GPU time, rows and prefill positions to one ``StepCounters``;
/metrics reads them as ``rtserver_engine_<name>_total`` counters
(``metric_counters``), whose ``rate()`` over the steps' gives a per-step figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rtserver.voices.chattts.engine.scheduler import Plan


@dataclass
class StepCounters:
    """What the step loop did (thread-written plain numbers; /metrics reads them)."""

    steps: int = 0  # steps launched (decode and/or prefill)
    decode_steps: int = 0
    prefill_batches: int = 0
    rows: int = 0  # decode rows run, summed over steps
    prefill_tokens: int = 0  # prompt positions prefilled
    prefill_padded: int = 0  # the same, padded to the graph's shape
    moves: int = 0  # slots moved by compaction
    host_s: float = 0.0  # engine thread wall time per step, outside its one wait
    host_cpu_s: float = 0.0  # engine thread CPU time per step, outside its one wait
    gpu_s: float = 0.0  # device time from a step's first launch to its copy out
    wait_s: float = 0.0  # time blocked in the wait
    syncs: int = 0  # host syncs (one per step read back)
    # host_s and host_cpu_s split by phase (wall, CPU), of the same turns (those
    # that launched a step); the rest (inbox, expiry, scheduling, store staging,
    # the refine-text lane, these counters) is host minus the three
    launch_s: float = 0.0  # runner.launch: inputs staged, graphs replayed
    launch_cpu_s: float = 0.0
    read_s: float = 0.0  # the previous step read back and handed over (handover.py)
    read_cpu_s: float = 0.0
    post_s: float = 0.0  # the hand-overs posted to the event loop
    post_cpu_s: float = 0.0

    def count(self, plan: Plan, host_s: float, host_cpu_s: float,
              phases: Sequence[float]) -> None:
        """A launched step of ``plan``: its host time outside the wait (wall,
        CPU), and by phase (``PHASES``' wall and CPU seconds, in order)."""
        self.steps += 1
        self.host_s += host_s
        self.host_cpu_s += host_cpu_s
        self.launch_s += phases[0]
        self.launch_cpu_s += phases[1]
        self.read_s += phases[2]
        self.read_cpu_s += phases[3]
        self.post_s += phases[4]
        self.post_cpu_s += phases[5]
        if plan.rows:
            self.decode_steps += 1
            self.rows += len(plan.rows)
        if plan.chunks:
            self.prefill_batches += 1
            self.prefill_tokens += sum(ch.length for ch in plan.chunks)
            self.prefill_padded += plan.prefill_tokens
        self.moves += len(plan.moves)


# The phases of StepCounters' host time (its <phase>_s and <phase>_cpu_s), as
# /metrics describes them.
PHASES = (("launch", "launching steps (inputs staged, graphs replayed)"),
          ("read", "reading steps back and handing them over"),
          ("post", "posting hand-overs to the event loop"))


def metric_counters(c: StepCounters) -> dict[str, tuple[str, float]]:
    """/metrics' name -> (help, value) of each counter."""
    return {
        "decode_steps": ("Decode steps run (all decoding requests at once)", c.decode_steps),
        "prefill_batches": ("Steps that carried prefill chunks", c.prefill_batches),
        "steps": ("Engine steps launched (decode and/or prefill)", c.steps),
        "host_seconds": ("Engine thread wall time per step outside its one wait "
                         "on the device (GIL waits included), summed", c.host_s),
        "host_cpu_seconds": ("Engine thread CPU time per step outside its one wait "
                             "on the device, summed", c.host_cpu_s),
        "gpu_seconds": ("Device time of the engine's steps (first launch to copy "
                        "out), summed", c.gpu_s),
        "rows": ("Decode rows run, summed over steps", c.rows),
        "prefill_tokens": ("Prompt positions prefilled", c.prefill_tokens),
        "prefill_padded_tokens": ("Prompt positions prefilled, padded to the "
                                  "graph's shape", c.prefill_padded),
        "moves": ("KV slots moved to keep the decode batch compact", c.moves),
    } | {  # host_seconds and host_cpu_seconds by phase
        f"host_{phase}{kind}_seconds": (f"Engine thread {clock} time {what}, summed",
                                        getattr(c, f"{phase}{kind}_s"))
        for phase, what in PHASES for kind, clock in (("", "wall"), ("_cpu", "CPU"))}
