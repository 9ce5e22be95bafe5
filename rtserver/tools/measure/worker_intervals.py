"""A GPU worker's engine and decoder, interval by interval, from its /metrics scrapes.

    python -m rtserver.tools.measure.worker_intervals worker-metrics.txt[.gz] [--every 2]

The GPU scripts (``bench/gpu/run_*.sh``) scrape the worker's /metrics every 2 s
into ``worker-metrics.txt``: a ``# t=<unix seconds>`` line, then the scrape's
``rtserver_*`` samples. This prints, for each ``--every`` scrapes, the change of
the engine's counters over it: steps a second, rows a step, host CPU and host
wall time a step (the step loop outside its wait on the GPU; the CPU's split
into the launch, the read-back and hand-over, and the post), GPU time a step,
and the ChatTTS decoder's calls a second, windows a call and decode seconds a
second (above 1: decodes overlapped each other or the engine's steps on the
GPU); the last column is the engine's running requests at the interval's end.
A worker whose engine is vLLM's (Orpheus) counts no steps of the torch engine:
its table has the tokens generated a second, vLLM's steps a second and the share
of them that held a prefill, and the vocoder's calls a second, windows a call,
first-lane calls a second and decode seconds a second instead.
Samples of one name are summed over their labels (one engine per family). Where
a scrape has a ``# cpu ...`` line (/proc/stat's first line), both tables end
with the share of the host's CPU time its hypervisor took (steal) over the
interval (``tools.measure.host_cpu``).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rtserver.tools.measure.host_cpu import CpuTimes

STEPS = "rtserver_engine_steps_total"
ROWS = "rtserver_engine_rows_total"
HOST_CPU = "rtserver_engine_host_cpu_seconds_total"
HOST = "rtserver_engine_host_seconds_total"
GPU = "rtserver_engine_gpu_seconds_total"
PHASES = tuple(f"rtserver_engine_host_{ph}_cpu_seconds_total" for ph in ("launch", "read", "post"))
DEC_CALLS = "rtserver_engine_chattts_decoder_calls_total"
DEC_WINDOWS = "rtserver_engine_chattts_decoder_windows_total"
DEC_SECONDS = "rtserver_engine_chattts_decoder_decode_seconds_total"
RUNNING = "rtserver_engine_running_requests"
TOKENS = "rtserver_engine_generation_tokens_total"  # vLLM's (Orpheus): no step counters
VOC_CALLS = "rtserver_engine_vocoder_calls_total"
VOC_WINDOWS = "rtserver_engine_vocoder_windows_total"
VOC_FIRST = "rtserver_engine_vocoder_first_lane_calls_total"
VOC_SECONDS = "rtserver_engine_vocoder_decode_seconds_total"
VLLM_STEPS = "rtserver_engine_vllm_steps_total"
VLLM_PREFILL = "rtserver_engine_vllm_prefill_steps_total"
NAMES = (STEPS, ROWS, HOST_CPU, HOST, GPU, DEC_CALLS, DEC_WINDOWS, DEC_SECONDS, RUNNING,
         TOKENS, VOC_CALLS, VOC_WINDOWS, VOC_FIRST, VOC_SECONDS, VLLM_STEPS, VLLM_PREFILL,
         *PHASES)


@dataclass(slots=True)
class Scrape:
    t: float
    values: dict[str, float] = field(default_factory=dict)
    cpu: CpuTimes | None = None  # the host's CPU times at the scrape, where recorded


@dataclass(frozen=True, slots=True)
class Interval:
    """The counters' change between two scrapes (per step, per call or per second)."""

    end_s: float  # since the first scrape
    steps_per_s: float
    rows_per_step: float
    host_cpu_ms: float
    host_ms: float
    gpu_ms: float
    decoder_calls_per_s: float
    windows_per_call: float
    decoder_s_per_s: float
    running: float
    # of host_cpu_ms: launch, read-back and hand-over, post (0 from workers before them)
    phase_cpu_ms: tuple[float, ...] = (0.0, 0.0, 0.0)
    tokens_per_s: float = 0.0  # vLLM's generated tokens (its workers count no steps)
    first_lane_calls_per_s: float = 0.0  # the vocoder's (vLLM's workers)
    # vLLM's steps as its frontend saw them, and the share that held a prefill
    # (None from workers before these counters)
    vllm_steps_per_s: float | None = None
    vllm_prefill_share: float | None = None
    steal_share: float | None = None  # of the host's CPU time (None: not recorded)


def parse(lines: Iterable[str]) -> list[Scrape]:
    """The scrapes that hold the engine's step counter (vLLM's: its token
    counter), in order."""
    scrapes: list[Scrape] = []
    for line in lines:
        if line.startswith("# t="):
            scrapes.append(Scrape(float(line[4:])))
            continue
        if line.startswith("# cpu ") and scrapes:
            scrapes[-1].cpu = CpuTimes.parse(line[2:])
            continue
        if not scrapes or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        if not rest:
            name = line.split(" ", 1)[0]
        if name in NAMES:
            v = scrapes[-1].values
            v[name] = v.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return [s for s in scrapes if STEPS in s.values or TOKENS in s.values]


def intervals(scrapes: Sequence[Scrape], every: int = 1) -> list[Interval]:
    """One ``Interval`` per ``every`` scrapes."""
    if every < 1:
        raise ValueError("every must be >= 1")
    out = []
    for a, b in itertools.pairwise(scrapes[::every]):
        d = {k: b.values.get(k, 0.0) - a.values.get(k, 0.0) for k in NAMES}
        dt = b.t - a.t
        if dt <= 0:
            continue
        steps = d[STEPS] or 1.0
        dec_calls = d[DEC_CALLS] + d[VOC_CALLS]  # a worker serves one GPU family here
        out.append(Interval(
            end_s=b.t - scrapes[0].t, steps_per_s=d[STEPS] / dt, rows_per_step=d[ROWS] / steps,
            host_cpu_ms=1000 * d[HOST_CPU] / steps, host_ms=1000 * d[HOST] / steps,
            gpu_ms=1000 * d[GPU] / steps, decoder_calls_per_s=dec_calls / dt,
            windows_per_call=(d[DEC_WINDOWS] + d[VOC_WINDOWS]) / (dec_calls or 1.0),
            decoder_s_per_s=(d[DEC_SECONDS] + d[VOC_SECONDS]) / dt,
            running=b.values.get(RUNNING, 0.0), tokens_per_s=d[TOKENS] / dt,
            first_lane_calls_per_s=d[VOC_FIRST] / dt,
            vllm_steps_per_s=d[VLLM_STEPS] / dt if VLLM_STEPS in b.values else None,
            vllm_prefill_share=(d[VLLM_PREFILL] / (d[VLLM_STEPS] or 1.0)
                                if VLLM_STEPS in b.values else None),
            steal_share=b.cpu.steal_share(a.cpu) if a.cpu and b.cpu else None,
            phase_cpu_ms=tuple(1000 * d[p] / steps for p in PHASES)))
    return out


def _fmt(value: float | None, spec: str) -> str:
    """``value`` formatted, "-" where the scrapes did not record it."""
    return "-" if value is None else format(value, spec).replace("%", " %")


def table(rows: Sequence[Interval], vllm: bool = False) -> str:
    """A Markdown table of ``rows``; ``vllm``: the columns of a vLLM worker. A
    last column of the host's stolen CPU share where the scrapes recorded it."""
    if vllm:
        head = ("| end s | tokens/s | vLLM steps/s | steps with a prefill | vocoder calls/s "
                "| windows/call | first-lane calls/s | vocoder s/s | running |")
        cells = [f"| {r.end_s:.0f} | {r.tokens_per_s:.0f} | {_fmt(r.vllm_steps_per_s, '.0f')} "
                 f"| {_fmt(r.vllm_prefill_share, '.0%')} | {r.decoder_calls_per_s:.1f} "
                 f"| {r.windows_per_call:.1f} | {r.first_lane_calls_per_s:.1f} "
                 f"| {r.decoder_s_per_s:.2f} | {r.running:.0f} |" for r in rows]
    else:
        head = ("| end s | steps/s | rows/step | host CPU ms/step | of it launch / read / post "
                "| host ms/step | GPU ms/step | decoder calls/s | windows/call | decoder s/s "
                "| running |")
        cells = [f"| {r.end_s:.0f} | {r.steps_per_s:.0f} | {r.rows_per_step:.0f} "
                 f"| {r.host_cpu_ms:.2f} | {' / '.join(f'{v:.2f}' for v in r.phase_cpu_ms)} "
                 f"| {r.host_ms:.2f} | {r.gpu_ms:.2f} | {r.decoder_calls_per_s:.1f} "
                 f"| {r.windows_per_call:.1f} | {r.decoder_s_per_s:.2f} | {r.running:.0f} |"
                 for r in rows]
    if any(r.steal_share is not None for r in rows):
        head += " host steal |"
        cells = [c + f" {_fmt(r.steal_share, '.1%')} |"
                 for c, r in zip(cells, rows, strict=True)]
    rule = "|---" * (head.count("|") - 1) + "|"
    return "".join(f"{line}\n" for line in (head, rule, *cells))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rtserver.tools.measure.worker_intervals",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("file", type=Path, help="worker-metrics.txt, or .txt.gz")
    ap.add_argument("--every", type=int, default=1, help="scrapes per interval (default 1)")
    args = ap.parse_args(argv)
    opener = gzip.open if args.file.suffix == ".gz" else open
    with opener(args.file, "rt") as f:
        scrapes = parse(f)
    vllm = not any(STEPS in s.values for s in scrapes)
    print(table(intervals(scrapes, args.every), vllm=vllm), end="")


if __name__ == "__main__":
    main()
