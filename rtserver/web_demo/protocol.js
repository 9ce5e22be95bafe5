// rtserver protocol v1 on the client side: binary audio messages and URLs.
// The wire contract is PROTOCOL.md (docs/PROTOCOL.md in the repository).

export const FLAG_LAST = 1; // bit0: last frame of the context
export const FLAG_SEGMENT = 2; // bit1: first frame of a segment
const HEADER_BYTES = 12;

// Parse one binary message: header then `count` u16-length-prefixed frames.
// Returns {version, flags, stream, count, seq, frames: [Uint8Array]}; throws
// on a bad magic, version or length (the server never sends one).
export function parseAudioMessage(buffer) {
  const view = new DataView(buffer);
  if (buffer.byteLength < HEADER_BYTES || view.getUint8(0) !== 0x52 || view.getUint8(1) !== 0x54) {
    throw new Error("binary message without the RT magic");
  }
  const version = view.getUint8(2);
  if (version !== 1) throw new Error(`binary message version ${version}, expected 1`);
  const flags = view.getUint8(3);
  const stream = view.getUint16(4, true);
  const count = view.getUint16(6, true);
  const seq = view.getUint32(8, true);
  const frames = [];
  let at = HEADER_BYTES;
  for (let i = 0; i < count; i++) {
    if (at + 2 > buffer.byteLength) throw new Error("binary message truncated (length)");
    const len = view.getUint16(at, true);
    at += 2;
    if (at + len > buffer.byteLength) throw new Error("binary message truncated (frame)");
    frames.push(new Uint8Array(buffer, at, len));
    at += len;
  }
  return {version, flags, stream, count, seq, frames};
}

// ws(s)://same-origin/v1/stream, with ?token= when the page was opened with one.
export function streamUrl(loc, token) {
  const scheme = loc.protocol === "https:" ? "wss:" : "ws:";
  const q = token ? `?token=${encodeURIComponent(token)}` : "";
  return `${scheme}//${loc.host}/v1/stream${q}`;
}
