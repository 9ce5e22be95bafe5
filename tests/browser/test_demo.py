"""The browser demo, end to end: headless Chromium against a real rtserver.

What a person at the demo would check: the page connects, speaks the text
with no gap, the audio it played is all the audio the server sent, Stop
silences it at once and the next turn is clean. Figures come from the page's
``window.rtDemo.stats`` (see rtserver/web_demo/app.js) and the server's own ``done``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from rtserver.testing.wait import scaled

from .cdp import Page
from .conftest import DemoServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RATE = 48000  # the demo's AudioContext rate; Opus decodes at 48 kHz
TURN_TIMEOUT_S = 120.0
TEXT = "Hello from the browser test. Dr. Smith paid $3.50 for 2 coffees, and it took 20 minutes."
FINISHED = ("done", "cancelled", "error")


def wait_finished(page: Page, timeout: float = TURN_TIMEOUT_S, context: str | None = None
                  ) -> dict[str, Any]:
    """The current turn's stats once it is done, cancelled or failed."""
    cond = f"window.rtDemo && {json.dumps(FINISHED)}.includes(rtDemo.stats.state)"
    if context is not None:
        cond += f" && rtDemo.stats.context === {json.dumps(context)}"
    page.wait_for(cond, scaled(timeout))
    stats: dict[str, Any] = page.evaluate("rtDemo.stats")
    return stats


def assert_heard_everything(stats: dict[str, Any]) -> None:
    """All the audio the server sent was decoded and played, gapless."""
    assert stats["state"] == "done", stats["errors"]
    frame = RATE * stats["frameMs"] // 1000
    # What the server sent, by its own count.
    assert stats["serverFrames"] > 0
    assert stats["serverAudioMs"] == pytest.approx(stats["serverFrames"] * stats["frameMs"])
    assert stats["framesReceived"] == stats["serverFrames"]
    assert stats["lastSeq"] == stats["serverFrames"] - 1
    assert stats["seqGaps"] == 0
    # Every frame decodes to a whole frame (the last is padded by the server);
    # the decoder delay, pre_skip samples, is dropped from the start. Chromium's
    # decoder drops nothing itself, so the count is exact (a decoder that did
    # would still be within the one frame the issue allows: checked first).
    sent = stats["serverFrames"] * frame - stats["preSkip"]
    assert abs(stats["decodedSamples"] - sent) <= frame, (stats["decodedSamples"], sent)
    assert stats["decodedRawSamples"] == stats["serverFrames"] * frame
    assert stats["decodedSamples"] == sent
    assert stats["playedSamples"] == stats["decodedSamples"]
    assert stats["underruns"] == 0, json.dumps({k: stats[k] for k in (
        "underrunLog", "stalledMs", "prebufferMs", "rtf", "ttfaMs", "serverTtfaMs")})
    assert stats["stalledMs"] == 0
    # Speech, not silence (Piper speaks at an RMS of roughly 0.05 to 0.2).
    assert stats["playedRms"] > 0.005


def test_speaks_text_on_load(demo_server: DemoServer, page: Page, output_dir: Path) -> None:
    page.navigate(demo_server.url(f"autoplay=1&text={quote(TEXT)}"))
    stats = wait_finished(page)
    assert page.evaluate("rtDemo.audioState()") == "running"
    assert page.evaluate("rtDemo.playerKind") == "AudioWorklet"
    assert stats["format"] == "opus"  # WebCodecs decodes Opus in Chromium
    assert stats["preSkip"] > 0
    assert_heard_everything(stats)
    # TTFA as the page saw it, next to the server's own figure.
    assert stats["ttfaMs"] is not None and stats["ttfaMs"] > 0
    assert stats["ttfaBasis"] == "completing fragment"  # one text message holds it all
    assert stats["serverTtfaMs"] is not None
    # The client's TTFA contains the server's (it adds the network both ways).
    assert stats["ttfaMs"] >= stats["serverTtfaMs"] - 1
    assert stats["startLatencyMs"] >= stats["ttfaMs"]
    # The ready info and voices are on the page.
    ready = page.evaluate("rtDemo.ready")
    assert ready["protocol"] == 1
    options = page.evaluate("[...document.querySelectorAll('#voice option')].map(o => o.value)")
    assert options == ready["voices"] and options
    # Every segment is in the transcript, all marked spoken at the end.
    assert stats["segments"] >= 2
    spans = page.evaluate("[...document.querySelectorAll('#transcript .seg')]"
                          ".map(e => e.className)")
    assert len(spans) == stats["segments"]
    assert all("spoken" in c for c in spans), spans
    shot = page.screenshot(output_dir / "demo-done.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not page.exceptions, page.exceptions


IDLE_TEXT = "Hello there, this is the browser demo speaking."


def test_time_to_first_heard_audio_on_an_idle_server(demo_server: DemoServer, page: Page
                                                     ) -> None:
    """The page's time to sound (``startLatencyMs``: first text sent -> playback
    started, after the server's buffer hint) for a short sentence on an idle
    server, printed beside TTFA. Issue 14's target is <= 300 ms on the 2-core CI
    machine; speed is shown by benchmarks, so only the order of events is asserted.

    Spoken as a person would: the page loaded and settled (connected, voices
    listed, its main thread idle), then Speak. With ``autoplay`` the new
    browser's loading shares the 2 cores with the reply; it ran dry in 2 of 5
    full runs on 2026-12-06, once with the server's first chunk 4x late, once
    with the page's decoder behind what it had received. The first test
    covers speaking on load."""
    page.navigate(demo_server.url(f"text={quote(IDLE_TEXT)}"))
    page.wait_for("window.rtDemo && rtDemo.ready !== null && document.readyState === 'complete'"
                  " && document.querySelectorAll('#voice option').length > 0", scaled(60))
    page.evaluate("new Promise((r) => requestIdleCallback(() => r(true), {timeout: 2000}))")
    page.evaluate(f"rtDemo.speak({json.dumps(IDLE_TEXT)}).then(() => true)")
    stats = wait_finished(page)
    assert_heard_everything(stats)
    print(f"\nbrowser demo, idle server, {IDLE_TEXT!r}: startLatencyMs "
          f"{stats['startLatencyMs']} ms (time to first heard audio), TTFA {stats['ttfaMs']} ms, "
          f"server TTFA {stats['serverTtfaMs']} ms, prebuffer hint {stats['prebufferMs']} ms")
    assert stats["ttfaMs"] <= stats["startLatencyMs"]


def test_stop_mid_reply_then_clean_turn(demo_server: DemoServer, page: Page,
                                        output_dir: Path) -> None:
    # The canned chatbot reply (about 150 tokens, 30 s of speech) at 10
    # tokens/s takes 15 s to send; Stop once 1 s of it was heard, while audio
    # is playing. The server cannot be done before the reply's last token, so
    # even on a loaded machine, where playback stalls, this stops it mid-way.
    page.navigate(demo_server.url("autoplay=1&simulate=1&rate=10&stop_after_ms=1000"))
    stats = wait_finished(page)
    assert stats["state"] == "cancelled", stats["errors"]
    assert stats["mode"] == "chatbot"
    assert stats["tokensSent"] > 1
    assert stats["serverFrames"] is None  # no `done`: stopped in the middle
    assert stats["playedAtStopMs"] >= 1000
    assert stats["playedSamples"] * 1000 / RATE == pytest.approx(stats["playedAtStopMs"], abs=0.1)
    # The server's fence: nothing after `cancelled`, and its last_seq is the
    # last frame the page got.
    assert stats["cancelledLastSeq"] is not None
    assert stats["framesAfterCancelled"] == 0
    assert stats["lastSeq"] <= stats["cancelledLastSeq"]
    # The page's fence: silent within one render quantum (audio was playing:
    # a fade of at most 128 samples), then not one non-zero sample of the turn.
    assert 0 < stats["fadeSamples"] <= 128
    assert stats["playedAfterFence"] == 0
    # What was heard went to the server as `played`.
    assert stats["playedReportedMs"] == pytest.approx(stats["playedSamples"] * 1000 / RATE,
                                                      abs=0.1)
    page.screenshot(output_dir / "demo-cancelled.png")

    # The next turn starts clean: a new context, fresh counters, all of its audio.
    first = stats["context"]
    second = page.evaluate("rtDemo.speak('A clean second turn.')")
    assert second != first
    stats2 = wait_finished(page, context=second)
    assert_heard_everything(stats2)
    assert stats2["stoppedAtMs"] is None
    assert stats2["playedAfterFence"] == 0
    assert stats2["framesAfterStop"] == 0
    # The first turn's record is untouched by the second.
    turns = page.evaluate("rtDemo.turns")
    assert [t["context"] for t in turns] == [first, second]
    assert turns[0]["state"] == "cancelled"
    assert turns[0]["playedSamples"] == stats["playedSamples"]
    assert not page.exceptions, page.exceptions


@pytest.mark.parametrize(("query", "fmt", "player"), [
    ("format=pcm_s16le", "pcm_s16le", "AudioWorklet"),  # no WebCodecs Opus
    ("player=scriptprocessor", "opus", "ScriptProcessor"),  # no AudioWorklet
])
def test_fallbacks_play_everything(demo_server: DemoServer, page: Page, query: str, fmt: str,
                                   player: str) -> None:
    page.navigate(demo_server.url(f"autoplay=1&{query}&text={quote('Falling back, gracefully.')}"))
    stats = wait_finished(page)
    assert stats["format"] == fmt
    assert page.evaluate("rtDemo.playerKind") == player
    assert_heard_everything(stats)
    if fmt == "pcm_s16le":
        assert stats["preSkip"] == 0
    assert not page.exceptions, page.exceptions


def test_without_token_the_handshake_is_refused(demo_server: DemoServer, page: Page) -> None:
    page.navigate(f"{demo_server.http}/")
    page.wait_for("document.getElementById('conn').textContent.startsWith('disconnected')",
                  scaled(30))
    assert page.evaluate("rtDemo.ready") is None


RING_SCENARIO = """
(async () => {
  await new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = "worklet.js";
    s.onload = resolve;
    s.onerror = reject;
    document.head.appendChild(s);
  });
  const events = [];
  const core = new RingPlayerCore((m) => { if (m.event) events.push(m.event); });
  const out = new Float32Array(128);
  const fill = (n, v) => new Float32Array(n).fill(v);
  const render = (k = 1) => { for (let i = 0; i < k; i++) core.render(out, 0); return out; };
  const r = {};
  core.handle({t: "turn", turn: "a", prebuffer: 480});
  core.handle({t: "audio", turn: "a", pcm: fill(256, 0.5)});
  r.waits = Array.from(render()).every((x) => x === 0) && core.state === "prebuffering";
  core.handle({t: "audio", turn: "a", pcm: fill(512, 0.5)});
  render(6);  // 768 samples = 6 quanta exactly
  r.playedBeforeDry = core.played;
  render(3);  // dry: an underrun, then two quanta of waiting
  r.afterDry = {underruns: core.underruns, stalled: core.stalled, state: core.state};
  core.handle({t: "prebuffer", turn: "a", samples: 256});
  core.handle({t: "audio", turn: "a", pcm: fill(200, 0.25)});
  render();  // 200 < 256: still waiting
  r.stillWaiting = core.state;
  core.handle({t: "audio", turn: "a", pcm: fill(100, 0.25)});
  core.handle({t: "end", turn: "a"});
  render(3);
  r.endA = {played: core.played, state: core.state, underruns: core.underruns,
            stalled: core.stalled};
  // A stale message for turn "a" once "b" started changes nothing.
  core.handle({t: "turn", turn: "b", prebuffer: 0});
  core.handle({t: "audio", turn: "a", pcm: fill(5000, 1)});
  core.handle({t: "audio", turn: "b", pcm: fill(1000, 0.5)});
  render();
  r.bPlaying = {state: core.state, played: core.played, first: out[0]};
  core.handle({t: "fence", turn: "b", id: 1});
  const fade = Array.from(render());
  core.handle({t: "audio", turn: "b", pcm: fill(1000, 0.5)});
  const after = Array.from(render(4));
  r.fence = {state: core.state, fade: core.fadeSamples, fadeFirst: fade[0],
             fadeLast: fade[127], after: after.some((x) => x !== 0),
             afterFence: core.afterFence, dropped: core.droppedAfterFence,
             played: core.played};
  r.events = events;
  return r;
})()
"""


def test_ring_player_logic(demo_server: DemoServer, page: Page) -> None:
    """worklet.js's ring buffer, quantum by quantum, in the browser it runs in."""
    page.navigate(f"{demo_server.http}/worklet.js")  # same origin, no demo running
    page.wait_for("document.readyState === 'complete'", scaled(30))
    r = page.evaluate(RING_SCENARIO)
    assert r["waits"]  # below the prebuffer target: silence
    assert r["playedBeforeDry"] == 768
    # Dry before the end: one underrun; the missing quantum and two more stall.
    assert r["afterDry"] == {"underruns": 1, "stalled": 3 * 128, "state": "rebuffering"}
    assert r["stillWaiting"] == "rebuffering"  # resumes only at the (new) prebuffer
    # The end plays out what is left, partial quantum included, no underrun.
    assert r["endA"] == {"played": 768 + 300, "state": "drained", "underruns": 1,
                         "stalled": 4 * 128}
    assert r["bPlaying"] == {"state": "playing", "played": 128, "first": 0.5}
    # Fence: one quantum fading to zero, then silence; later audio is dropped.
    assert r["fence"]["state"] == "stopped"
    assert r["fence"]["fade"] == 128
    assert r["fence"]["fadeFirst"] == pytest.approx(0.5 * 127 / 128)
    assert r["fence"]["fadeLast"] == 0
    assert r["fence"]["after"] is False
    assert r["fence"]["afterFence"] == 0
    assert r["fence"]["dropped"] == 1000
    assert r["fence"]["played"] == 256
    assert r["events"] == ["turn", "playing", "underrun", "resumed", "drained", "turn",
                           "playing", "stopped"]
