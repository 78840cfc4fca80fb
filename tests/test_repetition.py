"""A decoding that loops is cut where the loop starts (whisperane.repetition, DecodingOptions.stop_at_repetition):
real tokens of the tiny.en tokenizer, and a real decoding that loops (tiny.en on JFK after a looping prompt), alone
and through openai's temperature fallback."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import CORPUS_DIR, DATA_DIR

from whisperane import decoding
from whisperane.audio import N_SAMPLES, SAMPLE_RATE, TIME_PRECISION, load_audio
from whisperane.decoding import compression_ratio, decode
from whisperane.longform import step
from whisperane.options import DecodingOptions, TranscribeOptions
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


def _fallback_decodings(model, enc, tok, patch) -> tuple[object, list[tuple[object, int]]]:
    """decode_with_fallback of ``enc`` after LOOPING_PROMPT: its result, and each decoding it made with the
    decoder steps that decoding took."""
    made, steps = [], []
    decoder_step, decode_window = model.decoder.step, step.decode
    patch.setattr(model.decoder, "step", lambda *a, **k: steps.append(1) or decoder_step(*a, **k))

    def counted(*args, **kwargs):
        before = len(steps)
        result = decode_window(*args, **kwargs)
        made.append((result, len(steps) - before))
        return result

    patch.setattr(step, "decode", counted)
    options = TranscribeOptions(language="en", initial_prompt=LOOPING_PROMPT)
    result = step.decode_with_fallback(model, enc, options, tok.encode(" " + LOOPING_PROMPT), tok, None, seed=0)
    return result, made


@pytest.mark.slow
def test_a_looping_window_falls_back_as_openai_without_decoding_its_loop(model, monkeypatch):
    """openai's fallback decodes this window's loop to its 224 tokens at each temperature where it loops (five
    samples from the second on) before its compression ratio sends it on to the next. Stopped where the loop
    starts, every temperature ends within a few tokens of it, the same temperatures are tried, and the fallback
    keeps the same result."""
    tok = model.tokenizer("en")
    audio = load_audio(DATA_DIR / "jfk.flac")[: round(LOOPING_SECONDS * SAMPLE_RATE)]
    enc = model.encode(model.log_mel(audio))
    with monkeypatch.context() as m:
        m.setattr(decoding, "cut_loop", lambda *a: False)  # no loop found: openai's decodings, to the end
        whole, whole_made = _fallback_decodings(model, enc, tok, m)
    stopped, stopped_made = _fallback_decodings(model, enc, tok, monkeypatch)
    assert any(n >= 223 and r.compression_ratio > 2.4 for r, n in whole_made)  # the loop, decoded to the limit
    assert [r.temperature for r, _ in stopped_made] == [r.temperature for r, _ in whole_made]
    assert all(n < 60 for _, n in stopped_made)  # each temperature's decoding: the text, one copy, the stop
    for (s, _), (w, _) in zip(stopped_made, whole_made, strict=True):
        assert s.looped == (w.compression_ratio > 2.4)  # a loop stopped wherever openai's check found one
    assert (stopped.temperature, stopped.tokens, stopped.text) == (whole.temperature, whole.tokens, whole.text)
    assert not stopped.looped and "ask not what your country can do for you" in stopped.text.lower()


@pytest.mark.slow
def test_a_sample_stopped_in_its_loop_leaves_the_other_samples_as_they_were(model, monkeypatch):
    """Five samples of a window at each temperature above 0 (tiny.en on German speech from 28.68 s, where its
    decodings loop). A sample stopped in its loop leaves the batch, and the others go on drawing the sampling noise
    they would have drawn beside it: each sample not stopped is the one openai's decoding samples, each stopped one
    the start of one of its loops."""
    clip = CORPUS_DIR / "audio" / "readbeyond__aeneas" / "de.mp3"
    if not clip.is_file():
        pytest.skip(f"needs the corpus ({clip})")
    tok = model.tokenizer("en")
    enc = model.encode(model.log_mel(load_audio(clip)[round(28.68 * SAMPLE_RATE) :][:N_SAMPLES]))
    samples = []
    best_result = decoding._best_result
    monkeypatch.setattr(decoding, "_best_result", lambda h, *a, **k: samples.append(h) or best_result(h, *a, **k))
    stops = 0
    for t in (0.2, 0.4, 0.6, 0.8, 1.0):
        options = DecodingOptions(language="en", temperature=t, best_of=5)
        decode(model, enc, options, tok)
        decode(model, enc, replace(options, stop_at_repetition=True, loop_ratio=2.4), tok)
        whole, stopped = samples[-2:]
        for w, s in zip(whole, stopped, strict=True):
            if s.loop is None:
                assert s.tokens == w.tokens
            else:
                stops += 1
                assert w.tokens[: len(s.tokens)] == s.tokens and len(w.tokens) >= s.loop[1]
                assert compression_ratio(tok.decode(w.tokens)) > 2.4
    assert stops  # some sample looped
