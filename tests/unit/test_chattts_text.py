"""ChatTTS text normalisation, prompt layout, step budget and voices file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rtserver.errors import ConfigError, UnknownVoice
from rtserver.voices.chattts import text as ct
from rtserver.voices.chattts.config import ChatTTSConfig


@pytest.mark.parametrize("raw,want", [
    # numbers read out; upstream's pipeline deletes '?' (outside its character set)
    ("I have 42 apples and 3.5 pears, 20% off!",
     "I have  forty two  apples and  three point five  pears,  twenty percent  off."),
    ("Pay 1,234,567 now", "Pay  one million two hundred thirty four thousand five hundred "
                          "sixty seven  now"),
    ("Wait [uv_break] what [laugh] really?", "Wait [uv_break] what [laugh] really"),
    ("C++ (great): yes-no", "C ,great,, yes,no"),
    # every bracketed run stays, as upstream's _split_tags keeps it
    ("[unknown] tag", "[unknown] tag"),
])
def test_english(raw: str, want: str) -> None:
    assert ct.normalise(raw) == want


@pytest.mark.parametrize("raw,want", [
    ("我有105个苹果，价格是3.5元。", "我有一百零五个苹果，价格是三点五元。"),
    ("今天有20000人，50%的人来了！", "今天有二万人，百分之五十的人来了。"),
    ("你好[laugh]哈哈", "你好[laugh]哈哈"),
    ("十万：100010", "十万，十万零一十"),
    ("真的吗？", "真的吗"),
])
def test_chinese(raw: str, want: str) -> None:
    assert ct.normalise(raw) == want


def test_bare_upstream_drops_digits_and_homophones_replace() -> None:
    assert ct.normalise("I have 42 apples!", numbers=False) == "I have  apples."
    assert ct.normalise("你好世界", homophones={"世": "事"}) == "你好事界"


@pytest.mark.parametrize("n,zh,en", [
    (0, "零", "zero"), (10, "十", "ten"), (15, "十五", "fifteen"), (105, "一百零五",
                                                                   "one hundred five"),
    (1005, "一千零五", "one thousand five"), (20010, "二万零一十", "twenty thousand ten"),
    (100000000, "一亿", "one hundred million"),
])
def test_numbers(n: int, zh: str, en: str) -> None:
    assert ct.chinese_number(n) == zh
    assert ct.english_number(n) == en


def test_prompt_layout() -> None:
    assert ct.code_prompt("hi") == "[Stts][spk_emb][speed_5]hi[Ptts]"
    # prompt tokens inside the text are removed (upstream issue 459), [Ptts] kept as there
    assert ct.code_prompt("[Stts]hi[spk_emb]", prompt="[speed_2]") == \
        "[Stts][spk_emb][speed_2]hi[Ptts]"
    assert ct.code_prompt("hi[Ptts]") == "[Stts][spk_emb][speed_5]hi[Ptts][Ptts]"
    assert ct.refine_prompt("hi") == "[Sbreak]hi[Pbreak]"
    with pytest.raises(ValueError):
        ct.speed_prompt(10)


def test_step_budget_grows_with_text() -> None:
    from rtserver.voices.chattts.voice import step_budget

    cfg = ChatTTSConfig()
    short, long = step_budget("Hi.", cfg), step_budget("Hi there, " * 10, cfg)
    assert short == int(np.ceil((2.0 + 0.15 * 2) * 46.875))
    assert long > short
    assert step_budget("你好你好", cfg) > step_budget("abcd", cfg)  # CJK reads slower


def test_voices_file(tmp_path: Path) -> None:
    from rtserver.voices.chattts.speaker import encode_speaker
    from rtserver.voices.chattts.voice import read_voices_file

    vec = np.linspace(-1, 1, 16).astype(np.float32)
    j = tmp_path / "v.json"
    j.write_text(json.dumps({"amy": encode_speaker(vec)}))
    got = read_voices_file(j, 16)
    np.testing.assert_allclose(got["amy"], vec, atol=1e-3)
    t = tmp_path / "v.toml"
    t.write_text(f'[speakers]\namy = "{encode_speaker(vec)}"\nbob = "garbage"\n')
    with pytest.raises(UnknownVoice, match=r"'bob'.*(base16384|decompress)"):
        read_voices_file(t, 16)
    t.write_text(f'[speakers]\n"seed_1" = "{encode_speaker(vec)}"\n')
    with pytest.raises(ConfigError, match="bad speaker name"):
        read_voices_file(t, 16)


def test_config_check() -> None:
    with pytest.raises(ValueError, match="decoder"):
        ChatTTSConfig(decoder="snac").check()
    with pytest.raises(ValueError, match="speed"):
        ChatTTSConfig(speed=12).check()
    with pytest.raises(ValueError, match="hidden_store"):  # no hidden states on that route
        ChatTTSConfig(decoder="dvae", hidden_store=True).check()
    ChatTTSConfig().check()
    ChatTTSConfig(hidden_store=True).check()
