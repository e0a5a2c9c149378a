"""Streaming text pieces: never half a character, joined == decode(all), stop strings held back."""

from __future__ import annotations

from hartonomous.textstream import REPLACEMENT, TextStream, cut_at_stop
from tiny_model import tiny_tokenizer

TEXT = "héllo wörld — ünïcode ✓ 東京 🙂"


def pieces_of(ids, stop_strings=()):
    stream = TextStream(tiny_tokenizer(), stop_strings)
    pieces = [stream.push(i) for i in ids]
    return pieces, stream.finish(), stream


def test_multibyte_characters_are_never_split():
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT)
    assert any(REPLACEMENT in tok.decode([i]) for i in ids), "precondition: some token holds half a character"
    pieces, tail, _ = pieces_of(ids)
    assert all(REPLACEMENT not in p for p in pieces)
    assert "".join(pieces) + tail == TEXT
    # '🙂' is 4 bytes over 4 tokens: nothing shows until its last byte arrives
    assert pieces[-4:-1] == ["", "", ""] and pieces[-1] == "🙂"


def test_unfinished_character_is_flushed_as_replacement_at_the_end():
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT)[:-2]                # stop in the middle of '🙂'
    pieces, tail, _ = pieces_of(ids)
    assert "".join(pieces) + tail == tok.decode(ids)
    assert tail.endswith(REPLACEMENT) and all(REPLACEMENT not in p for p in pieces)


def test_stop_string_cuts_text_and_partial_matches_are_held_back():
    tok = tiny_tokenizer()
    ids = tok.encode("abc wörld xyz")
    pieces, tail, stream = pieces_of(ids, stop_strings=["wör", "zz"])
    assert stream.stopped
    assert "".join(pieces) + tail == "abc "
    # no piece ever showed 'w' before we knew whether 'wör' followed
    shown = ""
    for p in pieces:
        shown += p
        assert "w" not in shown


def test_held_back_prefix_is_released_when_the_match_fails():
    tok = tiny_tokenizer()
    ids = tok.encode("say wow now")
    pieces, tail, stream = pieces_of(ids, stop_strings=["wörld"])
    assert not stream.stopped
    assert "".join(pieces) + tail == "say wow now"


def test_cut_at_stop_takes_the_earliest_match():
    assert cut_at_stop("one two three", ["three", "two"]) == ("one ", True)
    assert cut_at_stop("one two", ["four"]) == ("one two", False)
    assert cut_at_stop("abc", [""]) == ("abc", False)
