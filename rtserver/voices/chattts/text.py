"""ChatTTS text: normalisation and the prompt layout (pure).

Normalisation follows upstream ``ChatTTS/norm.py``: the language is Chinese
when a segment has more CJK characters than English words, else English;
Chinese gets full-width punctuation; characters outside
``[\\u4e00-\\u9fff A-Za-z ，。、,.]`` are mapped (``：；！（）`` and ASCII
``:;!()-<>`` to commas and full stops) or dropped. Upstream leaves numbers to
plug-in normalisers (WeTextProcessing, NeMo) and otherwise drops the digits;
here numbers are read out: English words (``42`` -> ``forty two``,
``3.5`` -> ``three point five``, ``20%`` -> ``twenty percent``) or Chinese
(``42`` -> ``四十二``, ``3.5`` -> ``三点五``, ``20%`` -> ``百分之二十``).

Control tokens the tokenizer knows (``[uv_break]``, ``[laugh]``,
``[lbreak]``, ``[speed_N]``...) pass through untouched; other brackets are
text. The prompt is upstream's ``Speaker.decorate_code_prompts``:
``[Stts][spk_emb]{prompt}{text}[Ptts]`` with ``prompt`` ``[speed_5]`` by
default.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TAG = re.compile(r"\[[A-Za-z_0-9]+\]")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_EN_WORD = re.compile(r"\b[A-Za-z]+\b")
_NUMBER = re.compile(r"(?<![0-9.])([-−]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(\s?%)?")
_REJECT = re.compile(r"[^\u4e00-\u9fffA-Za-z，。、,. ]")

# upstream Normalizer.character_simplifier
_SIMPLIFY = str.maketrans({"：": "，", "；": "，", "！": "。", "（": "，", "）": "，",
                           "【": "，", "】": "，", "『": "，", "』": "，", "「": "，",
                           "」": "，", "《": "，", "》": "，", "－": "，", ":": ",", ";": ",",
                           "!": ".", "(": ",", ")": ",", ">": ",", "<": ",", "-": ",",
                           "？": "。", "?": ".", "\n": " "})
# upstream Normalizer.halfwidth_2_fullwidth (the characters that survive the filter)
_FULLWIDTH = str.maketrans({",": "，", ".": "。", "!": "！", "?": "？", ":": "：",
                            ";": "；", "(": "（", ")": "）", "-": "－"})

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))

_ZH_DIGITS = "零一二三四五六七八九"


def english_number(n: int) -> str:
    """``1234`` -> ``one thousand two hundred thirty four`` (no hyphens: the
    character filter would turn them into commas)."""
    if n < 0:
        return "minus " + english_number(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        t, o = divmod(n, 10)
        return _TENS[t] + (f" {_ONES[o]}" if o else "")
    if n < 1000:
        h, r = divmod(n, 100)
        return f"{_ONES[h]} hundred" + (f" {english_number(r)}" if r else "")
    for scale, word in _SCALES:
        if n >= scale:
            head, rest = divmod(n, scale)
            return f"{english_number(head)} {word}" + (f" {english_number(rest)}" if rest else "")
    return " ".join(_ONES[int(d)] for d in str(n))  # unreachable for n >= 1000


def _zh_under_10000(n: int) -> str:
    out = ""
    zero = False
    for unit, div in (("千", 1000), ("百", 100), ("十", 10), ("", 1)):
        d, n = divmod(n, div)
        if d:
            if zero:
                out += "零"
                zero = False
            out += _ZH_DIGITS[d] + unit
        elif out:
            zero = True
    return out


def chinese_number(n: int) -> str:
    """``10`` -> ``十``, ``105`` -> ``一百零五``, ``100010`` -> ``十万零一十``."""
    if n < 0:
        return "负" + chinese_number(-n)
    if n == 0:
        return "零"
    groups: list[int] = []
    while n:
        n, g = divmod(n, 10000)
        groups.append(g)
    units = ("", "万", "亿", "万亿")
    out = ""
    need_zero = False
    for i in range(len(groups) - 1, -1, -1):
        g = groups[i]
        if g == 0:
            need_zero = bool(out)
            continue
        if out and (need_zero or g < 1000):
            out += "零"
        out += _zh_under_10000(g) + units[i]
        need_zero = False
    if out.startswith("一十"):
        out = out[1:]
    return out


def _read_number(m: re.Match[str], zh: bool) -> str:
    sign, whole, frac, pct = m.group(1), m.group(2).replace(",", ""), m.group(3), m.group(4)
    n = int(whole)
    if zh:
        text = chinese_number(n)
        if frac:
            text += "点" + "".join(_ZH_DIGITS[int(d)] for d in frac)
        if sign:
            text = "负" + text
        return ("百分之" + text) if pct else text
    text = english_number(n)
    if frac:
        text += " point " + " ".join(_ONES[int(d)] for d in frac)
    if sign:
        text = "minus " + text
    return f" {text} percent " if pct else f" {text} "


def detect_language(text: str) -> str:
    """Upstream ``_detect_language``: "zh" when CJK characters outnumber English words."""
    return "zh" if len(_CJK.findall(text)) > len(_EN_WORD.findall(text)) else "en"


def _normalise_plain(text: str, zh: bool) -> str:
    text = _NUMBER.sub(lambda m: _read_number(m, zh), text)
    text = text.replace("&", " and " if not zh else "和")
    if zh:
        text = text.translate(_FULLWIDTH)
    text = _REJECT.sub(" ", text.translate(_SIMPLIFY))
    return re.sub(r" {2,}", " ", text)


def normalise(text: str, is_tag: Callable[[str], bool] = lambda t: True,
              lang: str | None = None) -> str:
    """Speakable ChatTTS text; control tags for which ``is_tag`` holds pass through."""
    zh = (lang or detect_language(_TAG.sub("", text))) == "zh"
    out: list[str] = []
    pos = 0
    for m in _TAG.finditer(text):
        if not is_tag(m.group(0)):
            continue
        out.append(_normalise_plain(text[pos:m.start()], zh))
        out.append(m.group(0))
        pos = m.end()
    out.append(_normalise_plain(text[pos:], zh))
    return "".join(out).strip()


def code_prompt(text: str, *, prompt: str = "[speed_5]", speaker: bool = True) -> str:
    """Upstream ``decorate_code_prompts``: ``[Stts]``, ``[spk_emb]`` and
    ``[empty_spk]`` are removed from the text (upstream leaves ``[Ptts]``, and so
    does this: the prompt ids are upstream's, tests/parity), then
    ``[Stts][spk_emb]{prompt}{text}[Ptts]``."""
    for tok in ("[Stts]", "[spk_emb]", "[empty_spk]"):
        text = text.replace(tok, "")
    return f"[Stts]{'[spk_emb]' if speaker else '[empty_spk]'}{prompt}{text.strip()}[Ptts]"


def refine_prompt(text: str, prompt: str = "") -> str:
    """Upstream ``decorate_text_prompts`` (the refine-text pass)."""
    return f"[Sbreak]{text}[Pbreak]{prompt}"


def speed_prompt(speed: int) -> str:
    """``[speed_N]``, N in 0..9 (upstream's prompt default is ``[speed_5]``)."""
    if not 0 <= speed <= 9:
        raise ValueError(f"speed {speed}: 0..9")
    return f"[speed_{speed}]"
