"""Words only where there is voice (the speech guard's checks of words, longform.speech_guard): the rule with given voiced regions, then end to end on
speech clips framed by 15 s of digital silence before and 15 s of low noise after, in the default mode.

benchmarks/bench_framed.py measures the same on every English corpus clip and three variants, beside
faster-whisper."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CORPUS_DIR, DATA_CLIPS, corpus_entries

from whisperane.audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, load_audio
from whisperane.longform import speech_guard as voiced
from whisperane.longform.voice import VoiceRegions
from whisperane.longform.window import Window
from whisperane.result import Segment, Word

WINDOW = Window(0, N_FRAMES, None, np.zeros(N_FRAMES * HOP_LENGTH, np.float32))


def _segment(words: list[tuple[str, float, float]], probability: float = 0.9) -> Segment:
    ws = tuple(Word(w, a, b, probability) for w, a, b in words)
    return Segment(id=0, seek=0, start=ws[0].start, end=ws[-1].end, text="".join(w for w, _, _ in words), tokens=(),
                   temperature=0.0, avg_logprob=-0.2, compression_ratio=1.0, no_speech_prob=0.0, words=ws)


def _check(segments, voiced_seconds, may_resume=True):
    frames = [(round(a * FRAMES_PER_SECOND), round(b * FRAMES_PER_SECOND)) for a, b in voiced_seconds]
    return voiced.check_segments(VoiceRegions(frames), WINDOW, segments, may_resume)


SPEECH = _segment([(" He", 1.0, 1.3), (" could", 1.3, 1.6), (" wait", 1.6, 2.0), (" no", 2.0, 2.2), (" longer.", 2.2, 2.8)])


def test_segments_with_plausible_words_are_not_checked():
    """No VAD for a segment whose words look right, even where the regions say there is no voice."""
    kept, resume = _check([SPEECH], voiced_seconds=[])
    assert kept == [SPEECH] and resume is None


def test_a_sentence_written_again_into_noise_is_dropped():
    """The previous text written again after the speech, its words squeezed to an instant by DTW."""
    repeat = _segment([(" He", 24.0, 25.4), (" could", 25.4, 25.4), (" wait", 25.4, 25.4), (" no", 25.4, 25.4),
                       (" longer.", 25.4, 25.4)])
    kept, resume = _check([SPEECH, repeat], voiced_seconds=[(1.0, 2.8)])
    assert kept == [SPEECH] and resume is None


def test_voice_inside_a_stretched_word_decodes_again_before_its_segment():
    """A decoding that stopped before the sentence's end: its last word stretched over the rest of the speech, to
    the window's last timestamp. Decoded again from before the segment, ending soon after its voice."""
    cut = _segment([(" He", 1.0, 1.3), (" could", 1.3, 1.6), (" wait", 1.6, 29.98)])
    long_word = _segment([(" of", 1.0, 1.3), (" about", 1.3, 1.6), (" 1455.", 1.6, 3.0)])  # its own voice
    assert _check([long_word], voiced_seconds=[(1.0, 3.0)]) == ([long_word], None)
    kept, resume = _check([cut], voiced_seconds=[(1.0, 4.5)])
    assert kept == [] and resume is not None
    assert resume.frame == 0  # the lead-in before the voice reaches the window's start
    assert resume.unheard_end == round(4.5 * FRAMES_PER_SECOND) + voiced.TAIL_FRAMES


def test_a_word_stretched_over_a_pause_is_left_alone():
    """DTW gives a word the pause before it ("ask" after "Americans," in JFK): one word's voice in it, no more."""
    segment = _segment([(" Americans,", 1.0, 1.6), (" ask", 1.6, 3.9), (" not", 3.9, 4.2)])
    kept, resume = _check([segment], voiced_seconds=[(1.0, 1.6), (3.4, 4.2)])
    assert kept == [segment] and resume is None


def test_words_dtw_put_away_from_the_voice_move_onto_its_edge():
    """The text right, a time wrong: "exhibition," put at an instant 0.8 s after the voice, the "the" before it
    stretched over its voice (too little to hold another word: no decoding again)."""
    segment = _segment([(" in", 1.0, 1.3), (" the", 1.3, 2.6), (" exhibition,", 3.4, 3.4)])
    kept, resume = _check([segment], voiced_seconds=[(1.0, 2.0)])
    assert resume is None and [s.text for s in kept] == [segment.text]
    # the words after the last heard one share its span, to the voice's end
    assert [(x.start, x.end) for x in kept[0].words] == [(1.0, 1.3), (1.3, 1.45), (1.45, 2.0)]
    assert segment.words[-1].start == 3.4  # the decoded segment itself stays as it was
    early = _segment([(" So", 0.2, 0.2), (" he", 1.0, 1.2), (" went", 1.2, 3.0)])
    kept, resume = _check([early], voiced_seconds=[(1.0, 2.2)], may_resume=False)
    assert resume is None and [(x.start, x.end) for x in kept[0].words][0] == (1.0, 1.0)


def _edges(segments, voiced_seconds):
    frames = [(round(a * FRAMES_PER_SECOND), round(b * FRAMES_PER_SECOND)) for a, b in voiced_seconds]
    placed = voiced.edges_onto_voice(VoiceRegions(frames), WINDOW, segments)
    return [[(x.start, x.end) for x in s.words] for s in placed]


def test_edges_at_a_pause_move_onto_the_voice():
    """DTW starts a clip's first word in the noise before it, and ends a sentence's last word in the noise after
    it: the start goes to the voice's onset, the end to its end; words inside the voice keep DTW's times."""
    assert _edges([_segment([(" He", 1.0, 1.3), (" could", 1.3, 1.6)])], [(0.9, 1.7)]) == [[(1.0, 1.3), (1.3, 1.6)]]
    assert _edges([_segment([(" He", 0.4, 1.3), (" could", 1.3, 1.6)])], [(1.0, 1.6)]) == [[(1.0, 1.3), (1.3, 1.6)]]
    # words before the onset share the first voiced word's span
    assert _edges([_segment([(" It", 0.4, 0.9), (" was", 0.9, 1.4)])], [(1.0, 1.4)]) == [[(1.0, 1.16), (1.16, 1.4)]]
    assert _edges([_segment([(" no", 2.0, 2.2), (" longer.", 2.2, 3.5)])], [(2.0, 2.8)]) == [[(2.0, 2.2), (2.2, 2.8)]]
    # a stretched word inside a segment ("for" over the tones between two clips) starts at the voice after it
    spread = _segment([(" modern,", 1.0, 1.6), (" for", 1.6, 6.1), (" although", 6.1, 6.6)])
    assert _edges([spread], [(1.0, 1.6), (6.0, 6.6)]) == [[(1.0, 1.6), (6.0, 6.1), (6.1, 6.6)]]


# --- end to end: clips framed by silence and noise ---------------------------------------------------------

FRAME_S = 15.0
NOISE_RMS = 0.003  # about -50 dBFS: low noise, 19-34 dB below the clips' speech
MARGIN_S = 0.5  # a word this far beyond the clip's voice is outside the speech


def _voice_span(audio: np.ndarray) -> tuple[float, float]:
    from whisperane.vad.regions import VOICED, speech_regions
    from whisperane.vad.silero import default_vad

    regions = speech_regions(*default_vad().speech_probabilities(audio), VOICED)
    return regions[0].start_s, regions[-1].end_s


def _framed_clips() -> list:
    """tests/data's English clips, and with the corpus two of its clips that tiny.en int8 wrote again into the noise
    or cut short when framed (benchmarks/bench_framed.py)."""
    clips = [pytest.param(DATA_CLIPS[c][0], DATA_CLIPS[c][2], id=c)
             for c in ("1089-134686-0001", "1089-134691-0000", "1089-134691-0001", "LJ001-0002")]
    entries = {e["id"]: e for e in corpus_entries()}
    for clip in ("1272-128104-0000", "test-clean-1089-134686-0000", "LJ001-0007"):
        found = [e for key, e in entries.items() if key.endswith(clip)]
        if found:
            clips.append(pytest.param(CORPUS_DIR / found[0]["audio"], found[0]["text"], id=clip))
    return clips


@pytest.mark.slow
@pytest.mark.parametrize(("path", "text"), _framed_clips())
def test_a_framed_clip_gives_its_sentence_and_no_words_outside_its_speech(tiny_int8_model, path, text):
    """tiny.en, the default mode, a clip between 15 s of zeros and 15 s of low noise: every word within 0.5 s of
    the clip's voice, and words to the ends of that voice (the sentence whole: its spelling is the model's). The
    loop without the speech guard's checks of words wrote 1089-134686-0001 and 1272-128104-0000 again in the noise (31.84-33.24 s)
    and ended LJ001-0007 at "of about" (22.12 s), its "1455" judged no speech with the noise after it."""
    audio = load_audio(path)
    rng = np.random.default_rng(44)
    framed = np.concatenate([np.zeros(round(FRAME_S * SAMPLE_RATE), np.float32), audio,
                             (rng.standard_normal(round(FRAME_S * SAMPLE_RATE)) * NOISE_RMS).astype(np.float32)])
    result = tiny_int8_model.transcribe(framed)
    start, end = (t + FRAME_S for t in _voice_span(audio))
    words = [w for s in result.segments for w in s.words]
    outside = [(w.word, w.start, w.end) for w in words if w.start > end + MARGIN_S or w.end < start - MARGIN_S]
    assert not outside, (result.text, outside)
    assert words[0].start <= start + MARGIN_S and words[-1].end >= end - MARGIN_S, (result.text, text, start, end)
