// rtserver browser demo: text (typed, or a simulated chatbot's tokens) in
// over /v1/stream, Opus out, decoded with WebCodecs and played through an
// AudioWorklet ring buffer. No build step, no network beyond this origin.
//
// Automation (the browser tests use it): ?autoplay=1&text=... speaks on load;
// ?autoplay=1&simulate=1&rate=N streams the canned reply at N tokens/s;
// &stop_after_ms=N presses Stop once N ms of the first turn's audio played; &format=pcm_s16le
// forces the PCM fallback; &player=scriptprocessor the non-worklet player;
// &voice=NAME; &token=KEY is passed on to the WebSocket. window.rtDemo.stats
// holds the current turn's figures (see freshStats).

import {CANNED_REPLY, streamTokens, tokenize} from "./chatbot.js";
import {TurnDecoder, opusSupported} from "./decoder.js";
import {BufferGraph} from "./graph.js";
import {Player} from "./player.js";
import {FLAG_LAST, parseAudioMessage, streamUrl} from "./protocol.js";

const params = new URLSearchParams(location.search);
const TOKEN = params.get("token") || "";
const STOP_AFTER_MS = params.get("stop_after_ms") === null ? null : Number(params.get("stop_after_ms"));
const FRAME_MS = 20; // the protocol's default frame
const DEFAULT_PREBUFFER_MS = 200; // used until the server's first `buffer` hint
const PLAYED_REPORT_MS = 1000; // how often `played` tells the server what was heard
const LOG_LINES = 300;
const SESSION = Math.random().toString(36).slice(2, 8); // context ids unique per page

const $ = (id) => document.getElementById(id);
const now = () => performance.now();
const round1 = (x) => (x === null || x === undefined ? null : Math.round(x * 10) / 10);

function freshStats(context, mode) {
  return {
    context, mode, state: context === null ? "idle" : "starting",
    format: null, sampleRate: null, frameMs: null, preSkip: null,
    // Client-side TTFA: from sending the text that completed the first
    // segment (approximated: the fragment holding the character after the
    // segment's end, which the segmenter needs to see, or the `end`) to the
    // first audio frame. ttfaFromFirstTextMs starts at the first text sent.
    ttfaMs: null, ttfaBasis: null, ttfaFromFirstTextMs: null, serverTtfaMs: null,
    startLatencyMs: null, // first text sent -> playback started (TTFA + prebuffer)
    framesReceived: 0, lastSeq: -1, seqGaps: 0, serverFrames: null, serverAudioMs: null,
    decodedRawSamples: 0, decodedSamples: 0, playedSamples: 0, playedRms: 0, bufferedMs: 0,
    backlogMs: 0, // received audio still in the decoder (the player waits for it)
    // Running dry, by cause (worklet.js): `underruns`/`stalledMs` with nothing
    // received waiting in the decoder (the server or network was late);
    // `decodeStalls`/`decodeStalledMs` while received audio still waited in the
    // decoder (the page was late). underrunLog holds both, with their `cause`.
    underruns: 0, underrunLog: [], stalledMs: 0,
    decodeStalls: 0, decodeStalledMs: 0,
    decodeWaitedMs: 0, // before the start: silence while the decoder held received audio
    prebufferMs: null, rtf: null, aheadMs: null, segments: 0,
    tokensSent: 0, tokensTotal: null, charsSent: 0,
    // Barge-in.
    stoppedAtMs: null, playedAtStopMs: null, cancelledLastSeq: null, framesAfterStop: 0,
    framesAfterCancelled: 0, playedAfterFence: 0, droppedAfterFence: 0, fadeSamples: 0,
    playedReportedMs: null, errors: [],
  };
}

const demo = {
  stats: freshStats(null, null), turns: [], ready: null, voices: [], format: null,
  playerKind: null, log: [],
  speak: (text) => speak(text), simulate: (rate) => simulate(rate), stop: () => stop(),
  audioState: () => (player && player.ctx ? player.ctx.state : "none"),
};
window.rtDemo = demo;

let player = null;
let conn = null;
let graph = null;
let current = null; // the Turn on screen
let turnCount = 0;
const turnsByStream = new Map();
const turnsById = new Map();

// ---------------------------------------------------------------- log

function log(dir, text) {
  const line = `${(now() / 1000).toFixed(3)} ${dir} ${text}`;
  demo.log.push(line);
  if (demo.log.length > LOG_LINES) demo.log.shift();
  const pre = $("log");
  if (pre) {
    pre.textContent = demo.log.slice(-80).join("\n");
    pre.scrollTop = pre.scrollHeight;
  }
}

// ---------------------------------------------------------------- connection

class Connection {
  constructor(url) {
    this.url = url;
    this.ws = null;
    this.retryMs = 500;
    this.readyPromise = null;
    this.open();
  }

  open() {
    setConn("connecting", "connecting…");
    let resolveReady;
    this.readyPromise = new Promise((r) => (resolveReady = r));
    const ws = new WebSocket(this.url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onmessage = (e) => {
      if (typeof e.data === "string") {
        let msg;
        try {
          msg = JSON.parse(e.data);
        } catch {
          log("←", `not JSON: ${e.data.slice(0, 80)}`);
          return;
        }
        if (msg.type === "ready") {
          this.retryMs = 500;
          resolveReady(msg);
        }
        onServerMessage(msg);
      } else {
        onAudio(e.data);
      }
    };
    ws.onclose = (e) => {
      log("×", `connection closed (${e.code}${e.reason ? " " + e.reason : ""})`);
      setConn("down", `disconnected (${e.code})`);
      if (current && !current.finished) failTurn(current, `connection closed (${e.code})`);
      setTimeout(() => this.open(), this.retryMs);
      this.retryMs = Math.min(this.retryMs * 2, 10000);
    };
  }

  ready() {
    return this.readyPromise;
  }

  send(obj) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) throw new Error("not connected");
    this.ws.send(JSON.stringify(obj));
    if (obj.type !== "text" && obj.type !== "played") log("→", JSON.stringify(obj));
  }
}

function setConn(kind, text) {
  const el = $("conn");
  el.className = `badge ${kind}`;
  el.textContent = text;
}

// ---------------------------------------------------------------- turns

class Turn {
  constructor(n, mode) {
    this.id = `${SESSION}-${n}`;
    this.n = n;
    this.mode = mode;
    this.text = ""; // the context's text as sent (segment offsets point into it)
    this.fragments = []; // {end, t}: cumulative length after each text message
    this.segments = []; // {index, start, end, seq, text}
    this.started = null;
    this.decoder = null;
    this.expectSeq = 0;
    this.tFirstText = null;
    this.tEnd = null;
    this.tComplete = null;
    this.tFirstFrame = null;
    this.tStart = now();
    this.lastFrameSeen = false;
    this.serverDone = false;
    this.drained = false;
    this.stopped = false;
    this.cancelled = false;
    this.finished = false;
    this.tFinished = null;
    this.ending = null;
    this.feeder = null;
    this.lastPlayedReport = -Infinity; // none yet: the first goes as soon as audio plays
    this.stats = freshStats(this.id, mode);
  }
}

async function audioReady() {
  await player.init();
  demo.playerKind = player.kind;
  const state = await Promise.race([
    player.resume(), new Promise((r) => setTimeout(() => r(player.ctx.state), 500)),
  ]);
  $("audio-blocked").hidden = state === "running";
  return state;
}

async function beginTurn(mode) {
  await audioReady();
  await conn.ready();
  if (current && !current.finished) await stop();
  const turn = new Turn(++turnCount, mode);
  current = turn;
  turnsById.set(turn.id, turn);
  demo.stats = turn.stats;
  demo.turns.push(turn.stats);
  graph.clear(turn.tStart);
  graph.mark(turn.tStart, "start");
  player.startTurn(turn.id, msToSamples(DEFAULT_PREBUFFER_MS));
  const start = {type: "start", context: turn.id, format: demo.format, sample_rate: 48000,
    frame_ms: FRAME_MS};
  const voice = $("voice").value;
  if (voice) start.voice = voice;
  conn.send(start);
  $("turn-id").textContent = `#${turn.n}`;
  updateButtons();
  return turn;
}

function sendText(turn, fragment) {
  if (turn.stopped || turn.finished) return;
  const t = now();
  if (turn.tFirstText === null) turn.tFirstText = t;
  turn.text += fragment;
  turn.fragments.push({end: turn.text.length, t});
  turn.stats.tokensSent += 1;
  turn.stats.charsSent = turn.text.length;
  conn.send({type: "text", context: turn.id, text: fragment});
}

function sendEnd(turn) {
  if (turn.stopped || turn.finished) return;
  turn.tEnd = now();
  conn.send({type: "end", context: turn.id});
}

async function speak(text) {
  const turn = await beginTurn("text");
  sendText(turn, text);
  sendEnd(turn);
  return turn.id;
}

async function simulate(rate) {
  $("rate").value = String(rate);
  $("rate-out").textContent = `${rate} tokens/s`;
  const turn = await beginTurn("chatbot");
  const tokens = tokenize(CANNED_REPLY);
  turn.stats.tokensTotal = tokens.length;
  turn.feeder = streamTokens(tokens, rate, (tok) => sendText(turn, tok),
    () => sendEnd(turn));
  return turn.id;
}

// Barge-in: silence now (the player fences within one render quantum), tell
// the server what was heard, then `cancel`; `cancelled` ends the turn.
async function stop() {
  const turn = current;
  if (!turn || turn.finished || turn.stopped) return;
  turn.stopped = true;
  const s = turn.stats;
  s.stoppedAtMs = round1(now() - turn.tStart);
  s.state = "stopping";
  if (turn.feeder) turn.feeder.cancel();
  if (turn.decoder) turn.decoder.close();
  graph.mark(now(), "stop");
  const snap = await player.fence(turn.id);
  if (snap) applyStatus(turn, snap);
  s.playedAtStopMs = round1(samplesToMs(s.playedSamples));
  if (turn.serverDone) {
    // The server finished this context already: nothing to cancel there.
    finish(turn, "cancelled");
  } else if (!turn.cancelled) {
    try {
      conn.send({type: "played", context: turn.id, audio_ms: s.playedAtStopMs});
      s.playedReportedMs = s.playedAtStopMs;
      conn.send({type: "cancel", context: turn.id});
    } catch (e) {
      failTurn(turn, String(e));
    }
  }
  updateButtons();
}

function failTurn(turn, why) {
  turn.stats.errors.push(why);
  if (turn.finished) return;
  turn.stats.state = "error";
  turn.finished = true;
  turn.tFinished = now();
  if (turn.feeder) turn.feeder.cancel();
  if (turn.decoder) turn.decoder.close();
  player.fence(turn.id);
  graph.dirty = true;
  updateButtons();
}

function finish(turn, state) {
  if (turn.finished) return;
  turn.finished = true;
  turn.tFinished = now();
  turn.stats.state = state;
  log("·", `turn ${turn.id} ${state}: played ${samplesToMs(turn.stats.playedSamples).toFixed(0)} ms`);
  updateButtons();
  if (turn === current) {
    graph.dirty = true;
    renderTranscript(); // the final picture, without waiting for the next frame
    renderStats();
  }
}

// The server's audio for the turn is complete and decoded: let the player
// play out the rest without waiting for the prebuffer.
function endAudio(turn) {
  if (turn.ending || turn.stopped) return;
  turn.ending = (turn.decoder ? turn.decoder.flush() : Promise.resolve()).then(
    () => {
      if (!turn.stopped) player.end(turn.id);
    },
    (e) => failTurn(turn, `decoder flush: ${e}`));
}

// ---------------------------------------------------------------- server messages

function onServerMessage(msg) {
  if (msg.type === "ready") {
    onReady(msg);
    return;
  }
  if (msg.type !== "buffer") log("←", JSON.stringify(msg));
  const known = turnsById.get(msg.context);
  if (msg.type === "cancelled" && known) {
    onCancelled(known, msg);
    return;
  }
  const turn = current && msg.context === current.id ? current : null;
  if (turn === null) return; // an older turn's late news
  const s = turn.stats;
  switch (msg.type) {
    case "started": {
      turn.started = msg;
      turnsByStream.set(msg.stream, turn);
      Object.assign(s, {format: msg.format, sampleRate: msg.sample_rate, frameMs: msg.frame_ms,
        preSkip: msg.pre_skip});
      if (turn.stopped) break;
      turn.decoder = new TurnDecoder({
        format: msg.format, streamRate: msg.sample_rate, outRate: player.rate,
        preSkip: msg.pre_skip || 0, frameMs: msg.frame_ms,
        onPcm: (pcm) => {
          s.decodedSamples += pcm.length;
          s.decodedRawSamples = turn.decoder.rawSamples;
          player.push(turn.id, pcm, turn.decoder.backlogSamples);
        },
        onBacklog: (samples) => player.setBacklog(turn.id, samples),
        onError: (e) => failTurn(turn, `decoder: ${e}`),
      });
      if (s.state === "starting") s.state = "buffering";
      break;
    }
    case "segment": {
      const [start, end] = msg.source;
      turn.segments.push({index: msg.index, start, end, seq: msg.seq, text: msg.text});
      s.segments = turn.segments.length;
      if (msg.index === 0) firstSegment(turn, end);
      break;
    }
    case "buffer":
      s.prebufferMs = msg.prebuffer_ms;
      s.rtf = msg.rtf;
      s.aheadMs = msg.ahead_ms;
      if (!turn.stopped) player.setPrebuffer(turn.id, msToSamples(msg.prebuffer_ms));
      break;
    case "done":
      turn.serverDone = true;
      s.serverFrames = msg.frames;
      s.serverAudioMs = msg.audio_ms;
      s.serverTtfaMs = msg.ttfa_ms;
      if (turn.stopped) break;
      endAudio(turn);
      if (turn.drained) finish(turn, "done");
      break;
    case "error":
      // Before `started` the context was refused (unknown_voice, too_many_contexts,
      // overloaded, ...); after it, engine_failed and internal end it.
      if (!turn.started || msg.code === "engine_failed" || msg.code === "internal") {
        failTurn(turn, `${msg.code}: ${msg.message}`);
      } else {
        s.errors.push(`${msg.code}: ${msg.message}`);
      }
      break;
    default:
      break;
  }
}

// `cancelled` fences the context: no frame after last_seq will come. The
// player was fenced at Stop already; fence again (a no-op) and finish.
function onCancelled(turn, msg) {
  turn.cancelled = true;
  turn.stats.cancelledLastSeq = msg.last_seq;
  player.fence(turn.id).then((snap) => {
    if (snap && turn === current) applyStatus(turn, snap);
    finish(turn, "cancelled");
  });
}

// The first segment's text was completed by the fragment holding the
// character after its end (the segmenter waits for it), or by `end`.
function firstSegment(turn, end) {
  const f = turn.fragments.find((x) => x.end > end);
  if (f) {
    turn.tComplete = f.t;
    turn.stats.ttfaBasis = "completing fragment";
  } else if (turn.tEnd !== null) {
    turn.tComplete = turn.tEnd;
    turn.stats.ttfaBasis = "end";
  } else {
    // Cut by the segmenter's timer or word limit on the text so far.
    turn.tComplete = turn.fragments.length ? turn.fragments[turn.fragments.length - 1].t : now();
    turn.stats.ttfaBasis = "last fragment (timer)";
  }
}

function onAudio(buffer) {
  let m;
  try {
    m = parseAudioMessage(buffer);
  } catch (e) {
    log("←", `bad binary message: ${e.message}`);
    return;
  }
  const turn = turnsByStream.get(m.stream);
  if (!turn) return;
  const s = turn.stats;
  if (turn !== current || turn.stopped || turn.finished) {
    s.framesAfterStop += m.count;
    if (turn.cancelled) s.framesAfterCancelled += m.count;
    return;
  }
  const t = now();
  if (turn.tFirstFrame === null) {
    turn.tFirstFrame = t;
    if (turn.tComplete !== null) s.ttfaMs = round1(t - turn.tComplete);
    if (turn.tFirstText !== null) s.ttfaFromFirstTextMs = round1(t - turn.tFirstText);
    log("←", `first audio frame, seq ${m.seq}`);
  }
  if (m.seq !== turn.expectSeq) s.seqGaps += 1;
  turn.expectSeq = m.seq + m.count;
  s.framesReceived += m.count;
  s.lastSeq = m.seq + m.count - 1;
  for (let i = 0; i < m.count; i++) turn.decoder.decode(m.seq + i, m.frames[i]);
  // Received but not decoded yet: the player does not start on it (worklet.js).
  if (s.format === "opus") player.setBacklog(turn.id, turn.decoder.backlogSamples);
  if (m.flags & FLAG_LAST) {
    turn.lastFrameSeen = true;
    endAudio(turn);
  }
}

async function onReady(msg) {
  demo.ready = msg;
  const lim = msg.limits || {};
  $("server-info").textContent = `${msg.server || "server"} · protocol ${msg.protocol}` +
    (lim.max_contexts ? ` · ${lim.max_contexts} contexts/connection` : "");
  setConn("up", "connected");
  const select = $("voice");
  const names = msg.voices || [];
  let details = {};
  try {
    const headers = TOKEN ? {Authorization: `Bearer ${TOKEN}`} : {};
    const r = await fetch("/v1/voices", {headers});
    if (r.ok) for (const v of (await r.json()).voices || []) details[v.name] = v;
  } catch {
    details = {};
  }
  const wanted = params.get("voice") || select.value || msg.default_voice;
  select.replaceChildren(...names.map((name) => {
    const o = document.createElement("option");
    const d = details[name];
    o.value = name;
    o.textContent = d ? `${name.split(":").pop()} — ${d.family}, ${d.language}, ` +
      `${(d.sample_rate / 1000).toFixed(d.sample_rate % 1000 ? 2 : 0)} kHz` : name;
    return o;
  }));
  if (names.includes(wanted)) select.value = wanted;
  demo.voices = names.map((n) => details[n] || {name: n});
}

// ---------------------------------------------------------------- player status

function applyStatus(turn, m) {
  const s = turn.stats;
  const rate = player.rate;
  s.playedSamples = m.played;
  s.playedRms = m.rms;
  s.bufferedMs = round1((m.buffered / rate) * 1000);
  s.backlogMs = round1((m.backlog / rate) * 1000);
  s.underruns = m.underruns;
  s.stalledMs = round1((m.stalled / rate) * 1000);
  s.decodeStalls = m.decodeStalls;
  s.decodeStalledMs = round1((m.decodeStalled / rate) * 1000);
  s.decodeWaitedMs = round1((m.decodeWaited / rate) * 1000);
  s.playedAfterFence = m.afterFence;
  s.droppedAfterFence = m.droppedAfterFence;
  s.fadeSamples = m.fadeSamples;
}

function onPlayerStatus(m) {
  if (m.t !== "status" && m.t !== "fenced") return;
  const turn = current && m.turn === current.id ? current : null;
  if (!turn) return;
  applyStatus(turn, m);
  const s = turn.stats;
  const t = now();
  if (m.t === "status") graph.add(t, s.bufferedMs, s.prebufferMs ?? DEFAULT_PREBUFFER_MS);
  if (turn.stopped || turn.finished) return;
  if (m.state === "prebuffering") s.state = "buffering";
  else if (m.state === "playing") s.state = "playing";
  else if (m.state === "rebuffering") s.state = "rebuffering";
  if (m.event === "playing") {
    if (turn.tFirstText !== null) s.startLatencyMs = round1(t - turn.tFirstText);
    graph.mark(t, "playing");
  } else if (m.event === "underrun" || m.event === "decode-stall") {
    graph.mark(t, m.event);
    // Who was late: the player's backlog (received audio still in the decoder
    // when it ran dry) says the page ("decoder"); none, the server or network.
    const frameMs = s.frameMs || FRAME_MS;
    const u = {
      cause: m.event === "underrun" ? "server" : "decoder",
      atMs: round1(t - turn.tStart), playedMs: round1(samplesToMs(m.played)),
      receivedMs: round1(s.framesReceived * frameMs - ((s.preSkip || 0) / 48000) * 1000),
      decodedMs: round1(samplesToMs(s.decodedSamples)), backlogMs: round1(samplesToMs(m.backlog)),
      prebufferMs: s.prebufferMs, rtf: s.rtf,
    };
    s.underrunLog.push(u);
    log("!", `${m.event}: ${JSON.stringify(u)}`);
  } else if (m.event === "drained") {
    turn.drained = true;
    if (turn.serverDone) finish(turn, "done");
  }
  // Automation: Stop once the first turn has played stop_after_ms of audio,
  // while it is playing with some audio buffered (so Stop cuts sound, not a stall).
  if (STOP_AFTER_MS !== null && turn.n === 1 && samplesToMs(m.played) >= STOP_AFTER_MS &&
      m.state === "playing" && samplesToMs(m.buffered) >= 2 * FRAME_MS) {
    stop();
    return;
  }
  // Tell the server how far the listener is: the first `played` as soon as
  // audio plays, even after `done` (the server measures the time to first
  // heard audio from it: its arrival less audio_ms, so a later first report
  // would carry any stall since), then every PLAYED_REPORT_MS while the
  // context is open.
  const first = turn.lastPlayedReport === -Infinity;
  if (m.played > 0 && !turn.cancelled && (first || (!turn.serverDone &&
      t - turn.lastPlayedReport >= PLAYED_REPORT_MS))) {
    turn.lastPlayedReport = t;
    s.playedReportedMs = round1(samplesToMs(m.played));
    try {
      conn.send({type: "played", context: turn.id, audio_ms: s.playedReportedMs});
    } catch {
      // the connection dropped; onclose fails the turn
    }
  }
}

const msToSamples = (ms) => Math.round((ms * player.rate) / 1000);
const samplesToMs = (n) => (n / (player ? player.rate : 48000)) * 1000;

// ---------------------------------------------------------------- rendering

function escapeHtml(s) {
  return s.replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;"})[c]);
}

// Index of the segment being heard: the last whose first frame's play time
// (seq * frame_ms) has passed, the output latency taken off.
function currentSegment(turn) {
  const s = turn.stats;
  if (!s.frameMs || s.playedSamples === 0) return -1;
  const latency = player.ctx ? (player.ctx.outputLatency || player.ctx.baseLatency || 0) : 0;
  const heardMs = samplesToMs(s.playedSamples) - latency * 1000;
  let k = -1;
  for (let i = 0; i < turn.segments.length; i++) {
    if (turn.segments[i].seq * s.frameMs <= heardMs) k = i;
  }
  return k;
}

let lastTranscriptKey = "";

function renderTranscript() {
  const el = $("transcript");
  const turn = current;
  if (!turn) return;
  const playing = turn.stats.state === "playing" || turn.stats.state === "rebuffering" ||
    turn.stats.state === "buffering";
  const cur = turn.stats.state === "done" ? turn.segments.length : currentSegment(turn);
  const key = `${turn.id}|${turn.text.length}|${turn.segments.length}|${cur}|${turn.stats.state}`;
  if (key === lastTranscriptKey) return;
  lastTranscriptKey = key;
  const parts = [];
  let at = 0;
  const segs = [...turn.segments].sort((a, b) => a.start - b.start);
  segs.forEach((seg) => {
    if (seg.start > at) parts.push(`<span class="gap">${escapeHtml(turn.text.slice(at, seg.start))}</span>`);
    const k = turn.segments.indexOf(seg);
    let cls = "queued";
    if (k < cur) cls = "spoken";
    else if (k === cur && playing) cls = "current";
    else if (k === cur) cls = "spoken";
    parts.push(`<span class="seg ${cls}" data-n="${seg.index + 1}" title="${escapeHtml(`#${seg.index} seq ${seg.seq}: ${seg.text}`)}">` +
      `${escapeHtml(turn.text.slice(seg.start, seg.end))}</span>`);
    at = Math.max(at, seg.end);
  });
  if (at < turn.text.length) {
    parts.push(`<span class="pending">${escapeHtml(turn.text.slice(at))}</span>`);
  }
  if (!turn.finished && turn.tEnd === null && !turn.stopped) parts.push("<span class=\"caret\"></span>");
  el.innerHTML = parts.join("");
  const curEl = el.querySelector(".current");
  if (curEl && curEl.scrollIntoView) curEl.scrollIntoView({block: "nearest"});
}

function fmt(x, unit = "", digits = 0) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  return `${Number(x).toFixed(digits)}${unit}`;
}

function renderStats() {
  const s = demo.stats;
  const set = (id, text) => {
    const el = $(id);
    if (el && el.textContent !== text) el.textContent = text;
  };
  set("st-ttfa", fmt(s.ttfaMs, " ms"));
  set("st-ttfa-basis", s.ttfaBasis ? `from the ${s.ttfaBasis}` : "from the text that completed segment 1");
  set("st-ttfa-first", fmt(s.ttfaFromFirstTextMs, " ms"));
  set("st-ttfa-server", fmt(s.serverTtfaMs, " ms"));
  set("st-start", fmt(s.startLatencyMs, " ms"));
  set("st-buffered", fmt(s.bufferedMs, " ms"));
  set("st-prebuffer", fmt(s.prebufferMs, " ms"));
  set("st-rtf", fmt(s.rtf, "", 2));
  set("st-ahead", s.aheadMs === null ? "ahead —" : `ahead ${fmt(s.aheadMs, " ms")}`);
  set("st-underruns", String(s.underruns));
  set("st-stalled", `${fmt(s.stalledMs, " ms")} stalled` +
    (s.decodeStalls || s.decodeWaitedMs ? ` · decoder: ${s.decodeStalls} stalls, ` +
      `${fmt(s.decodeStalledMs + s.decodeWaitedMs, " ms")}` : ""));
  set("st-played", fmt(samplesToMs(s.playedSamples) / 1000, " s", 2));
  set("st-audio", `decoded ${fmt(samplesToMs(s.decodedSamples) / 1000, " s", 2)} · server ` +
    `${s.serverAudioMs === null ? "—" : fmt(s.serverAudioMs / 1000, " s", 2)}`);
  set("st-frames", String(s.framesReceived));
  set("st-seq", `last seq ${s.lastSeq}${s.seqGaps ? ` · ${s.seqGaps} gaps` : ""}` +
    `${s.serverFrames !== null ? ` · server ${s.serverFrames}` : ""}`);
  const stateEl = $("state");
  if (stateEl.textContent !== s.state) {
    stateEl.textContent = s.state;
    stateEl.className = `state ${s.state}`;
  }
  set("errors", s.errors.length ? s.errors[s.errors.length - 1] : "");
  $("errors").hidden = s.errors.length === 0;
  const bargeIn = s.stoppedAtMs !== null;
  $("bargein").hidden = !bargeIn;
  if (bargeIn) {
    set("st-heard", fmt(s.playedAtStopMs, " ms"));
    set("st-fence", `${s.playedAfterFence} samples after fence · fade ${s.fadeSamples} · ` +
      `${s.framesAfterStop} frames dropped`);
  }
}

function updateButtons() {
  const live = current && !current.finished && !current.stopped;
  $("stop").disabled = !live;
}

function frame() {
  renderTranscript();
  renderStats();
  // The graph moves while a turn is live, and stops when it is over.
  const live = current && !current.finished;
  if (live || graph.dirty) {
    graph.draw(current && current.tFinished !== null ? current.tFinished + 500 : now());
  }
  requestAnimationFrame(frame);
}

// ---------------------------------------------------------------- start

async function main() {
  graph = new BufferGraph($("graph"));
  player = new Player(onPlayerStatus, {forceScriptProcessor: params.get("player") === "scriptprocessor"});
  const forced = params.get("format");
  demo.format = forced || ((await opusSupported()) ? "opus" : "pcm_s16le");
  $("codec").textContent = demo.format === "opus" ? "Opus · WebCodecs" : "PCM s16le (no WebCodecs Opus)";
  $("rate").addEventListener("input", () => ($("rate-out").textContent = `${$("rate").value} tokens/s`));
  if (params.get("rate")) $("rate").value = params.get("rate");
  $("rate-out").textContent = `${$("rate").value} tokens/s`;
  if (params.get("text")) $("text").value = params.get("text");
  $("speak").addEventListener("click", () => {
    if ($("text").value.trim()) speak($("text").value).catch((e) => log("!", String(e)));
  });
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("speak").click();
  });
  $("simulate").addEventListener("click", () => simulate(Number($("rate").value))
    .catch((e) => log("!", String(e))));
  $("stop").addEventListener("click", () => stop());
  $("audio-blocked").addEventListener("click", () => audioReady());
  $("preview").textContent = CANNED_REPLY;
  window.addEventListener("resize", () => (graph.dirty = true));
  conn = new Connection(streamUrl(location, TOKEN));
  requestAnimationFrame(frame);
  if (params.get("autoplay") === "1") {
    await conn.ready();
    if (params.get("simulate") === "1") await simulate(Number(params.get("rate") || $("rate").value));
    else await speak($("text").value);
  }
}

main().catch((e) => {
  log("!", `demo failed to start: ${e}`);
  demo.stats.state = "error";
  demo.stats.errors.push(String(e));
});
