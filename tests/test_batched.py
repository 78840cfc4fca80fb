"""Batched mode (VAD chunks decoded B at a time) and the sequential loop with VAD, on real speech with inserted
gaps of digital silence, low noise and music-like tones (test_vad's gapped audio, English clips, tiny.en int8)."""

from __future__ import annotations

import numpy as np
import pytest
from test_vad import _gapped_audio, _speech_clips

import whisperane
from whisperane.audio import SAMPLE_RATE
from whisperane.vad import VadOptions, get_speech_timestamps

FIRST_WORD_TOLERANCE = 0.3  # s: a clip's first word starts this close to the clip (the bound)
AGREEMENT = 0.02  # s: word times of batched and sequential on clips the VAD leaves whole
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tiny_en_bundle):
    return whisperane.load_model(tiny_en_bundle, threads=2)


@pytest.fixture(scope="module")
def english_clips():
    return [c for c in _speech_clips() if not c.name.startswith(("picovoice", "aishell", "aeneas-simplicissimus"))
            and c.name not in ("es", "de", "test_es", "test_de")]  # fmt: skip


@pytest.fixture(scope="module")
def gapped(english_clips):
    return _gapped_audio(english_clips, seed=5)


@pytest.fixture(scope="module")
def results(model, gapped):
    return {
        "sequential": model.transcribe(gapped.audio),
        "batched": model.transcribe(gapped.audio, batch_size=8),
        "guarded": model.transcribe(gapped.audio, speech_guard=True),
    }


def _words(result) -> list:
    return [w for s in result.segments for w in s.words or ()]


def _wer(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    return jiwer.wer(norm(reference), norm(hypothesis))


def test_seek_guard_recovers_speech_the_sequential_loop_skips(results, gapped, corpus_manifest):
    """WER on the gapped file (measured: sequential 8.86 %, with the seek guard 7.95 %, batched 12.73 %: batched
    mode is not yet within the issue's 0.5 points of sequential, which is why it is not a default)."""
    texts = {e["id"]: e["text"] for e in corpus_manifest}
    reference = " ".join(texts.get(clip.name, "") for _, clip in gapped.clips)
    wers = {mode: _wer(reference, r.text) for mode, r in results.items()}
    print("WER on the gapped file:", {m: f"{100 * w:.2f} %" for m, w in wers.items()})
    assert wers["guarded"] <= wers["sequential"]


@pytest.mark.parametrize("mode", ["batched", "guarded"])
def test_no_word_starts_in_a_silent_or_tone_gap_and_every_clip_starts_on_time(results, gapped, mode):
    """Known gap (issue 11 open): a -50 dBFS noise gap held a word start in both modes (measured: " It" at
    109.7 s in the noise gap from 101.7 s); digital silence and tones are held to the rule."""
    words = _words(results[mode])
    for start, end, kind in [g for g in gapped.gaps if g[2] != "noise"]:
        inside = [w for w in words if start / SAMPLE_RATE + 0.05 < w.start < end / SAMPLE_RATE - 0.05]
        assert not inside, (kind, start / SAMPLE_RATE, inside[:3])
    late = []
    for first, clip in gapped.clips:
        t0, t1 = first / SAMPLE_RATE, (first + len(clip.audio)) / SAMPLE_RATE
        in_clip = [w.start for w in words if t0 - FIRST_WORD_TOLERANCE <= w.start < t1]
        if not in_clip or in_clip[0] - _speech_onset(clip.audio) - t0 > FIRST_WORD_TOLERANCE:
            late.append((clip.name, t0, in_clip[:1]))
    assert not late


def _speech_onset(audio: np.ndarray) -> float:
    """Seconds to a clip's first 20 ms frame 20 dB above its noise floor (LibriSpeech starts with room noise)."""
    n = len(audio) // 320
    db = 20 * np.log10(np.sqrt(np.mean(audio[: n * 320].reshape(n, 320) ** 2, axis=1)) + 1e-10)
    return float(np.argmax(db > np.percentile(db, 5) + 20)) * 0.02


def test_five_minutes_of_silence_and_noise_give_no_text(model):
    rng = np.random.default_rng(3)
    minute = SAMPLE_RATE * 60
    audio = np.concatenate([
        np.zeros(minute, np.float32), rng.normal(0, 0.003, minute).astype(np.float32),
        np.zeros(minute, np.float32), np.cumsum(rng.normal(0, 1e-4, minute)).astype(np.float32) * 0.05,
        rng.normal(0, 0.01, minute).astype(np.float32),
    ])  # fmt: skip
    for options in ({"batch_size": 8}, {"vad_filter": True}):
        result = model.transcribe(audio, **options)
        assert result.text.strip() == "" and not result.segments, (options, result.text)


def test_batched_and_sequential_agree_where_vad_keeps_the_clip_whole(model, english_clips):
    """One clip per chunk, and the VAD's one region covers the whole clip: the same audio decoded either way."""
    compared = 0
    for clip in english_clips:
        regions = get_speech_timestamps(clip.audio, VadOptions(max_speech_duration_s=30))
        if len(clip.audio) > 30 * SAMPLE_RATE or len(regions) != 1 or regions[0].n_samples != len(clip.audio):
            continue
        sequential, batched = _words(model.transcribe(clip.audio)), _words(model.transcribe(clip.audio, batch_size=4))
        assert [w.word for w in batched] == [w.word for w in sequential], clip.name
        gaps = [abs(a.start - b.start) for a, b in zip(batched, sequential, strict=True)]
        gaps += [abs(a.end - b.end) for a, b in zip(batched, sequential, strict=True)]
        assert max(gaps) <= AGREEMENT + 1e-6, clip.name
        compared += 1
    assert compared >= 2
