"""``tools.measure.worker_intervals``: a worker's counters, interval by interval."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rtserver.tools.measure import worker_intervals as wi

SCRAPE = """# t={t}
# HELP rtserver_engine_steps_total steps
rtserver_engine_steps_total{{family="chattts"}} {steps}
rtserver_engine_rows_total{{family="chattts"}} {rows}
rtserver_engine_host_cpu_seconds_total{{family="chattts"}} {cpu}
rtserver_engine_host_launch_cpu_seconds_total{{family="chattts"}} {launch}
rtserver_engine_gpu_seconds_total{{family="chattts"}} {gpu}
rtserver_engine_chattts_decoder_calls_total {calls}
rtserver_engine_chattts_decoder_windows_total {windows}
rtserver_engine_running_requests{{family="chattts"}} {running}
rtserver_engine_running_requests{{family="orpheus"}} 1
"""


def scrape(t: float, steps: int, rows: int, cpu: float, gpu: float, calls: int,
           windows: int, running: int) -> str:
    return SCRAPE.format(t=t, steps=steps, rows=rows, cpu=cpu, gpu=gpu, calls=calls,
                         windows=windows, running=running, launch=cpu / 2)


def test_each_interval_is_the_change_of_the_counters(tmp_path: Path) -> None:
    text = ("# t=99.0\n"  # a scrape that failed: no samples, skipped
            + scrape(100.0, 0, 0, 0.0, 0.0, 0, 0, 0)
            + scrape(102.0, 200, 20_000, 0.2, 1.0, 40, 400, 100)
            + scrape(104.0, 300, 60_000, 0.5, 2.0, 50, 500, 300))
    rows = wi.intervals(wi.parse(text.splitlines()))
    assert len(rows) == 2
    a, b = rows
    assert a.end_s == 2.0 and a.steps_per_s == 100.0 and a.rows_per_step == 100.0
    assert a.host_cpu_ms == pytest.approx(1.0) and a.gpu_ms == pytest.approx(5.0)
    assert a.phase_cpu_ms == pytest.approx((0.5, 0.0, 0.0))  # half of it launching
    assert a.decoder_calls_per_s == 20.0 and a.windows_per_call == 10.0
    assert a.running == 101  # both families' gauges, summed
    assert b.rows_per_step == 400.0 and b.host_cpu_ms == pytest.approx(3.0)
    (every2,) = wi.intervals(wi.parse(text.splitlines()), every=2)
    assert every2.steps_per_s == 75.0 and every2.end_s == 4.0
    path = tmp_path / "worker-metrics.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    wi.main([str(path)])  # reads the gzip the GPU scripts keep


def test_the_table_has_a_row_per_interval(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    path = tmp_path / "m.txt"
    path.write_text(scrape(0.0, 0, 0, 0, 0, 0, 0, 0) + scrape(2.0, 10, 10, 0.01, 0.02, 1, 3, 5))
    wi.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| end s | steps/s")
    assert out[2] == ("| 2 | 5 | 1 | 1.00 | 0.50 / 0.00 / 0.00 | 0.00 | 2.00 | 0.5 | 3.0 "
                      "| 0.00 | 6 |")


VLLM_SCRAPE = """# t={t}
rtserver_engine_generation_tokens_total{{engine="vllm"}} {tokens}
rtserver_engine_vocoder_calls_total{{engine="vllm"}} {calls}
rtserver_engine_vocoder_windows_total{{engine="vllm"}} {windows}
rtserver_engine_vocoder_first_lane_calls_total{{engine="vllm"}} {first}
rtserver_engine_vocoder_decode_seconds_total{{engine="vllm"}} {dec}
rtserver_engine_running_requests{{engine="vllm"}} {running}
rtserver_engine_vllm_steps_total{{engine="vllm"}} {steps}
rtserver_engine_vllm_prefill_steps_total{{engine="vllm"}} {prefill}
"""


def test_a_vllm_worker_gets_tokens_and_vocoder_columns(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    """Orpheus' worker counts tokens and vLLM's steps, not the torch engine's:
    its scrapes are kept and its table shows tokens a second, vLLM's steps a
    second and the share that held a prefill, and the vocoder's calls."""
    path = tmp_path / "m.txt"
    path.write_text(VLLM_SCRAPE.format(t=0.0, tokens=0, calls=0, windows=0, first=0, dec=0.0,
                                       running=0, steps=10, prefill=5)
                    + VLLM_SCRAPE.format(t=2.0, tokens=16_000, calls=150, windows=450, first=40,
                                         dec=1.8, running=120, steps=210, prefill=155))
    (row,) = wi.intervals(wi.parse(path.read_text().splitlines()))
    assert row.tokens_per_s == 8000.0 and row.decoder_calls_per_s == 75.0
    assert row.windows_per_call == 3.0 and row.first_lane_calls_per_s == 20.0
    assert row.decoder_s_per_s == pytest.approx(0.9) and row.steps_per_s == 0.0
    assert row.vllm_steps_per_s == 100.0 and row.vllm_prefill_share == 0.75
    wi.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| end s | tokens/s | vLLM steps/s | steps with a prefill "
                             "| vocoder calls/s")
    assert out[2] == "| 2 | 8000 | 100 | 75 % | 75.0 | 3.0 | 20.0 | 0.90 | 120 |"


def test_the_hosts_stolen_share_is_the_last_column(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """Scrapes with /proc/stat's cpu line (the GPU scripts' since session 31)
    give each interval the share of CPU time the hypervisor took."""
    first = VLLM_SCRAPE.format(t=0.0, tokens=0, calls=0, windows=0, first=0, dec=0.0,
                               running=0, steps=0, prefill=0)
    second = VLLM_SCRAPE.format(t=2.0, tokens=16_000, calls=150, windows=450, first=40,
                                dec=1.8, running=120, steps=200, prefill=150)
    path = tmp_path / "m.txt"
    path.write_text(first.replace("\n", "\n# cpu  100 0 0 900 0 0 0 0 0 0\n", 1)
                    + second.replace("\n", "\n# cpu  200 0 0 1700 0 0 0 100 0 0\n", 1))
    (row,) = wi.intervals(wi.parse(path.read_text().splitlines()))
    assert row.steal_share == pytest.approx(0.1)
    wi.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("| running | host steal |") and out[1].count("|---") == 10
    assert out[2] == "| 2 | 8000 | 100 | 75 % | 75.0 | 3.0 | 20.0 | 0.90 | 120 | 10.0 % |"
