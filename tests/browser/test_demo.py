"""The browser demo, end to end: headless Chromium against a real rtserver.

What a person at the demo would check: the page connects, speaks the text
with no gap, the audio it played is all the audio the server sent, Stop
silences it at once and the next turn is clean. Figures come from the page's
``window.rtDemo.stats`` (see rtserver/web_demo/app.js) and the server's own ``done``.

The page's player runs dry for one of two reasons, counted apart
(rtserver/web_demo/worklet.js): an underrun (``underruns``, ``stalledMs``)
when nothing it received was still waiting to be decoded, i.e. the audio came
late, and a decode stall (``decodeStalls``) when received audio still sat in
its own decoder (a browser still starting). The tests hold the server to no
underrun; the page does not start, or resume, while its decoder is behind
(``decodeWaitedMs``).
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from rtserver.testing.wait import scaled, wait_until

from .cdp import Page
from .conftest import DemoServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RATE = 48000  # the demo's AudioContext rate; Opus decodes at 48 kHz
TURN_TIMEOUT_S = 120.0
TEXT = "Hello from the browser test. Dr. Smith paid $3.50 for 2 coffees, and it took 20 minutes."
FINISHED = ("done", "cancelled", "error")
# Time to first heard audio (first text sent -> playback) of a page speaking on
# load, a cold browser included: a few hundred ms on the 2-core CI machine.
# Only a page that waits for no reason (or a server far behind) reaches this.
FIRST_HEARD_LIMIT_MS = 3000.0


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
    # No underrun: the server's audio was never late. A decode stall (the
    # page's own decoder behind what it received) is the browser's, not the
    # server's: allowed, and in the message if an underrun comes with it.
    assert stats["underruns"] == 0, json.dumps({k: stats[k] for k in (
        "underrunLog", "stalledMs", "decodeStalls", "decodeStalledMs", "decodeWaitedMs",
        "prebufferMs", "rtf", "ttfaMs", "serverTtfaMs")})
    assert stats["stalledMs"] == 0
    assert all(u["cause"] == "decoder" for u in stats["underrunLog"]), stats["underrunLog"]
    assert len(stats["underrunLog"]) == stats["decodeStalls"]
    # Speech, not silence (Piper speaks at an RMS of roughly 0.05 to 0.2).
    assert stats["playedRms"] > 0.005


def heard_reports(server: DemoServer) -> tuple[float, float]:
    """The server's ``rtserver_time_to_first_heard_seconds`` (count, sum), all
    voices: what the listeners' first ``played`` said."""
    req = urllib.request.Request(f"{server.http}/metrics",
                                 headers={"Authorization": f"Bearer {server.token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    count = total = 0.0
    for m in re.finditer(r"^rtserver_time_to_first_heard_seconds_(count|sum)\{[^}]*\} (\S+)$",
                         text, re.M):
        if m.group(1) == "count":
            count += float(m.group(2))
        else:
            total += float(m.group(2))
    return count, total


def assert_server_heard(server: DemoServer, before: tuple[float, float],
                        stats: dict[str, Any]) -> None:
    """The page's first `played` went out as playback began, also after `done`:
    the server measured one more time to first heard audio, from the same text
    message as the page's ``startLatencyMs``: the same but for the text's trip
    to the server (less) and the ack's back (more), and as long as the server's
    loop, busy synthesizing the rest, takes to read the ack (+190 ms seen on 2
    cores)."""
    count0, sum0 = before
    wait_until(lambda: heard_reports(server)[0] > count0,
               "the server measured the first heard audio", 10)
    count1, sum1 = heard_reports(server)
    assert count1 == count0 + 1
    heard_ms = (sum1 - sum0) * 1000
    print(f"server's time to first heard audio {heard_ms:.1f} ms, the page's "
          f"{stats['startLatencyMs']} ms")
    assert stats["startLatencyMs"] - scaled(100) <= heard_ms <= scaled(FIRST_HEARD_LIMIT_MS) + \
        stats["decodeWaitedMs"]


def test_speaks_text_on_load(demo_server: DemoServer, page: Page, output_dir: Path) -> None:
    """The page speaks its ``text`` as it loads, in a browser already running.

    A listener's browser runs before it opens the page, and on another machine than
    the server; here a new Chromium would start on the same 2 cores as the reply
    (its first page load spawns its renderer and GPU processes), which ran the
    server's next chunks late on a 40 ms first hint (1 of 12 runs, 2026-12-06). So
    the browser loads the page once, settles, then loads it again to speak."""
    page.navigate(demo_server.url())
    page.wait_for("window.rtDemo && rtDemo.ready !== null && document.readyState === 'complete'",
                  scaled(60))
    page.evaluate("new Promise((r) => requestIdleCallback(() => r(true), {timeout: 2000}))")
    reports_before = heard_reports(demo_server)
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
    # Time to first heard audio: the page spoke soon, not at the end or after a
    # long wait (decodeWaitedMs: the part its own decoder held it back).
    print(f"\nbrowser demo, speaking on load: startLatencyMs {stats['startLatencyMs']} ms "
          f"(time to first heard audio), TTFA {stats['ttfaMs']} ms, server TTFA "
          f"{stats['serverTtfaMs']} ms, prebuffer hint {stats['prebufferMs']} ms, waited for "
          f"the decoder {stats['decodeWaitedMs']} ms, decode stalls {stats['decodeStalls']}")
    assert stats["startLatencyMs"] <= scaled(FIRST_HEARD_LIMIT_MS)
    assert_server_heard(demo_server, reports_before, stats)
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


# A decoder behind what the page received, as in a browser still starting:
# WebCodecs' AudioDecoder wrapped so that its outputs come in two batches. The
# first PREBUFFER + 3 frames (more than the server's `buffer` hint asks for),
# once the page has given the decoder 10 frames beyond them; the rest
# LAG_HOLD_MS later. flush() waits for the held ones, as a real decoder's would.
LAG_HOLD_MS = 600
LAGGING_DECODER = """
(() => {
  const Real = window.AudioDecoder;
  if (!Real) return;
  const lag = window.rtLag = {submitted: 0, delivered: 0, firstBatch: null, prebufferMs: null,
                              heldUntil: null, playedAtRelease: null, releasedAt: null};
  const queue = [];
  let output = null;
  const deliver = (d) => { lag.delivered += 1; output(d); };
  const tick = () => {
    const s = window.rtDemo && window.rtDemo.stats;
    if (lag.firstBatch === null) {
      const prebufferMs = (s && s.prebufferMs) || 200;
      const frames = Math.ceil(prebufferMs / 20) + 3;
      if (queue.length >= frames && lag.submitted >= frames + 10) {
        lag.firstBatch = frames;
        lag.prebufferMs = prebufferMs;
        queue.splice(0, frames).forEach(deliver);
        lag.heldUntil = performance.now() + LAG_HOLD_MS;
      }
    } else if (lag.releasedAt === null && performance.now() >= lag.heldUntil) {
      lag.playedAtRelease = s.playedSamples;
      lag.releasedAt = performance.now();
      queue.splice(0).forEach(deliver);
    }
  };
  setInterval(tick, 5);
  window.AudioDecoder = class extends Real {
    constructor(init) {
      super({...init, output: (d) => {
        if (lag.releasedAt !== null) deliver(d); else queue.push(d);
      }});
      output = init.output;
    }
    decode(chunk) { lag.submitted += 1; super.decode(chunk); }
    async flush() {
      await super.flush();
      while (lag.releasedAt === null) await new Promise((r) => setTimeout(r, 5));
    }
  };
})();
""".replace("LAG_HOLD_MS", str(LAG_HOLD_MS))


def test_a_lagging_decoder_delays_the_start_and_is_no_underrun(demo_server: DemoServer,
                                                                page: Page) -> None:
    """The page holds more decoded audio than the prebuffer hint asks for while
    its decoder sits on received audio: it waits for the decoder rather than
    start and run dry (which the server would be blamed for), and says how
    long it waited. Without the wait this is an underrun of ~LAG_HOLD_MS."""
    page.call("Page.addScriptToEvaluateOnNewDocument", source=LAGGING_DECODER)
    count0, sum0 = heard_reports(demo_server)
    page.navigate(demo_server.url(f"autoplay=1&text={quote(TEXT)}"))
    stats = wait_finished(page)
    lag = page.evaluate("window.rtLag")
    assert stats["format"] == "opus"
    assert lag["firstBatch"] is not None and lag["releasedAt"] is not None, lag
    # Nothing played while the decoder held received audio, though the first
    # batch alone was above the prebuffer (the hint then: a loaded server may
    # send a larger one later).
    assert lag["firstBatch"] * 20 > lag["prebufferMs"]
    assert lag["playedAtRelease"] == 0, (lag, stats["underrunLog"])
    assert stats["decodeWaitedMs"] >= LAG_HOLD_MS * 0.8, stats["decodeWaitedMs"]
    assert stats["decodeStalls"] == 0
    assert_heard_everything(stats)
    # The first `played` told the server when the listener began hearing,
    # the wait included (often after its `done`: the server had sent it all).
    assert stats["startLatencyMs"] >= LAG_HOLD_MS
    assert_server_heard(demo_server, (count0, sum0), stats)
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


# The decoder's backlog (received audio not decoded yet): no start or resume
# while there is some; running dry with some is a decode stall, without any
# an underrun. Runs after RING_SCENARIO, in the same page (RingPlayerCore loaded).
RING_BACKLOG_SCENARIO = """
(() => {
  const events = [];
  const core = new RingPlayerCore((m) => { if (m.event) events.push(m.event); });
  const out = new Float32Array(128);
  const fill = (n, v) => new Float32Array(n).fill(v);
  const render = (k = 1) => { for (let i = 0; i < k; i++) core.render(out, 0); return out; };
  const counts = () => ({state: core.state, underruns: core.underruns, stalled: core.stalled,
                         decodeStalls: core.decodeStalls, decodeStalled: core.decodeStalled,
                         decodeWaited: core.decodeWaited});
  const r = {};
  core.handle({t: "turn", turn: "c", prebuffer: 256});
  core.handle({t: "backlog", turn: "c", samples: 960});  // received, in the decoder
  render();
  core.handle({t: "audio", turn: "c", pcm: fill(512, 0.5), backlog: 960});
  render(2);  // 512 >= 256 decoded, but the decoder is behind: wait
  r.held = counts();
  core.handle({t: "audio", turn: "c", pcm: fill(256, 0.5), backlog: 0});
  render();  // caught up: play
  r.started = {state: core.state, played: core.played};
  core.handle({t: "backlog", turn: "c", samples: 960});
  render(6);  // 640 left = 5 quanta, then dry with audio in the decoder
  r.decodeStall = counts();
  core.handle({t: "audio", turn: "c", pcm: fill(300, 0.5), backlog: 0});
  render();  // 300 >= 256, nothing in the decoder: resume
  r.resumed = {state: core.state, played: core.played};
  render(3);  // 172 left: a quantum, a short one (44: dry, nothing received), a silent one
  r.underrun = counts();
  core.handle({t: "audio", turn: "c", pcm: fill(100, 0.5), backlog: 480});
  render();  // rebuffering: 100 < 256, and the decoder holds more
  r.waiting = counts();
  core.handle({t: "end", turn: "c"});
  render(2);  // the end: what is there plays out
  r.end = counts();
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

    b = page.evaluate(RING_BACKLOG_SCENARIO)
    none = {"underruns": 0, "stalled": 0, "decodeStalls": 0, "decodeStalled": 0}
    # Above the prebuffer, but the decoder holds received audio: no start.
    assert b["held"] == {"state": "prebuffering", **none, "decodeWaited": 3 * 128}
    assert b["started"] == {"state": "playing", "played": 128}
    # Dry with audio in the decoder: the page's stall, not the server's.
    assert b["decodeStall"] == {"state": "rebuffering", "underruns": 0, "stalled": 0,
                                "decodeStalls": 1, "decodeStalled": 128,
                                "decodeWaited": 3 * 128}
    assert b["resumed"] == {"state": "playing", "played": 768 + 128}
    # Dry with nothing received waiting: an underrun, the server's.
    assert b["underrun"] == {"state": "rebuffering", "underruns": 1, "stalled": 84 + 128,
                             "decodeStalls": 1, "decodeStalled": 128, "decodeWaited": 3 * 128}
    # Waiting to resume while the decoder holds audio is the decoder's time.
    assert b["waiting"] == {**b["underrun"], "decodeStalled": 2 * 128}
    assert b["end"]["state"] == "drained"
    assert b["events"] == ["turn", "playing", "decode-stall", "resumed", "underrun", "drained"]
