// "Simulate a chatbot": a canned LLM-style reply (markdown, numbers, an
// abbreviation) cut into LLM-like tokens and streamed at a chosen rate.

export const CANNED_REPLY = [
  "Sure! Here's how **streaming speech** works, step by step.",
  "",
  "1. The server reads my reply *while I am still writing it*, one token at a time.",
  "2. It speaks the first clause at once, so you hear audio within about 200 ms.",
  "3. After that it waits for whole sentences, e.g. this one, which sound more natural.",
  "",
  "Dr. Rivera measured 128 streams on one GPU at 3.5 times real time, " +
    "and a 30-second answer costs less than $0.01 to speak.",
  "Press **Stop** whenever you like: the audio stops at once, and the next turn starts clean.",
].join("\n");

// Cut text like a BPE tokenizer would, roughly: a word of up to 6 letters is
// one token with its leading space, longer words split into 4-letter pieces,
// digits come in groups of up to 3, punctuation and markdown marks alone,
// line breaks alone. Joined back, the tokens are the text exactly.
export function tokenize(text) {
  const tokens = [];
  const re = /\n+| ?[A-Za-z']+| ?\d{1,3}| ?[^\sA-Za-z\d]| +|\s/g;
  for (const m of text.matchAll(re)) {
    const t = m[0];
    const word = t.trimStart();
    if (/^[A-Za-z']+$/.test(word) && word.length > 6) {
      const lead = t.length - word.length;
      tokens.push(t.slice(0, lead + 4));
      for (let i = lead + 4; i < t.length; i += 4) tokens.push(t.slice(i, i + 4));
    } else {
      tokens.push(t);
    }
  }
  return tokens;
}

// Stream tokens to send(token) at `rate` tokens/s, each gap jittered
// uniformly within +-50% (mean 1/rate), scheduled against the start time so
// that timer lateness does not drift the rate. onEnd() after the last token.
// Returns {cancel()}.
export function streamTokens(tokens, rate, send, onEnd, random = Math.random) {
  const mean = 1000 / rate;
  const t0 = performance.now();
  let due = 0;
  let i = 0;
  let timer = null;
  let cancelled = false;
  const step = () => {
    if (cancelled) return;
    send(tokens[i], i);
    i += 1;
    if (i >= tokens.length) {
      onEnd();
      return;
    }
    due += mean * (0.5 + random());
    timer = setTimeout(step, Math.max(0, t0 + due - performance.now()));
  };
  step();
  return {
    cancel() {
      cancelled = true;
      if (timer !== null) clearTimeout(timer);
    },
    get sent() {
      return i;
    },
  };
}
