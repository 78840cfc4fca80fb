"""``multilingual``: each stretch of speech in its own language. The languages of a file's speech regions, smoothed
over the sequence, cut it into runs decoded each in its language: a clip in another language comes out in that
language, as well as it does alone (the default decodes everything in the first window's language). With
``diarize``, a region is also cut where the speaker changes: two speakers a short pause apart, in one region of the
VAD's, are each decoded in their own language."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import CLIPS, DATA_CLIPS

import whisperane
from whisperane.audio import SAMPLE_RATE, AudioStream, load_audio
from whisperane.longform.multilingual import (
    CHANGE_REACH_SAMPLES,
    REGIONS,
    SPAN_PAD_SAMPLES,
    language_runs,
    quietest_points,
    smoothed_languages,
    split_regions,
)
from whisperane.vad.regions import VOICED, WINDOW_SAMPLES, SpeechRegion, speech_regions
from whisperane.vad.silero import default_vad, get_speech_timestamps

PAUSE_S = 1.0
ORDER = ["jfk", "es", "de", "LJ001-0002"]  # English, Spanish, German, English


def _wer(hypothesis: str, reference: str) -> float:
    import jiwer

    def words(text: str) -> str:
        return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())

    return jiwer.wer(words(reference), words(hypothesis))


def test_one_unsure_region_of_a_close_language_stays_in_its_run():
    spanish, english = {"es": 0.9, "pt": 0.05, "en": 0.05}, {"en": 0.95, "es": 0.05}
    unsure = {"pt": 0.67, "es": 0.22, "it": 0.03}  # a few seconds of Spanish heard as Portuguese
    assert smoothed_languages([(spanish, 1.0), (unsure, 1.0), (spanish, 1.0)]) == ["es", "es", "es"]
    assert smoothed_languages([(english, 1.0), (spanish, 1.0), (unsure, 1.0), (english, 1.0)]) == ["en", "es", "es", "en"]


def test_a_sure_region_of_another_language_starts_a_run_of_its_own():
    english, german = {"en": 0.95, "de": 0.01}, {"de": 0.99, "en": 0.005}
    assert smoothed_languages([(english, 1.0), (german, 1.0), (english, 1.0)]) == ["en", "de", "en"]
    # a region too short to tell counts for less: an unsure short one does not
    assert smoothed_languages([(english, 1.0), ({"de": 0.6, "en": 0.3}, 0.2), (english, 1.0)]) == ["en"] * 3


def test_runs_span_their_regions_and_part_of_the_pauses_never_overlapping():
    second = SAMPLE_RATE
    regions = [SpeechRegion(1 * second, 3 * second), SpeechRegion(4 * second, 6 * second),
               SpeechRegion(6 * second + 8000, 9 * second), SpeechRegion(20 * second, 22 * second)]
    runs = language_runs(regions, ["en", "en", "es", "en"], 30 * second)
    assert [r.language for r in runs] == ["en", "es", "en"] and [len(r.regions) for r in runs] == [2, 1, 1]
    assert runs[0].span == SpeechRegion(0, 6 * second + 4000)  # half the short pause before the next run
    assert runs[1].span == SpeechRegion(6 * second + 4000, 9 * second + SPAN_PAD_SAMPLES)
    assert runs[2].span == SpeechRegion(20 * second - SPAN_PAD_SAMPLES, 22 * second + SPAN_PAD_SAMPLES)


def test_options_refuse_what_multilingual_cannot_combine_with(tiny_int8_model):
    with pytest.raises(whisperane.OptionsError, match="give no language"):
        whisperane.TranscribeOptions(multilingual=True, language="en")
    with pytest.raises(whisperane.OptionsError, match="batch_size"):
        whisperane.TranscribeOptions(multilingual=True, batch_size=4)
    with pytest.raises(whisperane.OptionsError, match="multilingual model"):
        whisperane.transcribe(np.zeros(SAMPLE_RATE, np.float32), model=tiny_int8_model, multilingual=True)


@pytest.mark.slow
def test_each_clip_in_its_own_language_as_well_as_alone(base_int8_model):
    pause = np.zeros(int(PAUSE_S * SAMPLE_RATE), np.float32)
    clips = [load_audio(DATA_CLIPS[name][0]) for name in ORDER]
    starts = np.cumsum([0] + [len(c) + len(pause) for c in clips])[:-1] / SAMPLE_RATE
    audio = np.concatenate([piece for clip in clips for piece in (clip, pause)])
    result = whisperane.transcribe(audio, model=base_int8_model, multilingual=True)
    assert result.language == "en"  # spoken longest
    # one word of a clip's 12 (8 points) may go either way at the cut around it
    _each_clip_in_its_language(result, ORDER, clips, starts, 0.5, base_int8_model, 0.09)
    default = whisperane.transcribe(audio, model=base_int8_model)
    assert {s.language for s in default.segments} == {None}  # segments carry a language only in this mode


def test_a_clip_alone_keeps_its_language(base_int8_model):
    result = whisperane.transcribe(str(CLIPS["es"].path), model=base_int8_model, multilingual=True)
    assert result.language == "es" and result.segments and {s.language for s in result.segments} == {"es"}
    assert result.to_dict()["segments"][0]["language"] == "es"


def test_regions_are_cut_at_the_points_inside_them():
    second = SAMPLE_RATE
    regions = [SpeechRegion(0, 10 * second), SpeechRegion(12 * second, 20 * second)]
    assert split_regions(regions, []) == regions
    points = [18 * second, 5 * second, 11 * second, 12 * second, 15 * second, 20 * second]  # 11-12 s: no region's
    assert split_regions(regions, points) == [
        SpeechRegion(0, 5 * second), SpeechRegion(5 * second, 10 * second), SpeechRegion(12 * second, 15 * second),
        SpeechRegion(15 * second, 18 * second), SpeechRegion(18 * second, 20 * second)]


def test_a_change_moves_to_the_pause_within_reach_and_no_farther():
    probabilities = np.full(200, 0.8, np.float32)
    probabilities[100:108] = 0.02  # a pause of 256 ms
    probabilities[50] = 0.1  # one window's dip inside speech: no pause
    near, far, flat = 110 * WINDOW_SAMPLES + 37, 108 * WINDOW_SAMPLES + CHANGE_REACH_SAMPLES + 4 * WINDOW_SAMPLES, \
        51 * WINDOW_SAMPLES
    moved = quietest_points([near, far, flat], probabilities, 200 * WINDOW_SAMPLES)
    assert 100 * WINDOW_SAMPLES < moved[0] < 108 * WINDOW_SAMPLES  # into the pause
    assert abs(moved[1] - far) <= WINDOW_SAMPLES  # the pause beyond reach: it stays where it was found
    assert abs(moved[2] - flat) <= 2 * WINDOW_SAMPLES  # a single dip is no pause to move to far
    assert quietest_points([], probabilities, 200 * WINDOW_SAMPLES) == []


def _speech_of(name: str) -> np.ndarray:
    """A tests/data clip from its first speech to its last (Silero VAD): no silence of its own at either end."""
    clip = load_audio(DATA_CLIPS[name][0])
    regions = get_speech_timestamps(clip, VOICED)
    return clip[regions[0].start : regions[-1].end]


@pytest.mark.slow
def test_with_diarize_two_speakers_a_short_pause_apart_keep_their_languages(base_int8_model):
    order, pause = ["es", "jfk", "de"], np.zeros(int(0.25 * SAMPLE_RATE), np.float32)
    clips = [_speech_of(name) for name in order]
    audio = np.concatenate([clips[0], pause, clips[1], pause, clips[2]])
    starts = np.cumsum([0] + [len(c) + len(pause) for c in clips])[:-1]
    probabilities, n_samples = default_vad().speech_probabilities(AudioStream.from_array(audio))
    # the test's premise: the VAD alone hears the Spanish and the English as one stretch of speech
    assert any(r.start < starts[1] < r.end for r in speech_regions(probabilities, n_samples, REGIONS))
    result = whisperane.transcribe(audio, model=base_int8_model, multilingual=True, diarize=True)
    assert result.speaker_turns and {s.language for s in result.segments} == {"es", "en", "de"}
    # a word or two at the cut may go either way (JFK's 22 words: 5 points each, the others' 10-12: 8-10)
    _each_clip_in_its_language(result, order, clips, starts / SAMPLE_RATE, 0.25, base_int8_model, 0.2)


def _each_clip_in_its_language(result, names, clips, starts, slack: float, model, tolerance: float) -> None:
    """Each clip's segments (their middles within ``slack`` s of it) carry its language, and their WER is at most
    ``tolerance`` over the clip transcribed alone in that language."""
    for name, clip, start in zip(names, clips, starts, strict=True):
        end = start + len(clip) / SAMPLE_RATE
        inside = [s for s in result.segments if start - slack <= (s.start + s.end) / 2 <= end + slack]
        language, reference = DATA_CLIPS[name][1], DATA_CLIPS[name][2]
        assert inside and {s.language for s in inside} == {language}, (name, inside)
        alone = whisperane.transcribe(clip, model=model, language=language).text
        assert _wer("".join(s.text for s in inside), reference) <= _wer(alone, reference) + tolerance, (name, inside, alone)
