"""One window's step (longform.step.WindowStep) on real speech: what it returns and why, with and without the
speech guard. The guard's rules themselves are tested apart in test_guard.py and test_voiced.py; here, that the
step composes them: the segments kept, the next seek, and a decoding again from an earlier point."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA_DIR

from whisperane.audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, load_audio
from whisperane.decoding import decode
from whisperane.language import LanguageChoice
from whisperane.longform.speech_guard import GUARD_LEAD_IN_FRAMES, SpeechGuard
from whisperane.longform.step import DECODED, GUARD, NO_SPEECH, WindowStep, split_segments
from whisperane.longform.window import Window, read_window
from whisperane.longform.words import add_words
from whisperane.options import DecodingOptions, TranscribeOptions

JFK_TEXT = "ask not what your country can do for you"


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return load_audio(DATA_DIR / "jfk.flac")


def _step(model, samples: np.ndarray, guard: SpeechGuard | None, prompt=(), may_resume: bool = True):
    size = min(N_FRAMES, len(samples) // HOP_LENGTH)
    enc, samples, _ = read_window(model, _Stream(samples), 0, size, None)
    step = WindowStep(model, TranscribeOptions(), LanguageChoice.of_tokenizer(model, model.tokenizer("en")), guard)
    window = Window(0, size, enc, samples)
    outcome = step(window, list(prompt), 0, may_resume=may_resume, last_speech=0.0, content_frames=size,
                   audio_end=len(samples) / SAMPLE_RATE)
    return window, outcome


class _Stream:
    """The one read ``read_window`` makes of an array."""

    def __init__(self, samples: np.ndarray):
        self.samples = samples

    def read(self, start: int, n: int) -> np.ndarray:
        return self.samples[start : start + n]


def test_a_window_of_speech_keeps_its_segments_and_moves_past_them(tiny_int8_model, jfk):
    window, outcome = _step(tiny_int8_model, jfk, SpeechGuard.on_demand())
    text = "".join(s.text for s in outcome.segments).lower()
    assert outcome.reason == DECODED and not outcome.resumed and outcome.window_end is None
    assert JFK_TEXT in text.replace(",", "")
    assert outcome.seek > window.seek and outcome.seek <= window.size  # never past the window's audio
    words = [w for s in outcome.segments for w in s.words]
    assert words and all(0 <= w.start <= w.end <= len(jfk) / SAMPLE_RATE for w in words)
    assert outcome.last_speech == words[-1].end
    assert all(s.start < s.end and s.text.strip() for s in outcome.segments)


def test_noise_alone_is_no_speech(tiny_int8_model):
    noise = np.random.default_rng(0).normal(0, 0.01, 20 * SAMPLE_RATE).astype(np.float32)
    window, outcome = _step(tiny_int8_model, noise, SpeechGuard.on_demand())
    assert outcome.reason == NO_SPEECH and outcome.segments == ()
    assert outcome.seek == window.seek + window.size and not outcome.reset_prompt


def test_text_written_into_quiet_noise_is_dropped_by_the_guard(tiny_int8_model):
    """Quieter noise passes openai's no-speech rule and tiny.en writes text into it (" ." with one CPU's int8
    rounding, words with another's): without the guard those segments are kept; the guard's check of words against
    voice finds none there and drops them, whatever the text."""
    noise = np.random.default_rng(0).normal(0, 0.002, 20 * SAMPLE_RATE).astype(np.float32)
    _, openai = _step(tiny_int8_model, noise, None)
    assert openai.reason == DECODED and openai.segments
    _, guarded = _step(tiny_int8_model, noise, SpeechGuard.on_demand())
    assert guarded.reason == DECODED and guarded.segments == () and guarded.seek == openai.seek


def test_voice_after_the_last_word_is_decoded_again_alone(tiny_int8_model, jfk):
    """JFK and 8 s of quiet noise after it, which the voice given to the guard calls speech: voice without words
    after the last word. The step keeps the words before it and decodes again from the voice (a lead-in before
    it at most), the next window ending where that voice ends, once: not where the window may not resume."""
    noise = np.random.default_rng(1).normal(0, 0.002, 8 * SAMPLE_RATE).astype(np.float32)
    samples = np.concatenate([jfk, noise])
    speech_end = round(len(jfk) / SAMPLE_RATE * FRAMES_PER_SECOND)
    voice = [(0, speech_end + 400)]
    window, outcome = _step(tiny_int8_model, samples, SpeechGuard.of_voiced_frames(voice))
    assert outcome.reason == GUARD and outcome.resumed and outcome.reset_prompt
    kept = [w for s in outcome.segments for w in s.words]
    assert JFK_TEXT in "".join(s.text for s in outcome.segments).lower().replace(",", "")
    assert outcome.seek >= round(kept[-1].end * FRAMES_PER_SECOND) - 1
    assert outcome.seek >= speech_end - GUARD_LEAD_IN_FRAMES - 100
    assert outcome.window_end == window.seek + window.size  # no prompt: the unheard stretch (to the seek) alone
    _, again = _step(tiny_int8_model, samples, SpeechGuard.of_voiced_frames(voice), may_resume=False)
    assert again.reason == DECODED and not again.resumed


def test_without_the_guard_the_same_window_is_openais(tiny_int8_model, jfk):
    noise = np.random.default_rng(1).normal(0, 0.002, 8 * SAMPLE_RATE).astype(np.float32)
    _, outcome = _step(tiny_int8_model, np.concatenate([jfk, noise]), None)
    assert outcome.reason == DECODED and not outcome.resumed and outcome.window_end is None


def test_a_decoding_cut_off_by_its_token_limit_gets_its_words_from_openais_pass(tiny_int8_model, jfk):
    """Word times from the attention gathered while decoding (alignment="decode") need the row that predicted
    <|endoftext|>; a decoding that stopped at its token limit has none: openai's pass aligns it instead, the same
    words at the same times as that pass gives the text (an index error before)."""
    model, tok = tiny_int8_model, tiny_int8_model.tokenizer("en")
    size = min(N_FRAMES, len(jfk) // HOP_LENGTH)
    enc = model.encode(model.log_mel(jfk))
    result = decode(model, enc, DecodingOptions(language="en", sample_len=12), tok)
    assert len(result.tokens) == 12 and result.alignment.shape[1] == 12  # no <|endoftext|> row
    words = {}
    for alignment in ("decode", "teacher-forced"):
        segments, _, _ = split_segments(result, tok, 0, size)
        add_words(model, enc, result, segments, tok, TranscribeOptions(alignment=alignment), 0.0, size, 0.0)
        words[alignment] = [(w["word"], w["start"], w["end"]) for s in segments for w in s["words"]]
    assert len(words["decode"]) >= 5 and words["decode"] == words["teacher-forced"]
