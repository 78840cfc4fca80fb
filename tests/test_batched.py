"""Batched mode (VAD chunks decoded B at a time) and the sequential loop with VAD, on real speech with inserted
gaps of digital silence, low noise and music-like tones (test_vad's gapped audio, English clips, tiny.en int8).

Not asserted yet (issue 11 stays open), measured on the corpus's gapped file: batched WER 12.73 % against
sequential 8.86 %; a word start inside a tone gap in batched mode (" For" at 155.8 s, gap from 152.4 s) and
inside a -50 dBFS noise gap in both modes; first words later than 0.3 s after their clip's onset
(LJ001-0001 +0.45 s, the sonnet +2.8 s) with the seek guard; LJ001-0007 decoded "Gudenburg" batched and
"Gudenberg" sequentially although the VAD keeps the clip whole.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_vad import _gapped_audio, _speech_clips

import whisperane
from whisperane.audio import SAMPLE_RATE

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
        "sequential": model.transcribe(gapped.audio, speech_guard=False),  # openai's seek rule alone
        "batched": model.transcribe(gapped.audio, batch_size=8),  # measured, not yet held (docstring)
        "guarded": model.transcribe(gapped.audio),  # the default: with the seek guard
    }


def _wer(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    return jiwer.wer(norm(reference), norm(hypothesis))


def test_seek_guard_recovers_speech_the_sequential_loop_skips(results, gapped, corpus_manifest):
    """WER on the gapped file (measured on the corpus's: openai's seek rule alone 8.86 %, with the seek guard
    (the default) 3.86 %, batched 12.73 %: batched mode is not yet within the issue's 0.5 points of sequential,
    which is why it is not a default)."""
    texts = {e["id"]: e["text"] for e in corpus_manifest}
    reference = " ".join(texts.get(clip.name, "") for _, clip in gapped.clips)
    wers = {mode: _wer(reference, r.text) for mode, r in results.items()}
    print("WER on the gapped file:", {m: f"{100 * w:.2f} %" for m, w in wers.items()})
    assert wers["guarded"] <= wers["sequential"]


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
