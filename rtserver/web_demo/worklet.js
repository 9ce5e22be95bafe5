// Ring-buffer player: one mono stream of float samples, one turn at a time.
//
// Runs as an AudioWorkletProcessor ("rt-ring-player"); where AudioWorklet is
// missing (pages served over plain http from a non-local host are not a
// secure context) app.js loads this same file as a classic script and drives
// RingPlayerCore from a ScriptProcessorNode instead.
//
// Playback starts, and resumes after running dry, on decoded audio only:
// once `prebuffer` samples are buffered here AND the page's decoder holds no
// received audio (`backlog` 0), or at the end. While the decoder is behind
// what the page received (a browser still starting, a busy main thread),
// buffering more decoded audio would not mean the stream caught up, so
// playback waits for the decoder. Running dry is counted by its cause: an
// underrun (`underruns`, `stalled`) when nothing received was waiting to be
// decoded, i.e. the server or network was late; a decode stall
// (`decodeStalls`, `decodeStalled`) when received audio was still in the
// decoder, i.e. the page was late. Silence while waiting to resume counts as
// the decoder's while it holds received audio, else as the audio's
// (`stalled`); `decodeWaited`: silence before the start while it held some.
//
// Messages in ({t: ...}, every one names its turn; audio of another turn is
// dropped):
//   turn      {turn, prebuffer}  new turn: drop everything, wait for `prebuffer` samples
//   audio     {turn, pcm, backlog?}  append a Float32Array; `backlog`: received
//                                samples still in the decoder after this one
//   backlog   {turn, samples}    the decoder's backlog (received, not decoded yet)
//   prebuffer {turn, samples}    new target (the server's `buffer` hint), used at
//                                the start and after running dry
//   end       {turn}             no more audio: play out what is buffered
//   fence     {turn, id}         barge-in: the next render quantum fades out
//                                (<= 128 samples), then silence; the buffer is dropped
// Messages out: {t: "status", ...} every STATUS_QUANTA quanta and at every
// state change (`event` names it), {t: "fenced", id, ...} acknowledging a fence.

const QUANTUM = 128; // Web Audio render quantum, in sample frames
const STATUS_QUANTA = 8; // 8 x 128 / 48000 = 21 ms between status reports

class RingPlayerCore {
  constructor(post) {
    this.post = post;
    this.buf = new Float32Array(1 << 20); // ~22 s at 48 kHz; grows when needed
    this.turn = null;
    this.reset(null, 0);
  }

  reset(turn, prebuffer) {
    this.turn = turn;
    this.head = 0; // read position in buf
    this.size = 0; // buffered samples
    this.prebuffer = prebuffer;
    this.state = turn === null ? "idle" : "prebuffering";
    this.ended = false;
    this.fencing = false; // fence received, fade-out quantum not rendered yet
    this.fenced = false;
    this.played = 0; // samples rendered from the buffer this turn
    this.sumSquares = 0; // of the played samples (a silent stream shows as rms 0)
    this.received = 0;
    this.backlog = 0; // received samples the page's decoder has not output yet
    this.underruns = 0; // ran dry with nothing waiting in the decoder: the server was late
    this.stalled = 0; // samples of silence while rebuffering with nothing waiting in the decoder
    this.decodeStalls = 0; // ran dry while received audio waited in the decoder: the page was late
    this.decodeStalled = 0; // samples of silence while rebuffering with audio in the decoder
    this.decodeWaited = 0; // samples of silence before the start with audio in the decoder
    this.afterFence = 0; // non-silent samples output after the fence quantum
    this.droppedAfterFence = 0; // samples that arrived for the turn after its fence
    this.fadeSamples = 0;
    this.startFrame = -1; // currentFrame when playback started
    this.quanta = 0;
  }

  handle(m) {
    if (m.t === "turn") {
      this.reset(m.turn, m.prebuffer);
      this.report("turn");
      return;
    }
    if (m.turn !== this.turn) {
      return; // a message about an older turn: it is over
    }
    if (m.t === "audio") {
      if (this.fencing || this.fenced) {
        this.droppedAfterFence += m.pcm.length;
        return;
      }
      this.append(m.pcm);
      if (m.backlog !== undefined) this.backlog = m.backlog;
    } else if (m.t === "backlog") {
      this.backlog = m.samples;
    } else if (m.t === "prebuffer") {
      this.prebuffer = m.samples;
    } else if (m.t === "end") {
      this.ended = true;
    } else if (m.t === "fence") {
      if (!this.fencing && !this.fenced) {
        this.fencing = true;
      }
      this.fenceId = m.id;
      if (this.fenced) {
        this.post({t: "fenced", id: m.id, ...this.snapshot()});
      }
    }
  }

  append(pcm) {
    this.received += pcm.length;
    if (this.size + pcm.length > this.buf.length) {
      let cap = this.buf.length;
      while (cap < this.size + pcm.length) cap *= 2;
      const grown = new Float32Array(cap);
      for (let i = 0; i < this.size; i++) grown[i] = this.buf[(this.head + i) % this.buf.length];
      this.buf = grown;
      this.head = 0;
    }
    const cap = this.buf.length;
    const tail = (this.head + this.size) % cap;
    const first = Math.min(pcm.length, cap - tail);
    this.buf.set(pcm.subarray(0, first), tail);
    if (first < pcm.length) this.buf.set(pcm.subarray(first), 0);
    this.size += pcm.length;
  }

  // Copy n buffered samples into out[0..n) and consume them.
  take(out, n) {
    const cap = this.buf.length;
    const first = Math.min(n, cap - this.head);
    out.set(this.buf.subarray(this.head, this.head + first), 0);
    if (first < n) out.set(this.buf.subarray(0, n - first), first);
    this.head = (this.head + n) % cap;
    this.size -= n;
    return n;
  }

  // Fill one render quantum (out.length samples, normally 128) at currentFrame.
  render(out, frame) {
    out.fill(0);
    let event = null;
    if (this.fencing) {
      // Barge-in: fade what this quantum would have played to zero, then stop.
      if (this.state === "playing" && this.size > 0) {
        const n = this.take(out, Math.min(out.length, this.size));
        for (let i = 0; i < n; i++) out[i] *= 1 - (i + 1) / n;
        this.played += n;
        this.fadeSamples = n;
      }
      this.head = 0;
      this.size = 0;
      this.fencing = false;
      this.fenced = true;
      this.state = "stopped";
      this.post({t: "fenced", id: this.fenceId, ...this.snapshot()});
      event = "stopped";
    } else if (this.state === "prebuffering" || this.state === "rebuffering") {
      // `end` comes once the decoder has flushed: then nothing is left to wait for.
      const ready = this.ended || (this.size >= this.prebuffer && this.backlog === 0);
      if (this.size > 0 && ready) {
        event = this.state === "prebuffering" ? "playing" : "resumed";
        if (this.startFrame < 0) this.startFrame = frame;
        this.state = "playing";
      } else if (this.ended && this.size === 0) {
        this.state = "drained";
        event = "drained";
      } else if (this.backlog > 0) {
        if (this.state === "rebuffering") this.decodeStalled += out.length;
        else this.decodeWaited += out.length;
      } else if (this.state === "rebuffering") {
        this.stalled += out.length;
      }
    }
    if (this.state === "playing" && !this.fenced && event !== "stopped") {
      const n = this.take(out, Math.min(out.length, this.size));
      this.played += n;
      for (let i = 0; i < n; i++) this.sumSquares += out[i] * out[i];
      if (n < out.length) {
        if (this.ended && this.size === 0) {
          this.state = "drained";
          event = "drained";
        } else if (this.backlog > 0) {
          // Dry while received audio still waits in the decoder: the page is late.
          this.decodeStalls += 1;
          this.decodeStalled += out.length - n;
          this.state = "rebuffering";
          event = "decode-stall";
        } else {
          // The buffer ran dry before the turn's audio was complete, and
          // nothing received waits to be decoded: the audio came late.
          this.underruns += 1;
          this.stalled += out.length - n;
          this.state = "rebuffering";
          event = "underrun";
        }
      }
    }
    if (this.fenced && event !== "stopped") {
      // What the listener would hear of a fenced turn after its fade quantum.
      for (let i = 0; i < out.length; i++) if (out[i] !== 0) this.afterFence += 1;
    }
    this.quanta += 1;
    const active = this.state === "prebuffering" || this.state === "playing"
      || this.state === "rebuffering";
    if (event !== null || (active && this.quanta % STATUS_QUANTA === 0)) {
      this.report(event);
    }
  }

  snapshot() {
    return {
      turn: this.turn, state: this.state, buffered: this.size, played: this.played,
      rms: this.played > 0 ? Math.sqrt(this.sumSquares / this.played) : 0,
      received: this.received, backlog: this.backlog, underruns: this.underruns,
      stalled: this.stalled, decodeStalls: this.decodeStalls, decodeStalled: this.decodeStalled,
      decodeWaited: this.decodeWaited,
      afterFence: this.afterFence, droppedAfterFence: this.droppedAfterFence,
      fadeSamples: this.fadeSamples, prebuffer: this.prebuffer, startFrame: this.startFrame,
    };
  }

  report(event) {
    this.post({t: "status", event, ...this.snapshot()});
  }
}

if (typeof registerProcessor === "function") {
  class RtRingPlayer extends AudioWorkletProcessor {
    constructor() {
      super();
      this.core = new RingPlayerCore((m) => this.port.postMessage(m));
      this.port.onmessage = (e) => this.core.handle(e.data);
    }

    process(_inputs, outputs) {
      const out = outputs[0];
      if (out.length > 0) {
        this.core.render(out[0], currentFrame);
        for (let c = 1; c < out.length; c++) out[c].set(out[0]);
      }
      return true;
    }
  }
  registerProcessor("rt-ring-player", RtRingPlayer);
} else {
  globalThis.RingPlayerCore = RingPlayerCore;
}
