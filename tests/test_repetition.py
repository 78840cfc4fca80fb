"""A decoding that loops is cut where the loop starts (whisperane.repetition, DecodingOptions.stop_at_repetition):
real tokens of the tiny.en tokenizer, and a real decoding that loops (tiny.en on JFK after a looping prompt)."""

from __future__ import annotations

from conftest import DATA_DIR

from whisperane.audio import SAMPLE_RATE, TIME_PRECISION, load_audio
from whisperane.decoding import decode
from whisperane.options import DecodingOptions
from whisperane.repetition import MIN_REPEATED_TOKENS, loop_start

# A prompt after which tiny.en decodes JFK's first 9 s as its text again and again, to the window's 224 tokens.
LOOPING_PROMPT = "the the the the the the the the the the"
LOOPING_SECONDS = 9.0


def _ts(tokenizer, seconds: float) -> int:
    return tokenizer.timestamp_begin + round(seconds / TIME_PRECISION)


def test_a_repeated_word_is_cut_after_its_first_copy(model):
    tok = model.tokenizer("en")
    head = tok.encode(" It was the first great sorrow of his")
    the = tok.encode(" the")
    tokens = [_ts(tok, 0), *head, *the * (MIN_REPEATED_TOKENS + 1)]
    assert loop_start(tokens, tok.timestamp_begin) == 1 + len(head) + len(the)
    assert loop_start(tokens[:-1], tok.timestamp_begin) is None  # one repeat short of a loop


def test_a_repeated_sentence_is_cut_though_its_timestamps_move_on(model):
    tok = model.tokenizer("en")
    sentence = tok.encode(" And so my fellow Americans, ask not what your country can do for you.")
    tokens = [_ts(tok, 0), *sentence]
    for k in range(1, 3):
        tokens += [_ts(tok, 3.0 * k), _ts(tok, 3.0 * k), *sentence]
    second_copy = 1 + len(sentence) + 2
    assert loop_start(tokens, tok.timestamp_begin) == second_copy


def test_speech_that_repeats_itself_a_little_is_not_a_loop(model):
    tok = model.tokenizer("en")
    for text in (" No, no, no, no, I said no.", " Ask not what your country can do for you, ask what you can do for"
                 " your country.", " ha ha ha ha ha"):
        assert loop_start(tok.encode(text), tok.timestamp_begin) is None, text


def test_a_looping_decoding_stops_with_the_tokens_it_would_have_decoded_before_the_loop(model):
    tok = model.tokenizer("en")
    audio = load_audio(DATA_DIR / "jfk.flac")[: round(LOOPING_SECONDS * SAMPLE_RATE)]
    enc = model.encode(model.log_mel(audio))
    options = DecodingOptions(language="en", prompt=LOOPING_PROMPT)
    looped = decode(model, enc, options, tok)
    assert len(looped.tokens) == 224 and looped.compression_ratio > 2.4  # openai's check fails it: the fallback runs
    stopped = decode(model, enc, DecodingOptions(language="en", prompt=LOOPING_PROMPT, stop_at_repetition=True), tok)
    assert stopped.compression_ratio < 2.4 and len(stopped.tokens) < 60
    assert list(looped.tokens[: len(stopped.tokens)]) == list(stopped.tokens)  # greedy: the same tokens up to the cut
    assert "ask not what your country can do for you" in stopped.text.lower()  # the speech before the loop kept
