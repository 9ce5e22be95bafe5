"""Pronunciation lexicons (rtserver.text.lexicon): matching rules, bounds, PLS."""

from __future__ import annotations

import pytest

from rtserver.errors import BadMessage, ErrorCode, LexiconTooLarge
from rtserver.text.lexicon import (
    MAX_ENTRIES,
    MAX_FILE_ENTRIES,
    MAX_GRAPHEME_CHARS,
    MAX_VALUE_CHARS,
    Entry,
    Lexicon,
    PhonemeSpan,
    parse_pls,
)


def said(entries: list[Entry], text: str, *, phonemes: bool = False) -> str:
    return Lexicon(entries, phonemes=phonemes).apply(text).text


def test_an_alias_replaces_whole_words_only() -> None:
    lex = [Entry("SQL", alias="sequel")]
    assert said(lex, "SQL and MySQL use SQLite, not SQL_x.") == \
        "sequel and MySQL use SQLite, not SQL_x."


def test_matching_ignores_case_unless_the_entry_says_so() -> None:
    assert said([Entry("rtserver", alias="are tee server")], "RTServer runs.") == \
        "are tee server runs."
    lex = [Entry("US", alias="United States", case_sensitive=True)]
    assert said(lex, "Call us in the US.") == "Call us in the United States."


def test_punctuation_is_a_word_boundary() -> None:
    lex = [Entry("rtserver", alias="R T server")]
    text = "rtserver's (rtserver) rtserver. \"rtserver\"; rtservers myrtserver rtserver-2"
    assert said(lex, text) == ("R T server's (R T server) R T server. \"R T server\"; "
                               "rtservers myrtserver R T server-2")


def test_punctuation_inside_a_grapheme_is_literal() -> None:
    lex = [Entry("C++", alias="C plus plus"), Entry("AT&T", alias="A T and T")]
    assert said(lex, "C++ at AT&T, not C+ or ATxT.") == "C plus plus at A T and T, not C+ or ATxT."


def test_the_longest_grapheme_wins_and_spaces_match_any_white_space() -> None:
    lex = [Entry("New York", alias="NY"), Entry("New York City", alias="NYC"),
           Entry("new", alias="NEW")]
    assert said(lex, "New York City,\nNew\nYork and new things") == "NYC,\nNY and NEW things"


def test_the_first_entry_for_a_grapheme_wins_and_aliases_are_not_matched_again() -> None:
    lex = [Entry("gif", alias="jif"), Entry("GIF", alias="gift"), Entry("jif", alias="loop")]
    assert said(lex, "A gif.") == "A jif."


def test_phonemes_give_spans_that_follow_aliases_before_them() -> None:
    lex = Lexicon([Entry("SQL", alias="sequel"), Entry("tomato", phoneme="təmˈɑːtoʊ")],
                  phonemes=True)
    out = lex.apply("SQL tomato and Tomato.")
    assert out.text == "sequel tomato and Tomato."
    assert out.phonemes == (PhonemeSpan(7, 13, "təmˈɑːtoʊ"), PhonemeSpan(18, 24, "təmˈɑːtoʊ"))
    assert [out.text[s.start:s.end] for s in out.phonemes] == ["tomato", "Tomato"]


def test_an_entry_with_both_gives_phonemes_to_voices_that_take_them_else_its_alias() -> None:
    entry = Entry("Nguyen", phoneme="wˈɪn", alias="Win")
    assert Lexicon([entry], phonemes=True).apply("Mr Nguyen").phonemes[0].phoneme == "wˈɪn"
    assert Lexicon([entry], phonemes=False).apply("Mr Nguyen").text == "Mr Win"


def test_a_phoneme_only_entry_is_refused_by_a_voice_without_phonemes() -> None:
    with pytest.raises(BadMessage, match="only a phoneme"):
        Lexicon([Entry("tomato", phoneme="təmˈɑːtoʊ")], phonemes=False)


def test_fixed_spans_are_kept_moved_and_not_matched_inside() -> None:
    lex = Lexicon([Entry("SQL", alias="sequel"), Entry("tomato", alias="TOMATO")],
                  phonemes=True)
    fixed = (PhonemeSpan(4, 10, "x"),)  # "tomato" from SSML <phoneme>
    out = lex.apply("SQL tomato tomato", fixed)
    assert out.text == "sequel tomato TOMATO"
    assert out.phonemes == (PhonemeSpan(7, 13, "x"),)


@pytest.mark.parametrize("entry", [Entry("  ", alias="x"), Entry("--", alias="x"),
                                   Entry("word"), Entry("word", alias=" "),
                                   Entry("word", alias="[[wˈɜːd]]"),
                                   Entry("word", alias="[laugh] word")])
def test_entries_without_a_word_or_a_value_are_bad_messages(entry: Entry) -> None:
    with pytest.raises(BadMessage) as info:
        Lexicon([entry], phonemes=True)
    assert info.value.code is ErrorCode.BAD_MESSAGE


@pytest.mark.parametrize("entries", [
    [Entry(f"w{i}", alias="x") for i in range(MAX_ENTRIES + 1)],
    [Entry("w" * (MAX_GRAPHEME_CHARS + 1), alias="x")],
    [Entry("word", alias="x" * (MAX_VALUE_CHARS + 1))],
    [Entry("word", phoneme="ə" * (MAX_VALUE_CHARS + 1))],
])
def test_lexicons_past_their_bounds_are_refused_with_their_code(entries: list[Entry]) -> None:
    with pytest.raises(LexiconTooLarge) as info:
        Lexicon(entries, phonemes=True)
    assert info.value.code.value == "lexicon_too_large"


def test_a_lexicon_at_its_bounds_is_taken() -> None:
    entries = [Entry(f"w{i}", alias="x") for i in range(MAX_ENTRIES - 1)]
    entries.append(Entry("w" * MAX_GRAPHEME_CHARS, alias="y" * MAX_VALUE_CHARS))
    lex = Lexicon(entries, phonemes=False)
    assert len(lex) == MAX_ENTRIES
    assert lex.apply("w7 w" + "w" * (MAX_GRAPHEME_CHARS - 1)).text == "x " + "y" * MAX_VALUE_CHARS


def test_a_contexts_lexicon_goes_over_its_voices_which_has_bounds_of_its_own() -> None:
    voice = Lexicon([Entry(f"v{i}", alias="voice") for i in range(5 * MAX_ENTRIES)]
                    + [Entry("New York", alias="NY")], phonemes=False,
                    max_entries=MAX_FILE_ENTRIES)
    own = Lexicon([Entry("v1", alias="mine"), Entry("New York City", alias="NYC")],
                  phonemes=False)
    both = own.over(voice)
    assert len(both) == 5 * MAX_ENTRIES + 3
    assert both.apply("v1 v2 New York City, New York").text == "mine voice NYC, NY"
    assert voice.apply("v1").text == "voice"  # the voice's own is unchanged


PLS = """<?xml version="1.0" encoding="UTF-8"?>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"
         alphabet="ipa" xml:lang="en-US">
  <lexeme>
    <grapheme>tomato</grapheme>
    <phoneme>təmˈɑːtoʊ</phoneme>
  </lexeme>
  <lexeme>
    <grapheme>W3C</grapheme>
    <grapheme>W3 C</grapheme>
    <alias>World Wide Web Consortium</alias>
  </lexeme>
  <lexeme case_sensitive="true">
    <grapheme>US</grapheme>
    <alias>United States</alias>
  </lexeme>
</lexicon>
"""


def test_a_pls_document_gives_its_entries() -> None:
    entries = parse_pls(PLS)
    assert entries == [
        Entry("tomato", phoneme="təmˈɑːtoʊ"),
        Entry("W3C", alias="World Wide Web Consortium"),
        Entry("W3 C", alias="World Wide Web Consortium"),
        Entry("US", alias="United States", case_sensitive=True),
    ]
    out = Lexicon(entries, phonemes=True).apply("The W3C and us in the US like tomato.")
    assert out.text == "The World Wide Web Consortium and us in the United States like tomato."
    assert out.phonemes[0].phoneme == "təmˈɑːtoʊ"


LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lexicon [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>
<lexicon version="1.0" alphabet="ipa"><lexeme><grapheme>&b;</grapheme><alias>x</alias>
</lexeme></lexicon>"""


@pytest.mark.parametrize(("document", "why"), [
    (LAUGHS, "DOCTYPE"),
    ("<lexicon><lexeme>", "well-formed"),
    ("<speak/>", "root element"),
    ('<lexicon alphabet="x-sampa"><lexeme><grapheme>a</grapheme><phoneme>@</phoneme>'
     "</lexeme></lexicon>", "alphabet"),
])
def test_pls_documents_that_are_not_plain_ipa_pls_are_refused(document: str, why: str) -> None:
    with pytest.raises(BadMessage, match=why):
        parse_pls(document)
