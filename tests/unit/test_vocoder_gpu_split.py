"""The GPU time-split command, run on the CPU with the tiny SNAC (what the H200
run executes, down to argument parsing and the JSON it writes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rtserver.tools.measure.snac_gpu_split import main, segment_jobs, steady_window
from rtserver.vocoder.chunking import ChunkConfig

F = 2048


def test_steady_window_is_a_full_chunk_with_its_context_and_lookahead() -> None:
    cfg = ChunkConfig()
    job = steady_window(cfg)
    assert job.emit_end - job.emit_start == cfg.max_chunk_frames * F
    # 16 frames emitted, with 4757 samples of context and lookahead around them
    assert job.start_frame * F <= job.emit_start - cfg.context_samples
    assert job.end_frame * F >= job.emit_end + job.hold + cfg.lookahead_samples - F
    assert cfg.max_chunk_frames < job.n_frames <= cfg.max_chunk_frames + 2 * math.ceil(
        cfg.context_samples / F)
    jobs = segment_jobs(cfg, 47)
    assert jobs[-1].final and jobs[-1].end_frame == 47
    assert sum(j.emit_end - j.emit_start for j in jobs) == 47 * F


def test_the_command_runs_and_writes_its_rows(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "split.json"
    main(["--device", "cpu", "--shape", "tiny", "--streams", "3", "--segment-frames", "6",
          "--repeats", "1", "--max-chunk-frames", "16", "4", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "ms per stream-second" in printed
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["dtype"], r["max_chunk_frames"], r["workload"]) for r in rows] == [
        (d, m, w) for d in ("float32", "bfloat16", "float16") for m in (16, 4)
        for w in ("steady", "segment")]
    assert data["environment"]["device"] == "cpu" and "--shape tiny" in data["command"]
    for r in rows:
        assert r["streams"] == 3
        chunking = ChunkConfig(max_chunk_frames=r["max_chunk_frames"])
        assert sum(int(k) * v for k, v in r["call_sizes"].items()) == \
            (3 if r["workload"] == "steady" else 3 * len(segment_jobs(chunking, 6)))
        assert r["decoder_ms"] > 0
        assert r["ms_per_stream_s"] == pytest.approx(r["decoder_ms"] / r["audio_s"], rel=1e-2)
        assert r["gpu_share"] == pytest.approx(3 * r["ms_per_stream_s"] / 1e3, rel=1e-2)
    steady, segment, steady4 = rows[0], rows[1], rows[2]
    assert steady["audio_s"] == pytest.approx(3 * 16 * F / 24000, abs=1e-3)
    assert segment["audio_s"] == pytest.approx(3 * 6 * F / 24000, abs=1e-3)
    assert steady4["audio_s"] == pytest.approx(3 * 4 * F / 24000, abs=1e-3)
    # shorter chunks decode more context and lookahead per second of audio
    assert steady4["frames_decoded"] / steady4["audio_s"] > \
        steady["frames_decoded"] / steady["audio_s"]
    with pytest.raises(SystemExit):
        main(["--streams", "0"])
