"""StreamDecoder (incremental detokenization) and StopMatcher, with tiny tokenizers trained here."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from llm_onnx.runtime.generation.textstream import StopMatcher, StreamDecoder

CORPUS = [
    "Hello world, this is a small test corpus for streaming.",
    "Café, naïve, résumé, façade, Ünïcödé, straße, ça va?",
    "你好，世界！我们今天在这里测试流式解码。中文字符需要三个字节。",
    "日本語のテキストとカタカナ、ひらがな。",
    "Привет, мир! Ελληνικά γράμματα.",
    "Emoji: 😀 🎉 👍🏽 👨‍👩‍👧 🇫🇷 — and symbols ∑ ∞ ≠ €.",
] * 4
SPECIALS = ["</s>", "<|im_end|>"]
VOCAB = 400


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    """GPT-2 / Llama 3 / Qwen style: byte-level BPE, characters split across tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


@pytest.fixture(scope="module")
def sentencepiece_like() -> Tokenizer:
    """Llama 2 / Mistral style: "▁" for spaces, the decoder strips the first leading space."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(["Hello world and hello there, how are you today"] * 4, trainer)
    return tokenizer


def stream(tokenizer: Tokenizer, ids: Sequence[int], prompt: Sequence[int] = (), skip: bool = True) -> list[str]:
    decoder = StreamDecoder(tokenizer, prompt, skip_special_tokens=skip)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


# ---------------------------------------------------------------------------------------------
# StreamDecoder
# ---------------------------------------------------------------------------------------------


def test_pieces_of_real_text_are_whole_characters(byte_level: Tokenizer) -> None:
    text = "你好 😀 👨‍👩‍👧 café"
    ids = byte_level.encode(text).ids
    assert any("\ufffd" in byte_level.decode([i]) for i in ids)  # the tokens do split characters
    pieces = stream(byte_level, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert "你好" in pieces or "你" in pieces or any(piece.startswith("你") for piece in pieces)


def test_text_is_emitted_as_soon_as_a_character_is_complete(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("a😀b").ids
    decoder = StreamDecoder(byte_level)
    out = []
    for i in ids:
        out.append(decoder.push(i))
        assert "".join(out) == byte_level.decode(ids[: len(out)]).rstrip("\ufffd")
    assert decoder.flush() == ""


_ids = st.lists(st.integers(0, VOCAB - 1), max_size=40)


def _partial_ids(tokenizer: Tokenizer) -> list[int]:
    """Tokens whose text alone is not valid UTF-8 (bare lead/continuation bytes, half characters)."""
    return [i for i in range(VOCAB) if "\ufffd" in tokenizer.decode([i])]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_property_stream_equals_full_decode(byte_level: Tokenizer, data: st.DataObject, skip: bool) -> None:
    partial = _partial_ids(byte_level)
    ascii_and_specials = [0, 1, *byte_level.encode("a b!").ids]
    # Plain random ids, and runs made mostly of partial characters (incomplete and invalid UTF-8).
    garbage = st.lists(st.sampled_from(partial + ascii_and_specials), max_size=60)
    ids = data.draw(st.one_of(_ids, garbage))
    pieces = stream(byte_level, ids, skip=skip)
    full = byte_level.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in piece for piece in pieces)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_property_byte_level_with_a_prompt_still_equals_decode_of_the_output(
    byte_level: Tokenizer, data: st.DataObject, skip: bool
) -> None:
    # Prompts that end inside a character (partial ids) make the decoder drop its left context.
    mixed = st.lists(st.sampled_from(_partial_ids(byte_level) + [0, 1, 70, 71]), max_size=12)
    prompt = data.draw(st.one_of(_ids, mixed))
    ids = data.draw(st.one_of(_ids, mixed))
    assert "".join(stream(byte_level, ids, prompt, skip)) == byte_level.decode(ids, skip_special_tokens=skip)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet="Hello world and hi 你好😀é", max_size=30))
def test_property_real_text_round_trips_without_replacement_characters(byte_level: Tokenizer, text: str) -> None:
    pieces = stream(byte_level, byte_level.encode(text).ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_special_tokens_are_skipped_or_kept(byte_level: Tokenizer) -> None:
    eos = byte_level.token_to_id("</s>")
    ids = byte_level.encode("hi").ids + [eos] + byte_level.encode(" there").ids
    assert "".join(stream(byte_level, ids, skip=True)) == "hi there"
    assert "".join(stream(byte_level, ids, skip=False)) == "hi</s> there"


def _byte_token(tokenizer: Tokenizer, byte: int) -> int:
    """Id of the single-byte token for ``byte`` (GPT-2's byte-to-character table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if byte in printable:
        char = chr(byte)
    else:
        char = chr(256 + [b for b in range(256) if b not in printable].index(byte))
    token_id = tokenizer.token_to_id(char)
    assert token_id is not None
    return token_id


@pytest.mark.parametrize("byte", [0x80, 0xE4, 0xF0])
def test_long_invalid_byte_runs_keep_the_window_small(byte_level: Tokenizer, byte: int) -> None:
    ids = [_byte_token(byte_level, byte)] * 200 + byte_level.encode("ok 你").ids
    decoder = StreamDecoder(byte_level)
    pieces = []
    for i in ids:
        pieces.append(decoder.push(i))
        assert len(decoder._window) <= 2 * StreamDecoder.MAX_PENDING + 2
    pieces.append(decoder.flush())
    assert "".join(pieces) == byte_level.decode(ids)
    assert sum(1 for piece in pieces if piece) > 5  # the garbage was released along the way


def test_byte_token_table(byte_level: Tokenizer) -> None:
    assert byte_level.decode([_byte_token(byte_level, ord("A"))]) == "A"
    ni = "你".encode()
    assert byte_level.decode([_byte_token(byte_level, b) for b in ni]) == "你"


def test_flush_emits_incomplete_bytes_as_replacement_and_resets(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("😀").ids
    decoder = StreamDecoder(byte_level)
    assert [decoder.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.flush() == byte_level.decode(ids[:-1])
    assert "\ufffd" in byte_level.decode(ids[:-1])
    assert decoder.push(byte_level.encode("ok").ids[0]) == byte_level.decode(byte_level.encode("ok").ids[:1])


def test_sentencepiece_without_prompt_equals_decode(sentencepiece_like: Tokenizer) -> None:
    ids = sentencepiece_like.encode("Hello world and hello there").ids
    pieces = stream(sentencepiece_like, ids)
    assert "".join(pieces) == sentencepiece_like.decode(ids) == "Hello world and hello there"


def test_sentencepiece_with_prompt_keeps_the_leading_space(sentencepiece_like: Tokenizer) -> None:
    prompt = sentencepiece_like.encode("how are you").ids
    ids = sentencepiece_like.encode("Hello world").ids
    assert sentencepiece_like.decode(ids) == "Hello world"  # decode alone strips the space
    assert "".join(stream(sentencepiece_like, ids, prompt)) == " Hello world"


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(0, 299), max_size=30))
def test_property_sentencepiece_stream_equals_full_decode(sentencepiece_like: Tokenizer, ids: list[int]) -> None:
    assert "".join(stream(sentencepiece_like, ids)) == sentencepiece_like.decode(ids)


# ---------------------------------------------------------------------------------------------
# StopMatcher
# ---------------------------------------------------------------------------------------------


def run_stops(stops: list[str], pieces: list[str]) -> tuple[list[str], bool, StopMatcher]:
    matcher = StopMatcher(stops)
    out, stopped = [], False
    for piece in pieces:
        text, stopped = matcher.push(piece)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return out, stopped, matcher


def test_stop_string_split_across_pieces() -> None:
    out, stopped, matcher = run_stops(["</stop>"], ["Hello ", "world</s", "top> ignored"])
    assert stopped and "".join(out) == "Hello world"
    assert out == ["Hello ", "world", ""]  # "</s" was held back, then matched
    assert matcher.stop_string == "</stop>"
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


def test_partial_match_is_held_back_then_released() -> None:
    matcher = StopMatcher(["</stop>"])
    assert matcher.push("a </s") == ("a ", False)
    assert matcher.push("t") == ("", False)  # "</st" could still become "</stop>"
    assert matcher.push("ay") == ("</stay", False)
    assert matcher.push("<") == ("", False)
    assert matcher.flush() == "<"


def test_held_back_text_is_released_at_flush() -> None:
    out, stopped, _ = run_stops(["###"], ["abc#", "#"])
    assert not stopped and out == ["abc", "", "##"]


def test_multiple_stop_strings_earliest_wins() -> None:
    out, stopped, matcher = run_stops(["STOP", "\n\n", "END"], ["one ENDtwo\n", "\nthree STOP"])
    assert stopped and "".join(out) == "one "
    assert matcher.stop_string == "END"
    out, stopped, matcher = run_stops(["STOP", "\n\n"], ["one\n", "\nSTOP"])
    assert stopped and "".join(out) == "one" and matcher.stop_string == "\n\n"


def test_overlapping_stop_strings() -> None:
    out, stopped, matcher = run_stops(["abcd", "bc"], ["xab", "cd"])
    assert stopped and "".join(out) == "xa" and matcher.stop_string == "bc"


def test_stop_string_at_the_very_start() -> None:
    assert StopMatcher(["<|end|>"]).push("<|end|>rest") == ("", True)
    out, stopped, _ = run_stops(["<|end|>"], ["<|", "end", "|>"])
    assert stopped and out == ["", "", ""]


def test_stop_string_longer_than_one_piece_and_repeated_prefix() -> None:
    out, stopped, _ = run_stops(["aab"], ["a", "a", "a", "a", "b", "c"])
    assert stopped and "".join(out) == "aa"


def test_no_stop_strings_passes_everything_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("</s>") == ("</s>", False)
    assert matcher.flush() == ""


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab</>s", max_size=40),
    stops=st.lists(st.text(alphabet="ab</>s", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_property_stop_matcher_does_not_depend_on_how_text_is_cut(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    out, stopped, _ = run_stops(stops, pieces)
    # The stop string that ends first (then: starts first) wins, however the text was cut.
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    assert stopped == bool(hits)
    assert "".join(out) == (text[: min(hits)[1]] if hits else text)
