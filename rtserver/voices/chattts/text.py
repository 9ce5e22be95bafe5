r"""ChatTTS text: normalisation and the prompt layout (pure).

Normalisation is upstream's ``ChatTTS/norm.py`` ``Normalizer.__call__``, step
for step (tests/parity compares it with upstream's own on a corpus):

1. the language: Chinese when the text (control tags included) has more CJK
   characters than English words, else English;
2. a per-language text normaliser on the text between ``[...]`` tags (upstream
   leaves this slot to plug-ins, WeTextProcessing or NeMo, and registers none:
   bare upstream drops digits); here :func:`read_numbers` reads numbers out,
   ``42`` -> ``forty two`` / ``四十二``, ``3.5`` -> ``three point five`` /
   ``三点五``, ``20%`` -> ``twenty percent`` / ``百分之二十``, ``&`` -> ``and`` /
   ``和`` (``numbers=False``: none, as bare upstream);
3. Chinese: half-width punctuation to full-width;
4. if any character outside ``[\u4e00-\u9fff A-Za-z ，。、,.]`` is left
   (``[\w]`` tags not counted): ``：；！（）【】『』「」《》－`` and ASCII
   ``:;!()<>-`` to commas and full stops;
5. homophone replacement, character by character, with upstream's
   ``homophones_map.json`` when given (``homophones``);
6. if step 4 found any: every such character deleted from the text between
   ``[...]`` (every bracketed run is kept as it is, known token or not).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_CJK = re.compile(r"[\u4e00-\u9fff]")
_EN_WORD = re.compile(r"\b[A-Za-z]+\b")
_NUMBER = re.compile(r"(?<![0-9.])([-−]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(\s?%)?")
# upstream Normalizer: reject_pattern, sub_pattern
_REJECT = re.compile(r"[^\u4e00-\u9fffA-Za-z，。、,\. ]")
_TAG = re.compile(r"\[[\w_]+\]")

# upstream Normalizer.character_simplifier
_SIMPLIFY = str.maketrans({"：": "，", "；": "，", "！": "。", "（": "，", "）": "，",
                           "【": "，", "】": "，", "『": "，", "』": "，", "「": "，",
                           "」": "，", "《": "，", "》": "，", "－": "，", ":": ",", ";": ",",
                           "!": ".", "(": ",", ")": ",", ">": ",", "<": ",", "-": ","})
# upstream Normalizer.halfwidth_2_fullwidth
_FULLWIDTH = str.maketrans({"!": "！", '"': "“", "'": "‘", "#": "＃", "$": "＄", "%": "％",
                            "&": "＆", "(": "（", ")": "）", ",": "，", "-": "－", "*": "＊",
                            "+": "＋", ".": "。", "/": "／", ":": "：", ";": "；", "<": "＜",
                            "=": "＝", ">": "＞", "?": "？", "@": "＠", "\\": "＼", "^": "＾",
                            "`": "｀", "{": "｛", "|": "｜", "}": "｝", "~": "～"})

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


def read_numbers(text: str, lang: str) -> str:
    """rtserver's text normaliser (upstream's plug-in slot): numbers and ``&`` read out."""
    zh = lang == "zh"
    text = _NUMBER.sub(lambda m: _read_number(m, zh), text)
    return text.replace("&", "和" if zh else " and ")


def split_tags(text: str) -> tuple[list[str], list[str]]:
    """Upstream ``_split_tags``: the text runs and the ``[...]`` runs between them."""
    texts: list[str] = []
    tags: list[str] = []
    cur_text, cur_tag = "", ""
    for c in text:
        if c == "[":
            texts.append(cur_text)
            cur_text, cur_tag = "", c
        elif cur_tag != "":
            cur_tag += c
        else:
            cur_text += c
        if c == "]":
            tags.append(cur_tag)
            cur_tag = ""
    if cur_text != "":
        texts.append(cur_text)
    return texts, tags


def _combine_tags(texts: list[str], tags: list[str]) -> str:
    """Upstream ``_combine_tags`` (a tag still open at the end is dropped, as there)."""
    out = ""
    rest = list(tags)
    for t in texts:
        out += t + (rest.pop(0) if rest else "")
    return out


def _map_texts(text: str, fn: Callable[[str], str]) -> str:
    texts, tags = split_tags(text)
    texts = [fn(t) for t in texts]
    if tags:
        return _combine_tags(texts, tags)
    return texts[0] if texts else ""


def normalise(text: str, lang: str | None = None, *, numbers: bool = True,
              homophones: Mapping[str, str] | None = None) -> str:
    """Upstream ``Normalizer(text, do_text_normalization=True,
    do_homophone_replacement=homophones is not None, lang)``, with
    :func:`read_numbers` as the text normaliser when ``numbers``."""
    lang = lang or detect_language(text)
    if numbers:
        text = _map_texts(text, lambda t: read_numbers(t, lang))
    if lang == "zh":
        text = text.translate(_FULLWIDTH)
    invalid = bool(_REJECT.search(_TAG.sub("", text)))
    if invalid:
        text = text.translate(_SIMPLIFY)
    if homophones:
        text = "".join(homophones.get(c, c) for c in text)
    if invalid:
        text = _map_texts(text, lambda t: _REJECT.sub("", t))
    return text


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


def speed_level(configured: int, speed: float) -> int:
    """The ``[speed_N]`` of a context's ``speed`` (1: the configured level N;
    2: twice N, ...), rounded, within 0..9. ChatTTS's speed levels are
    coarse: 0.5 on the default level 5 is ``[speed_2]``, 2.0 is ``[speed_9]``."""
    return max(0, min(9, round(configured * speed)))
