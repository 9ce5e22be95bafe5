// One turn's audio: raw Opus packets (WebCodecs AudioDecoder) or PCM s16le
// frames in, mono Float32Array chunks at the AudioContext's rate out, with the
// decoder delay (`pre_skip`, counted at 48 kHz) dropped from the start.
// `backlogSamples` is the audio received but not decoded yet (the player
// neither starts nor blames the server while there is some).

const OPUS_CONFIG = {codec: "opus", sampleRate: 48000, numberOfChannels: 1};
const PRE_SKIP_RATE = 48000; // PROTOCOL.md: pre_skip is in samples at 48 kHz

// True when this browser decodes raw Opus packets (no description: the
// packets are bare, RFC 6716, with no Ogg or OpusHead around them).
export async function opusSupported() {
  if (typeof AudioDecoder === "undefined" || typeof EncodedAudioChunk === "undefined") {
    return false;
  }
  try {
    const res = await AudioDecoder.isConfigSupported(OPUS_CONFIG);
    return res.supported === true;
  } catch {
    return false;
  }
}

// Streaming linear-interpolation resampler, only used when a decoder's
// output rate differs from the AudioContext's (browsers decode Opus at 48 kHz
// and the context is made at 48 kHz, so normally it never runs).
class LinearResampler {
  constructor(from, to) {
    this.step = from / to;
    this.t = 1; // next output position; input index 0 is the previous chunk's last sample
    this.prev = 0;
  }

  process(x) {
    const n = x.length;
    const out = [];
    const at = (k) => (k === 0 ? this.prev : x[k - 1]);
    while (this.t <= n) {
      const i = Math.floor(this.t);
      const f = this.t - i;
      out.push(f === 0 ? at(i) : at(i) + (at(i + 1) - at(i)) * f);
      this.t += this.step;
    }
    this.t -= n;
    if (n > 0) this.prev = x[n - 1];
    return Float32Array.from(out);
  }
}

export class TurnDecoder {
  // format: "opus" | "pcm_s16le"; streamRate: the `started` sample_rate;
  // outRate: the AudioContext's; preSkip: `started.pre_skip`; onBacklog(samples):
  // an output that left nothing to hand on (all pre-skip) changed the backlog.
  constructor({format, streamRate, outRate, preSkip, frameMs, onPcm, onBacklog, onError}) {
    this.format = format;
    this.outRate = outRate;
    this.frameMs = frameMs;
    this.onPcm = onPcm;
    this.onBacklog = onBacklog || (() => {});
    this.onError = onError;
    this.closed = false;
    this.rawSamples = 0; // decoder output before pre-skip and resampling
    this.submitted = 0; // Opus packets given to the decoder
    this.samples = 0; // handed on (after pre-skip, at outRate)
    this.resampler = null;
    this.resamplerFrom = outRate;
    // The decoder delay is dropped at the decoder's own rate, before resampling.
    this.preSkip48 = preSkip;
    this.skipLeft = null;
    if (format === "opus") {
      this.dec = new AudioDecoder({
        output: (data) => this.onAudioData(data),
        error: (e) => this.fail(e),
      });
      this.dec.configure(OPUS_CONFIG);
    } else if (format === "pcm_s16le") {
      this.streamRate = streamRate;
    } else {
      throw new Error(`unsupported format ${format}`);
    }
  }

  decode(seq, bytes) {
    if (this.closed) return;
    if (this.format === "opus") {
      this.submitted += 1;
      this.dec.decode(new EncodedAudioChunk({
        type: "key", // every Opus packet decodes on its own
        timestamp: seq * this.frameMs * 1000, // microseconds
        duration: this.frameMs * 1000,
        data: bytes,
      }));
    } else {
      const n = bytes.byteLength >> 1;
      const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
      const x = new Float32Array(n);
      for (let i = 0; i < n; i++) x[i] = view.getInt16(2 * i, true) / 32768;
      this.emit(x, this.streamRate);
    }
  }

  onAudioData(data) {
    if (this.closed) {
      data.close();
      return;
    }
    const n = data.numberOfFrames;
    const x = new Float32Array(n);
    // Channel 0 (the stream is mono), converted to float whatever the native layout.
    data.copyTo(x, {planeIndex: 0, format: "f32-planar"});
    const rate = data.sampleRate;
    data.close();
    this.emit(x, rate);
  }

  emit(x, rate) {
    this.rawSamples += x.length;
    if (this.skipLeft === null) this.skipLeft = Math.round(this.preSkip48 * rate / PRE_SKIP_RATE);
    if (this.skipLeft > 0) {
      const drop = Math.min(this.skipLeft, x.length);
      this.skipLeft -= drop;
      x = x.subarray(drop);
    }
    if (rate !== this.outRate) {
      if (this.resampler === null || this.resamplerFrom !== rate) {
        this.resampler = new LinearResampler(rate, this.outRate);
        this.resamplerFrom = rate;
      }
      x = this.resampler.process(x);
    }
    if (x.length === 0) {
      this.onBacklog(this.backlogSamples);
      return;
    }
    // A fresh buffer of its own, so that it can be transferred to the worklet.
    const pcm = x.byteOffset === 0 && x.length === x.buffer.byteLength / 4 ? x : x.slice();
    this.samples += pcm.length;
    this.onPcm(pcm);
  }

  // Audio given to the decoder whose output has not come out yet, in samples
  // at outRate: whole frames only. Each packet decodes to one frame
  // (frameMs at 48 kHz); counting whole frames keeps a decoder that trims a
  // few samples of its own (less than a frame) from looking behind forever.
  // PCM decodes at once: always 0.
  get backlogSamples() {
    if (this.format !== "opus" || this.closed) return 0;
    const frameRaw = (PRE_SKIP_RATE * this.frameMs) / 1000;
    const frames = Math.floor((this.submitted * frameRaw - this.rawSamples) / frameRaw);
    return frames > 0 ? Math.round((frames * this.frameMs * this.outRate) / 1000) : 0;
  }

  // Resolves when every packet given so far has come out.
  async flush() {
    if (this.format === "opus" && !this.closed && this.dec.state === "configured") {
      await this.dec.flush();
    }
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    if (this.format === "opus" && this.dec.state !== "closed") this.dec.close();
  }

  fail(e) {
    if (this.closed) return;
    this.closed = true;
    this.onError(e);
  }
}
