"""The pure chunk schedule: coverage, geometry, growth, crossfade. No torch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserver.vocoder.chunking import (
    ChunkConfig,
    ChunkPlanner,
    DecodeJob,
    SeamJoiner,
    crossfade_windows,
    held_start,
)

F = 2048


def signal(start: int, stop: int) -> np.ndarray:
    """A stand-in decoder output that is a fixed function of absolute position:
    joining must reproduce it exactly, so any gap, repeat or shift shows."""
    t = np.arange(start, stop, dtype=np.int64)
    return (((t * 37) % 1009) / 1009.0).astype(np.float32)


def run(cfg: ChunkConfig, pushes: list[int], deep: list[bool] | None = None
        ) -> tuple[list[DecodeJob], list[np.ndarray], list[int]]:
    """Plan and join; returns jobs, chunks and the frames pushed when each job was
    planned. ``deep[i]``: push ``i`` says the listener holds a deep chunk."""
    planner, joiner = ChunkPlanner(cfg), SeamJoiner(cfg.samples_per_frame)
    jobs, chunks, seen = [], [], []
    f = cfg.samples_per_frame
    for i, n in enumerate([*pushes, None]):
        new = planner.finish() if n is None else planner.push(
            n, deep=bool(deep and deep[i % len(deep)]))
        for job in new:
            audio = signal(job.start_frame * f, job.end_frame * f)
            chunks.append(joiner.join(job, audio))
            jobs.append(job)
            seen.append(planner.frames)
    return jobs, chunks, seen


def check_geometry(cfg: ChunkConfig, jobs: list[DecodeJob], seen: list[int]) -> None:
    f = cfg.samples_per_frame
    prev_end, prev_hold = 0, 0
    for i, job in enumerate(jobs):
        assert job.index == i
        assert job.emit_start == prev_end and job.fade == prev_hold  # contiguous
        assert job.end_frame <= seen[i]  # only frames that exist
        assert job.start_frame == 0 or (job.emit_start - job.start_frame * f
                                        >= cfg.context_samples)
        if job.final:
            assert job.end_frame == seen[i] and job.emit_end == job.end_frame * f
            assert job.hold == 0 and i == len(jobs) - 1
        else:
            lookahead = job.end_frame * f - (job.emit_end + job.hold)
            need = cfg.first_lookahead_samples if i == 0 else cfg.lookahead_samples
            assert lookahead >= min(need, cfg.lookahead_samples)
            assert job.hold == cfg.crossfade_samples
        prev_end, prev_hold = job.emit_end, job.hold


def test_crossfade_windows_sum_to_one() -> None:
    for n in (1, 2, 256, 1000):
        fade_out, fade_in = crossfade_windows(n)
        assert fade_out.dtype == np.float32 and fade_in.shape == (n,)
        assert np.max(np.abs(fade_out + fade_in - 1.0)) < 1e-6
        assert np.all(np.diff(fade_in) >= 0) and fade_in[0] <= 0.5 <= fade_in[-1]


@settings(max_examples=150, deadline=None)
@given(
    pushes=st.lists(st.integers(0, 25), min_size=0, max_size=40),
    first=st.integers(1, 4),
    growth=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    max_chunk=st.integers(1, 16),
    la=st.sampled_from([0, 1024, 3584, 4757]),
    xf=st.sampled_from([0, 128, 256]),
    ctx=st.sampled_from([0, 2048, 4757]),
    second=st.sampled_from([0, 1, 3]),
    deep_more=st.sampled_from([0, 1, 9]),
    deep=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_every_sample_once_in_order(pushes: list[int], first: int, growth: float,
                                    max_chunk: int, la: int, xf: int, ctx: int,
                                    second: int, deep_more: int, deep: list[bool]) -> None:
    first_la = min(la, first * F - xf - 1)
    max_chunk = max(max_chunk, first)
    deep_frames = max_chunk + deep_more if deep_more else 0
    cfg = ChunkConfig(first_frames=first, growth=growth, max_chunk_frames=max_chunk,
                      context_samples=ctx, first_lookahead_samples=first_la,
                      lookahead_samples=la, crossfade_samples=xf, second_frames=second,
                      deep_chunk_frames=deep_frames)
    jobs, chunks, seen = run(cfg, pushes, deep)
    out = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    n = sum(pushes)
    assert len(out) == n * F
    np.testing.assert_allclose(out, signal(0, n * F), atol=1e-6)
    check_geometry(cfg, jobs, seen)
    for job in jobs:  # a burst never makes one huge decode
        tail = la + xf if job.final else 0
        most = max(max_chunk, deep_frames)
        assert job.emit_end - job.emit_start < (most + 1) * F + xf + tail


def test_first_audio_after_first_frames_then_growing_chunks() -> None:
    cfg = ChunkConfig()
    planner = ChunkPlanner(cfg)
    sizes: list[int] = []
    at: list[int] = []
    for frame in range(1, 200):
        for job in planner.push(1):
            sizes.append(job.emit_end - job.emit_start)
            at.append(frame)
    assert at[0] == cfg.first_frames
    assert sizes[0] == cfg.first_frames * F - cfg.first_lookahead_samples - cfg.crossfade_samples
    targets = [cfg.chunk_frames(k) for k in range(1, len(sizes))]
    assert targets[:5] == [2, 4, 8, 16, 16]
    for size, target in zip(sizes[1:], targets, strict=True):
        assert target * F <= size < (target + 1) * F
    # steady state: one decode per max chunk, exactly that much audio
    assert sizes[-1] == cfg.max_chunk_frames * F


def test_deep_chunks_only_while_the_listener_holds_one() -> None:
    """Steady chunks are ``max_chunk_frames``; pushes that say the listener
    holds a deep chunk wait for ``deep_chunk_frames`` fresh frames (with the
    same lookahead), and the next push that does not say so decodes at once,
    at most ``max_chunk_frames`` a decode again."""
    cfg = ChunkConfig(max_chunk_frames=4, deep_chunk_frames=10)
    planner = ChunkPlanner(cfg)
    margin = cfg.lookahead_samples + cfg.crossfade_samples
    sizes: list[tuple[int, bool]] = []

    def push(deep: bool) -> list[DecodeJob]:
        jobs = planner.push(1, deep=deep)
        sizes.extend(((j.emit_end - j.emit_start) // F, deep) for j in jobs)
        return jobs

    while len(sizes) < 6:
        push(False)
    assert sizes[-1] == (4, False)
    waited = 0
    while not push(True):
        waited += 1
    assert sizes[-1] == (10, True) and waited >= 5  # 10 fresh frames, not 4
    job_end = planner.emitted_samples + margin
    assert planner.frames * F >= job_end  # with its full lookahead
    for _ in range(7):  # the listener runs low: no deep wait any more
        push(False)
    assert sizes[-1] == (4, False)
    assert all(size <= 4 for size, deep in sizes if not deep)


def test_without_deep_chunks_the_flag_changes_nothing() -> None:
    cfg = ChunkConfig(max_chunk_frames=4)
    pushes = [1, 3, 1, 7, 1, 1, 20, 1, 1]
    plain, deep = run(cfg, pushes), run(cfg, pushes, [True])
    assert [j.emit_end for j in plain[0]] == [j.emit_end for j in deep[0]]


def test_first_decode_uses_full_lookahead_when_frames_are_there() -> None:
    cfg = ChunkConfig()
    jobs = ChunkPlanner(cfg).push(6)
    assert jobs[0].end_frame * F - jobs[0].emit_end - jobs[0].hold >= cfg.lookahead_samples


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17])
def test_finish_flushes_everything(n: int) -> None:
    cfg = ChunkConfig(first_frames=2, first_lookahead_samples=2048)
    jobs, chunks, _ = run(cfg, [1] * n)
    assert sum(len(c) for c in chunks) == n * F
    assert (not jobs) == (n == 0)
    if jobs:
        assert jobs[-1].final


def test_frames_older_than_any_future_window_can_go() -> None:
    planner = ChunkPlanner(ChunkConfig())
    keep = 0
    for n in [1, 1, 3, 1, 7, 1, 1, 20, 1, 1, 1, 30, None]:
        jobs = planner.finish() if n is None else planner.push(n)
        assert all(j.start_frame >= keep for j in jobs)
        new_keep = planner.first_needed_frame()
        assert new_keep >= keep
        keep = new_keep
    assert keep > 0


def test_misuse_is_rejected() -> None:
    with pytest.raises(ValueError):
        ChunkConfig(first_frames=1, first_lookahead_samples=2000, crossfade_samples=256)
    with pytest.raises(ValueError):
        ChunkConfig(growth=0.5)
    with pytest.raises(ValueError):
        ChunkConfig(crossfade_samples=4096)
    with pytest.raises(ValueError, match="deep_chunk_frames"):
        ChunkConfig(max_chunk_frames=16, deep_chunk_frames=16)
    planner = ChunkPlanner(ChunkConfig())
    jobs = planner.push(1) + planner.push(12)
    assert len(jobs) >= 2
    planner.finish()
    with pytest.raises(RuntimeError):
        planner.push(1)
    joiner = SeamJoiner(F)
    with pytest.raises(ValueError):
        joiner.join(jobs[1], signal(0, jobs[1].n_frames * F))  # out of order
    with pytest.raises(ValueError):
        joiner.join(jobs[0], np.zeros(10, np.float32))  # wrong length


FRAME_S = F / 24_000  # SNAC 24 kHz: 85.3 ms a frame


@pytest.mark.parametrize(("seconds", "frames"), [(0.5, 5), (0.9, 10), (1.2, 14), (1.4, 16),
                                                 (30.0, 16)])
def test_a_held_start_waits_for_the_frames_real_time_makes_in_the_time_held(
        seconds: float, frames: int) -> None:
    """A later segment whose listener can wait ``seconds``: its first decode
    comes after the frames real-time generation makes in that time (at most
    ``max_chunk_frames``), with the exact lookahead, so every sample it emits is
    exact and the stream is still whole and in order."""
    cfg = ChunkConfig()
    held = held_start(cfg, seconds, FRAME_S)
    assert held.first_frames == frames and held.max_chunk_frames == cfg.max_chunk_frames
    jobs, chunks, seen = run(held, [1] * 60)
    assert seen[0] == frames  # no audio before those frames
    assert jobs[0].end_frame * F - jobs[0].emit_end - jobs[0].hold == cfg.lookahead_samples
    check_geometry(held, jobs, seen)
    np.testing.assert_allclose(np.concatenate(chunks), signal(0, 60 * F), atol=1e-6)
    assert len(jobs) < len(run(cfg, [1] * 60)[0])  # fewer, larger decodes
    assert held_start(cfg, seconds, FRAME_S) is held  # built once a frame count, not a segment


@pytest.mark.parametrize("seconds", [-1.0, 0.0, 0.2, 0.3])
def test_too_little_held_keeps_the_plan(seconds: float) -> None:
    """Under 4 frames' time (an exact first chunk of one frame needs 4: its
    lookahead and crossfade take 2.45), the segment restarts as planned."""
    cfg = ChunkConfig()
    assert held_start(cfg, seconds, FRAME_S) == cfg
