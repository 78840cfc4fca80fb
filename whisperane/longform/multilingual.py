"""``multilingual``: each stretch of speech transcribed in its own language. Silero VAD's speech regions (cut at
pauses of REGIONS.min_silence_duration_ms, at most 30 s each) each have their language detected on their own audio;
consecutive regions of one language make a run, which the seek loop decodes alone (the audio from its first
region's start to its last one's end), in that language and prompted by no text of another: no window holds two
languages. Each segment carries
its language. openai-whisper detects one language on the first 30 s and decodes everything in it (a later stretch
in another language comes out translated); faster-whisper's ``multilingual`` detects per 30 s window, which still
decodes a window holding two languages in one. Given where the speaker changes (``speaker_changes``: with diarize,
found from the voices before decoding), a region is cut there too: two speakers answering each other with less than
a pause between them are two regions, each with its own language."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from ..audio import SAMPLE_RATE, AudioStream
from ..language import LanguageChoice, detect_language
from ..options import TranscribeOptions
from ..result import TranscriptionResult, result_from_segments
from ..runtime.model import WhisperaneModel
from ..vad.regions import VOICED, WINDOW_SAMPLES, SpeechRegion, VadOptions, speech_regions
from ..vad.silero import default_vad
from ..vad.stream import SpeechStream
from .seek import SeekLoop, WindowDone, empty_result
from .words import restore_timestamps

# Shorter pauses than faster-whisper's 2 s end a region: a change of language (a speaker answering another) often
# comes after less. Regions stay under one window, so that one language is detected on each whole.
REGIONS = VadOptions(min_silence_duration_ms=500, max_speech_duration_s=30.0, speech_pad_ms=200)
# A region's detection counts in full from this length, less below it (too little to tell a language by).
MIN_DETECT_SAMPLES = 2 * SAMPLE_RATE
# The cost of a change of language between two regions, against -log probabilities of the detections: a region
# whose language beats its neighbours' by a factor of e**1.5 (about 4.5) starts a run of its own.
SWITCH_COST = 1.5
# A run is decoded with up to this much of the pause before and after its speech: a decoding that starts right at
# the VAD's onset can miss the first words.
SPAN_PAD_SAMPLES = SAMPLE_RATE
# A speaker change found from the voices (their windows are 1.6 s long) lies up to about half a window from the
# change itself: a region is cut at the quietest moment within this reach of it, the pause between the two voices
# where there is one, rather than inside a word.
CHANGE_REACH_SAMPLES = 8 * SAMPLE_RATE // 10


@dataclass(frozen=True)
class LanguageRun:
    """Consecutive speech regions of one language; decoded as the stretch of audio from the first's start to the
    last's end (``span``, widened into the pauses around it by up to SPAN_PAD_SAMPLES), the pauses between them kept:
    cut out, they would join words across them."""

    language: str
    regions: tuple[SpeechRegion, ...]

    span: SpeechRegion


def multilingual_windows(model: WhisperaneModel, open_stream: Callable[[], AudioStream], options: TranscribeOptions,
                         speaker_changes: Sequence[int] = ()) -> Generator[WindowDone, None, TranscriptionResult]:
    """The runs of one language each decoded in turn (a source opened once for the VAD and the languages, then once
    per run); after each run its segments, on the original audio; returns the result, whose language is the one
    spoken longest. The speech regions are cut at ``speaker_changes`` (samples) before their languages are
    detected."""
    with open_stream() as stream:
        probabilities, n_samples = default_vad().speech_probabilities(stream)
    regions = speech_regions(probabilities, n_samples, REGIONS)
    regions = split_regions(regions, quietest_points(speaker_changes, probabilities, n_samples))
    duration = n_samples / SAMPLE_RATE
    if not regions:
        return empty_result(model, options, duration)
    with open_stream() as stream:
        runs = language_runs(regions, region_languages(model, stream, regions), n_samples)
    voiced_regions = speech_regions(probabilities, n_samples, VOICED)  # the speech guard's, found once
    voiced, segments, done = probabilities >= REGIONS.threshold, [], 0
    total = sum(run.span.n_samples for run in runs)
    for i, run in enumerate(runs):
        with SpeechStream(open_stream(), [run.span], n_samples, probabilities) as speech:
            loop = SeekLoop.over_speech(model, speech, options, voiced_regions,
                                        LanguageChoice(model, run.language, options.task),
                                        None if i == 0 or options.carry_initial_prompt else ())
            for window in loop:
                yield WindowDone((), (done + window.done * SAMPLE_RATE) / total * duration, duration)
            kept = [replace(s, language=run.language) for s in restore_timestamps(loop.segments, speech.time_map, voiced)]
        done += run.span.n_samples
        segments.extend(kept)
        yield WindowDone(tuple(kept), done / total * duration, duration)
    spoken: Counter[str] = Counter()
    for run in runs:
        spoken[run.language] += sum(r.n_samples for r in run.regions)
    language = spoken.most_common(1)[0][0]
    return result_from_segments(segments, model.tokenizer(language, options.task), duration, None,
                                options.word_timestamps)


def split_regions(regions: Sequence[SpeechRegion], points: Sequence[int]) -> list[SpeechRegion]:
    """``regions`` (in order) each cut in two at every point (samples) strictly inside it."""
    cuts, out = sorted(points), []
    for region in regions:
        inside = cuts[bisect_right(cuts, region.start) : bisect_left(cuts, region.end)]
        bounds = [region.start, *inside, region.end]
        out += [SpeechRegion(a, b) for a, b in pairwise(bounds)]
    return out


def quietest_points(points: Sequence[int], probabilities: np.ndarray, n_samples: int) -> list[int]:
    """Each point (samples) moved to the middle of the quietest VAD window within CHANGE_REACH_SAMPLES of it, the
    probabilities averaged over three windows (a pause, not a stop consonant's dip) and taken to 0.01 (the nearest
    of those as quiet)."""
    quiet = np.round(np.convolve(probabilities, np.ones(3) / 3, mode="same"), 2)
    out = []
    for point in points:
        low = max(0, (point - CHANGE_REACH_SAMPLES) // WINDOW_SAMPLES)
        high = min(len(quiet), (point + CHANGE_REACH_SAMPLES) // WINDOW_SAMPLES + 1)
        centres = np.arange(low, high) * WINDOW_SAMPLES + WINDOW_SAMPLES // 2
        if not len(centres):
            out.append(point)
            continue
        best = np.lexsort((np.abs(centres - point), quiet[low:high]))[0]
        out.append(min(int(centres[best]), n_samples))
    return out


def region_languages(model: WhisperaneModel, stream: AudioStream, regions: Sequence[SpeechRegion]) -> list[str]:
    """The language of each region: detected on its own audio (as a window of its own: the log-mel pads it), then
    smoothed over the sequence (``smoothed_languages``): one region's detection alone, on a few seconds, confuses
    close languages (Spanish heard as Portuguese)."""
    detections = []
    for region in regions:
        samples = stream.read(region.start, region.n_samples)  # regions in order: the stream reads forward
        _, probs = detect_language(model, model.encode(model.log_mel(samples)), model.tokenizer())
        detections.append((probs, min(1.0, region.n_samples / MIN_DETECT_SAMPLES)))
    return smoothed_languages(detections)


def smoothed_languages(detections: Sequence[tuple[dict[str, float], float]]) -> list[str]:
    """The languages of a sequence of regions (each: its detected probabilities and a weight, less for a region too
    short to tell) that best explain the detections with few changes: the Viterbi path whose cost is each region's
    weighted -log probability of its language plus SWITCH_COST at each change. A region of another language keeps
    it where its detection is surer than the change costs (a one-region island pays two changes)."""
    candidates = sorted({lang for probs, _ in detections for lang, _ in sorted(probs.items(), key=lambda kv: -kv[1])[:3]})
    costs = [{lang: -weight * math.log(max(probs.get(lang, 0.0), 1e-9)) for lang in candidates}
             for probs, weight in detections]
    total, back = dict(costs[0]), []
    for region_costs in costs[1:]:
        best_previous = min(total, key=total.get)
        step, choice = {}, {}
        for lang in candidates:
            stay, switch = total[lang], total[best_previous] + SWITCH_COST
            choice[lang] = lang if stay <= switch else best_previous
            step[lang] = min(stay, switch) + region_costs[lang]
        total = step
        back.append(choice)
    path = [min(total, key=total.get)]
    for choice in reversed(back):
        path.append(choice[path[-1]])
    return path[::-1]


def language_runs(regions: Sequence[SpeechRegion], languages: Sequence[str], n_samples: int) -> list[LanguageRun]:
    """Consecutive regions of one language joined into runs, in order, each spanning its regions and up to
    SPAN_PAD_SAMPLES of the pauses around it (up to half the pause where another run is near: no audio twice)."""
    groups: list[tuple[str, list[SpeechRegion]]] = []
    for region, language in zip(regions, languages, strict=True):
        if groups and groups[-1][0] == language:
            groups[-1][1].append(region)
        else:
            groups.append((language, [region]))
    runs = []
    for i, (language, members) in enumerate(groups):
        low = (groups[i - 1][1][-1].end + members[0].start) // 2 if i else 0
        high = (members[-1].end + groups[i + 1][1][0].start) // 2 if i + 1 < len(groups) else n_samples
        span = SpeechRegion(max(low, members[0].start - SPAN_PAD_SAMPLES), min(high, members[-1].end + SPAN_PAD_SAMPLES))
        runs.append(LanguageRun(language, tuple(members), span))
    return runs


__all__ = ["LanguageRun", "language_runs", "multilingual_windows", "quietest_points", "region_languages",
           "smoothed_languages", "split_regions"]
