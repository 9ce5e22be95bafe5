// A small graph of the player's buffer over the turn: buffered ms, the
// prebuffer target as a dashed line, events (start, playing, underrun,
// decode-stall, stop) as ticks. The time axis covers the whole turn (at least
// MIN_SPAN_MS), and scrolls once the turn is longer than MAX_SPAN_MS.

const MIN_SPAN_MS = 10000;
const MAX_SPAN_MS = 60000;
const MARK_COLORS = {underrun: "#dc2626", "decode-stall": "#d97706", stop: "#7c3aed"};

export class BufferGraph {
  constructor(canvas) {
    this.canvas = canvas;
    this.points = []; // {t, ms}
    this.targets = []; // {t, ms}
    this.marks = []; // {t, kind}
    this.origin = performance.now();
    this.dirty = true;
  }

  // Start a new turn at time t.
  clear(t) {
    this.origin = t;
    this.points = [];
    this.targets = [];
    this.marks = [];
    this.dirty = true;
  }

  add(t, bufferedMs, prebufferMs) {
    this.points.push({t, ms: bufferedMs});
    this.targets.push({t, ms: prebufferMs});
    this.dirty = true;
  }

  mark(t, kind) {
    this.marks.push({t, kind});
    this.dirty = true;
  }

  draw(now) {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth;
    const h = c.clientHeight;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const span = Math.min(MAX_SPAN_MS, Math.max(MIN_SPAN_MS, now - this.origin));
    const t0 = Math.max(this.origin, now - MAX_SPAN_MS);
    const keep = (a) => a.filter((p) => p.t >= t0 - 1000);
    this.points = keep(this.points);
    this.targets = keep(this.targets);
    this.marks = keep(this.marks);
    const maxMs = Math.max(1000, ...this.points.map((p) => p.ms), ...this.targets.map((p) => p.ms));
    // A round tick step (ms) giving at most 5 steps up to the top.
    const tick = [250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 30000]
      .find((st) => maxMs / st <= 5) || 60000;
    const top = Math.ceil(maxMs / tick) * tick;
    const pad = {l: 44, r: 8, t: 8, b: 18};
    const x = (t) => pad.l + ((t - t0) / span) * (w - pad.l - pad.r);
    const y = (ms) => h - pad.b - (ms / top) * (h - pad.t - pad.b);
    const css = getComputedStyle(c);
    const ink = css.getPropertyValue("--graph-ink").trim() || "#2563eb";
    const grid = css.getPropertyValue("--graph-grid").trim() || "#e5e7eb";
    const text = css.getPropertyValue("--graph-text").trim() || "#6b7280";
    g.font = "11px system-ui, sans-serif";
    g.fillStyle = text;
    g.strokeStyle = grid;
    g.lineWidth = 1;
    for (let ms = 0; ms <= top; ms += tick) {
      g.beginPath();
      g.moveTo(pad.l, y(ms) + 0.5);
      g.lineTo(w - pad.r, y(ms) + 0.5);
      g.stroke();
      g.fillText(ms >= 1000 || ms === 0 ? `${ms / 1000} s` : `${ms} ms`, 4, y(ms) + 4);
    }
    // Seconds since the turn started.
    const stepS = span > 30000 ? 10 : span > 15000 ? 5 : 2;
    const firstS = Math.ceil((t0 - this.origin) / 1000 / stepS) * stepS;
    for (let sec = firstS; this.origin + sec * 1000 <= t0 + span; sec += stepS) {
      const px = x(this.origin + sec * 1000);
      g.textAlign = sec === firstS ? "left" : px > w - pad.r - 12 ? "right" : "center";
      g.fillText(`${sec} s`, px, h - 4);
    }
    g.textAlign = "left";
    // Prebuffer target (the server's `buffer` hint).
    if (this.targets.length) {
      g.save();
      g.setLineDash([4, 4]);
      g.strokeStyle = "#f59e0b";
      g.beginPath();
      this.targets.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p.ms)) : g.moveTo(x(p.t), y(p.ms))));
      g.stroke();
      g.restore();
    }
    if (this.points.length) {
      g.beginPath();
      g.moveTo(x(this.points[0].t), y(0));
      for (const p of this.points) g.lineTo(x(p.t), y(p.ms));
      g.lineTo(x(this.points[this.points.length - 1].t), y(0));
      g.closePath();
      g.fillStyle = ink + "33";
      g.fill();
      g.beginPath();
      this.points.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p.ms)) : g.moveTo(x(p.t), y(p.ms))));
      g.strokeStyle = ink;
      g.lineWidth = 1.5;
      g.stroke();
    }
    for (const m of this.marks) {
      g.strokeStyle = MARK_COLORS[m.kind] || "#10b981";
      g.lineWidth = 2;
      g.beginPath();
      g.moveTo(x(m.t), pad.t);
      g.lineTo(x(m.t), h - pad.b);
      g.stroke();
    }
    this.dirty = false;
  }
}
