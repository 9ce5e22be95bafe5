"""Text normalisation: rtserver's ``text.normalise`` against upstream's own
``ChatTTS.norm.Normalizer`` on tests/parity/text_corpus.txt (240 English and
Chinese sentences with numbers, dates, times, money, punctuation and control
tokens), exactly equal in three configurations:

- bare upstream (no text normaliser registered, no homophones) vs
  ``normalise(numbers=False)``;
- upstream with its ``homophones_map.json`` vs ``normalise(numbers=False,
  homophones=<that map>)``;
- upstream with rtserver's number reader registered as its "en" and "zh" text
  normalisers (upstream's own plug-in mechanism, ``Normalizer.register``) and
  the homophones vs rtserver's default ``normalise(homophones=<map>)``.

What still differs from a bare upstream install is only the number reader:
bare upstream deletes digits (and ``&``, ``%``...) as unsupported characters;
rtserver reads them out. The last test checks that every sentence where
rtserver's default and bare upstream disagree holds a digit or ``&``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from rtserver.voices.chattts import text as ct

from .conftest import Pair

CORPUS = Path(__file__).with_name("text_corpus.txt")


def corpus() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [ln.replace("\\n", "\n").replace("\\t", "\t") for ln in lines
            if ln and not ln.startswith("#")]


def map_path() -> Path:
    import ChatTTS

    return Path(ChatTTS.__file__).parent / "res" / "homophones_map.json"


@pytest.fixture(scope="module")
def homophones() -> dict[str, str]:
    return dict(json.loads(map_path().read_text(encoding="utf-8")))


def upstream(numbers: bool) -> object:
    from ChatTTS.norm import Normalizer

    norm = Normalizer(str(map_path()), logging.getLogger("chattts-norm"))
    if numbers:
        assert norm.register("en", lambda t: ct.read_numbers(t, "en"))
        assert norm.register("zh", lambda t: ct.read_numbers(t, "zh"))
    return norm


def test_corpus_size(homophones: dict[str, str]) -> None:
    lines = corpus()
    zh = [s for s in lines if ct.detect_language(s) == "zh"]
    assert len(lines) >= 200 and len(zh) >= 80 and len(lines) - len(zh) >= 80
    assert sum(bool(re.search(r"\d", s)) for s in lines) >= 100
    assert sum("[" in s for s in lines) >= 20
    assert sum(any(c in homophones for c in s) for s in lines) >= 20


@pytest.mark.parametrize("mode", ["bare", "homophones", "numbers+homophones"])
def test_normalise_equals_upstream(mode: str, homophones: dict[str, str]) -> None:
    norm = upstream(numbers=mode == "numbers+homophones")
    use_map = mode != "bare"
    diffs = []
    for s in corpus():
        want = norm(s, True, use_map)  # type: ignore[operator]
        got = ct.normalise(s, numbers=mode == "numbers+homophones",
                           homophones=homophones if use_map else None)
        if got != want:
            diffs.append((s, want, got))
    print(f"\n{mode}: {len(corpus()) - len(diffs)}/{len(corpus())} equal")
    assert not diffs, "\n".join(f"{s!r}\n  upstream {w!r}\n  rtserver {g!r}"
                                for s, w, g in diffs[:10])


def test_what_differs_from_bare_upstream_is_the_number_reader(
        homophones: dict[str, str]) -> None:
    norm = upstream(numbers=False)
    differ = [s for s in corpus()
              if ct.normalise(s, homophones=homophones) != norm(s, True, True)]  # type: ignore[operator]
    print(f"\nrtserver default vs bare upstream: {len(differ)}/{len(corpus())} differ, all "
          "in sentences with digits or '&' (read out here, deleted there)")
    assert differ  # the reader does read numbers
    assert all(re.search(r"[\d&]", s) for s in differ), [
        s for s in differ if not re.search(r"[\d&]", s)]


@pytest.mark.parametrize("numbers", [False, True])
def test_corpus_prompt_ids_equal(pair: Pair, homophones: dict[str, str], numbers: bool) -> None:
    """Text to prompt ids end to end on the corpus: upstream's normaliser,
    ``decorate_code_prompts`` and ``BertTokenizerFast`` vs rtserver's
    ``normalise``, ``code_prompt`` and ``tokenizers`` on the same tokenizer files."""
    norm = upstream(numbers=numbers)
    chat = pair.chat
    spk = chat.sample_random_speaker()
    bad = []
    for s in corpus():
        text = norm(s, True, True)  # type: ignore[operator]
        ids, _m, _t = chat.tokenizer.encode(
            chat.speaker.decorate_code_prompts([text], "[speed_5]", None, spk),
            chat.config.gpt.num_vq)
        want = [int(i) for i in ids[0, :, 0]]
        got = pair.lm.tokenizer.encode(ct.code_prompt(
            ct.normalise(s, numbers=numbers, homophones=homophones), prompt=ct.speed_prompt(5)))
        if got != want:
            bad.append(s)
    assert not bad, bad[:10]
