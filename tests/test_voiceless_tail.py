"""A stream's last window in which Silero VAD hears no voice is passed over as silence by the default mode's seek
loop (speech guard on): neither encoded nor decoded. openai's loop decodes the fraction of a second after a last
word, and a prompt that leads the decoding astray made every temperature of such a tail fail (issue 62)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from whisperane.audio import SAMPLE_RATE, load_audio

JFK = Path(__file__).parent / "data" / "jfk.flac"
pytestmark = pytest.mark.slow


def _counting_encoder(model, monkeypatch) -> list[int]:
    calls: list[int] = []
    encode = model.encode
    monkeypatch.setattr(model, "encode", lambda *a, **k: calls.append(1) or encode(*a, **k))
    return calls


def _jfk_then_noise(seconds: float) -> np.ndarray:
    """JFK (11 s), then quiet noise (-60 dBFS: not digital silence, no voice) to ``seconds``."""
    jfk = load_audio(JFK)
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(int(seconds * SAMPLE_RATE)) * 1e-3).astype(np.float32)
    audio[: len(jfk)] += jfk
    return audio


def test_a_tail_without_voice_is_neither_encoded_nor_decoded(tiny_int8_model, monkeypatch):
    """31 s: the first window holds JFK's sentence, the stream's last window (after the last word, or the 1 s after
    the first window) only noise. One encoder pass, with the guard; openai's loop (the guard off) encodes the
    tail too."""
    audio = _jfk_then_noise(31.0)
    calls = _counting_encoder(tiny_int8_model, monkeypatch)
    guarded = tiny_int8_model.transcribe(audio)
    assert len(calls) == 1
    assert "ask not what your country can do for you" in guarded.text.lower()
    calls.clear()
    unguarded = tiny_int8_model.transcribe(audio, speech_guard=False)
    assert len(calls) == 2
    assert all(s.end <= 12.0 for s in guarded.segments)
    assert guarded.text.lower().count("country") <= unguarded.text.lower().count("country")


def test_a_tail_with_voice_is_decoded(tiny_int8_model, monkeypatch):
    """The same file with JFK's first two seconds ("And so my fellow Americans") placed at 30.5 s: the tail holds
    voice and is decoded."""
    audio = _jfk_then_noise(33.0)
    jfk = load_audio(JFK)
    start = int(30.5 * SAMPLE_RATE)
    audio[start : start + 2 * SAMPLE_RATE] += jfk[int(0.3 * SAMPLE_RATE) : int(2.3 * SAMPLE_RATE)]
    calls = _counting_encoder(tiny_int8_model, monkeypatch)
    result = tiny_int8_model.transcribe(audio)
    assert len(calls) == 2
    assert any(s.start >= 29.0 for s in result.segments)


def test_without_the_vad_the_guard_is_off(tiny_int8_model, monkeypatch):
    """Where the VAD cannot be loaded (not cached, PyPI out of reach) the guard is off, with one warning: openai's
    loop alone, the tail decoded and every word kept (a guard that asked a missing VAD heard no voice anywhere, and
    dropped JFK's first sentence as words without voice)."""
    from whisperane.errors import WhisperaneError
    from whisperane.vad import silero

    def no_vad():
        raise WhisperaneError("the Silero VAD model is not available")

    audio = _jfk_then_noise(31.0)
    unguarded = tiny_int8_model.transcribe(audio, speech_guard=False)
    monkeypatch.setattr(silero, "default_vad", no_vad)
    calls = _counting_encoder(tiny_int8_model, monkeypatch)
    with pytest.warns(UserWarning, match="speech guard off"):
        result = tiny_int8_model.transcribe(audio)
    assert len(calls) == 2
    assert result.text == unguarded.text
    assert "ask not what your country can do for you" in result.text.lower()
