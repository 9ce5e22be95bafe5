// Audio output: an AudioContext at 48 kHz (Opus decodes at 48 kHz whatever
// rate was asked for) and the ring-buffer player of worklet.js, in an
// AudioWorklet, or in a ScriptProcessorNode where AudioWorklet is missing.

export const CONTEXT_RATE = 48000;
const FENCE_ACK_TIMEOUT_MS = 200;

function loadClassicScript(src) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = src;
    s.onload = resolve;
    s.onerror = () => reject(new Error(`could not load ${src}`));
    document.head.appendChild(s);
  });
}

export class Player {
  // onStatus(msg): every status report of the player (see worklet.js).
  constructor(onStatus, {forceScriptProcessor = false} = {}) {
    this.onStatus = onStatus;
    this.forceScriptProcessor = forceScriptProcessor;
    this.ctx = null;
    this.kind = "";
    this.fenceWaiters = new Map();
    this.nextFenceId = 1;
  }

  async init() {
    if (this.ctx !== null) return;
    const ctx = new AudioContext({sampleRate: CONTEXT_RATE, latencyHint: "interactive"});
    const workletUrl = new URL("worklet.js", import.meta.url).href;
    if (ctx.audioWorklet && !this.forceScriptProcessor) {
      await ctx.audioWorklet.addModule(workletUrl);
      const node = new AudioWorkletNode(ctx, "rt-ring-player", {
        numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
      });
      node.port.onmessage = (e) => this.onMessage(e.data);
      this.send = (m, transfer) => node.port.postMessage(m, transfer || []);
      this.node = node;
      this.kind = "AudioWorklet";
    } else {
      // Not a secure context (plain http from another host): no AudioWorklet.
      await loadClassicScript(workletUrl);
      const core = new globalThis.RingPlayerCore((m) => queueMicrotask(() => this.onMessage(m)));
      const node = ctx.createScriptProcessor(1024, 1, 1); // 1024 samples = 21 ms
      const quantum = new Float32Array(128);
      let frame = 0;
      node.onaudioprocess = (e) => {
        const out = e.outputBuffer.getChannelData(0);
        for (let at = 0; at < out.length; at += quantum.length) {
          core.render(quantum, frame);
          out.set(quantum, at);
          frame += quantum.length;
        }
      };
      this.send = (m) => core.handle(m);
      this.node = node;
      this.kind = "ScriptProcessor";
    }
    this.node.connect(ctx.destination);
    this.ctx = ctx;
  }

  get rate() {
    return this.ctx ? this.ctx.sampleRate : CONTEXT_RATE;
  }

  // Headless or autoplay-restricted pages start suspended; resume on use.
  async resume() {
    if (this.ctx && this.ctx.state !== "running") await this.ctx.resume();
    return this.ctx ? this.ctx.state : "none";
  }

  onMessage(m) {
    if (m.t === "fenced") {
      const done = this.fenceWaiters.get(m.id);
      if (done) {
        this.fenceWaiters.delete(m.id);
        done(m);
      }
    }
    this.onStatus(m);
  }

  startTurn(turn, prebufferSamples) {
    this.send({t: "turn", turn, prebuffer: prebufferSamples});
  }

  // backlog: received samples still in the decoder once pcm is out of it.
  push(turn, pcm, backlog = 0) {
    this.send({t: "audio", turn, pcm, backlog}, [pcm.buffer]);
  }

  // The decoder took in received audio: playback does not start (or resume)
  // while it holds some (worklet.js).
  setBacklog(turn, samples) {
    this.send({t: "backlog", turn, samples});
  }

  setPrebuffer(turn, samples) {
    this.send({t: "prebuffer", turn, samples});
  }

  end(turn) {
    this.send({t: "end", turn});
  }

  // Barge-in: silence within one render quantum. Resolves with the player's
  // snapshot once the fence took effect (null if no answer came in time).
  fence(turn) {
    const id = this.nextFenceId++;
    return new Promise((resolve) => {
      this.fenceWaiters.set(id, resolve);
      setTimeout(() => {
        if (this.fenceWaiters.delete(id)) resolve(null);
      }, FENCE_ACK_TIMEOUT_MS);
      this.send({t: "fence", turn, id});
    });
  }
}
