"""Word times: the alignment pass (``teacher_forced``, ``add_words``), openai-whisper's placement of the aligned
words in a window's segments (``add_word_timestamps``), and two rules of whisperane's own, each named for what it
does: word edges moved out of digital silence (``trim_words_to_sound``) and times on VAD speech put back on the
original audio (``restore_timestamps``, ``start_after_cut``). The speech guard's rules, which move words onto the
voice the VAD hears, are in ``speech_guard``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .. import timing
from ..audio import INPUT_STRIDE, SAMPLE_RATE
from ..options import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from ..result import Segment, Word
from ..runtime.decoder_adapters import CrossAttention
from ..runtime.model import WhisperaneModel
from ..timing import SENTENCE_END_MARKS, WordTiming, merge_punctuations
from ..tokenizer import Tokenizer
from ..vad.regions import WINDOW_SAMPLES, SpeechRegion, SpeechTimestampsMap


def teacher_forced(model: WhisperaneModel, enc: CrossAttention, texts: list[list[int]],
                   tokenizer: Tokenizer) -> list[tuple[np.ndarray, np.ndarray]]:
    """(probability of each text token [n], alignment weights [A, T, F]) of each window's text tokens, all
    rows in one decoder call (``enc`` holds one window per row). openai's pass: sot sequence, no_timestamps,
    the text, eot (no prompt, no timestamps); shorter rows are padded after their end, which the causal
    attention keeps from changing their own positions."""
    sequences = [[*tokenizer.sot_sequence, tokenizer.no_timestamps, *text, tokenizer.eot] for text in texts]
    longest, scored = max(map(len, sequences)), max(map(len, texts))
    tokens = np.asarray([seq + [seq[-1]] * (longest - len(seq)) for seq in sequences])
    targets = np.asarray([text + [0] * (scored - len(text)) for text in texts])
    first = len(tokenizer.sot_sequence)  # no_timestamps' position predicts the first text token
    with model.decoding_state(len(sequences)) as state:
        probs, weights = model.decoder.score(state, tokens, enc, first, targets, tokenizer.eot)
    rows = enumerate(zip(texts, sequences, strict=True))
    return [(probs[r, : len(text)], weights[r, :, : len(seq)]) for r, (text, seq) in rows]


def add_words(model, enc, result, segments, tokenizer: Tokenizer, options, time_offset, num_frames, last_speech) -> None:
    """Word timestamps of a window's segments."""
    text_tokens = [t for s in segments for t in s["tokens"] if t < tokenizer.eot]
    if not text_tokens or num_frames < INPUT_STRIDE:  # under one encoder frame of audio: nothing to align to
        for s in segments:
            s["words"] = []
        return
    # Rows gathered while decoding predict every sampled token (timestamps included) and the final <|endoftext|>;
    # a decoding cut off by its token limit has no row for an <|endoftext|>: it is aligned by openai's pass.
    gathered = result.alignment is not None and result.alignment.shape[1] > len(result.tokens)
    if options.alignment == "decode" and gathered:
        rows = [i for i, t in enumerate(result.tokens) if t < tokenizer.eot] + [len(result.tokens)]
        weights = result.alignment[:, rows]
        probs = np.exp([result.token_logprobs[i] for i in rows[:-1]])
        alignment = timing.find_alignment(weights, text_tokens, probs, num_frames, tokenizer)
    else:
        probs, weights = teacher_forced(model, enc, [text_tokens], tokenizer)[0]
        first = len(tokenizer.sot_sequence)
        alignment = timing.find_alignment(weights, text_tokens, probs, num_frames, tokenizer, first_row=first)
    add_word_timestamps(
        segments, alignment, time_offset=time_offset, last_speech_timestamp=last_speech,
        prepend_punctuations=options.prepend_punctuations, append_punctuations=options.append_punctuations,
        eot=tokenizer.eot,
    )


WORD_FRAME = 320  # 20 ms, the resolution of word timestamps
# A 20 ms frame this far below the window's loudest one is silence: pauses in speech, and room noise in a
# recording, stay well above it (JFK's pauses sit 30-36 dB down, LibriSpeech's background 40-45 dB), so
# only word edges that DTW put in near-digital silence (a gap between recordings, padding) move.
SILENT_BELOW_PEAK_DB = 50.0


def trim_words_to_sound(segments: Sequence[Segment], samples: np.ndarray, time_offset: float) -> list[Segment]:
    """The segments with word edges that DTW left in silence moved onto the nearest sounding frame inside the word.

    DTW's path starts at the window's first frame, so the first word of a window absorbs any leading silence
    (openai-whisper's clamps catch only some of these); a word start inside a pause is never right. A segment's
    own start and end stay as they are.
    """
    n = len(samples) // WORD_FRAME
    if n == 0:
        return list(segments)
    rms = np.sqrt(np.mean(samples[: n * WORD_FRAME].reshape(n, WORD_FRAME).astype(np.float64) ** 2, axis=1))
    db = 20 * np.log10(rms + 1e-10)
    sounding = db > float(db.max()) - SILENT_BELOW_PEAK_DB
    if not sounding.any():
        return list(segments)

    def trimmed(w: Word) -> Word:
        a = max(0, int(round((w.start - time_offset) * 50)))
        b = min(n, int(round((w.end - time_offset) * 50)))
        if b <= a or not sounding[a:b].any():
            return w
        start = round(time_offset + (a + int(np.argmax(sounding[a:b]))) / 50, 2) if not sounding[a] else w.start
        end = round(time_offset + (b - int(np.argmax(sounding[a:b][::-1]))) / 50, 2) if not sounding[b - 1] else w.end
        return replace(w, start=start, end=end)

    return [replace(s, words=tuple(map(trimmed, s.words))) if s.words else s for s in segments]


def spread_by_characters(words: Sequence[Word], start: float, end: float) -> list[Word]:
    """``words`` given ``start``..``end``, each a share by its characters (one at least)."""
    lengths = np.cumsum([0, *(max(1, len(x.word.strip())) for x in words)])
    edges = start + (end - start) * lengths / lengths[-1]
    return [replace(x, start=round(float(word_start), 2), end=round(float(word_end), 2))
            for x, word_start, word_end in zip(words, edges[:-1], edges[1:], strict=True)]


def word_duration_limits(alignment: Sequence[WordTiming]) -> tuple[float, float]:
    """(median_duration, max_duration) of the window's words, as openai: median capped at 0.7 s, max = 2x."""
    durations = np.array([t.end - t.start for t in alignment], dtype=np.float64)
    return duration_limits(durations[durations.nonzero()])


def duration_limits(durations: np.ndarray) -> tuple[float, float]:
    """openai's (median_duration, max_duration) of word durations: the median capped at 0.7 s, and twice that."""
    median_duration = min(0.7, median(durations)) if len(durations) > 0 else 0.0
    return median_duration, median_duration * 2


def median(values: np.ndarray) -> float:
    """numpy.median of a 1-D array without NaNs, the same number, without the import of numpy.ma that numpy's
    median makes at its first call (a noticeable part of a short file's run)."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    return float(ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2)


def clamp_sentence_boundaries(alignment: list[WordTiming], max_duration: float) -> list[WordTiming]:
    """Shorten over-long words at sentence ends: a sentence-end mark ends max_duration after it starts,
    and an over-long word right after one starts max_duration before it ends (openai's hack; the DTW
    tends to stretch these over the pause between sentences)."""
    result = list(alignment)
    if not any(t.end != t.start for t in result):
        return result
    for i in range(1, len(result)):
        aligned = result[i]
        if aligned.end - aligned.start > max_duration:
            if aligned.word in SENTENCE_END_MARKS:
                result[i] = replace(aligned, end=aligned.start + max_duration)
            elif result[i - 1].word in SENTENCE_END_MARKS:
                result[i] = replace(aligned, start=aligned.end - max_duration)
    return result


def segment_text_tokens(segments: Sequence[dict], eot: int | None = None) -> list[list[int]]:
    """Each segment's text tokens (ids < eot when eot is given), in order: their concatenation is the
    ``text_tokens`` to align for the window."""
    return [[int(t) for t in s["tokens"] if eot is None or t < eot] for s in segments]


def add_word_timestamps(
    segments: list[dict],
    alignment: list[WordTiming],
    *,
    time_offset: float,
    last_speech_timestamp: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
    eot: int | None = None,
) -> float:
    """Give each segment of one window its ``"words"`` and make its start/end agree with them.

    segments: the window's segments in order, dicts with "start", "end" (seconds, absolute) and
        "tokens" (text tokens; ids >= eot are dropped when eot is given); updated in place.
    alignment: ``find_alignment`` over the concatenated text tokens of these segments (times
        relative to the window); time_offset: the window's start in seconds (seek * 0.01).
    Returns the updated last_speech_timestamp (end of the last segment that got words).

    openai-whisper's segment logic (faster-whisper's is the same): words are dealt out to segments by
    token counts; over-long words at sentence ends and after a pause of more than 4x the median word
    duration are shortened; the segment's own timestamp is kept when the first/last word overshoots it
    by more than 0.5 s. On top of that (openai does not guarantee these) every word lies at or after
    the window start and after the previous word, and each segment spans exactly its first word's
    start to its last word's end. Times are rounded to 0.01 s; probabilities are left unrounded.
    """
    if len(segments) == 0:
        return last_speech_timestamp

    text_tokens_per_segment = segment_text_tokens(segments, eot)
    median_duration, max_duration = word_duration_limits(alignment)
    alignment = clamp_sentence_boundaries(alignment, max_duration)
    alignment = merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    previous_end = round(float(time_offset), 2)
    word_index = 0
    for segment, text_tokens in zip(segments, text_tokens_per_segment, strict=True):
        saved_tokens = 0
        words: list[dict] = []
        while word_index < len(alignment) and saved_tokens < len(text_tokens):
            aligned = alignment[word_index]
            if aligned.word:
                words.append(
                    {
                        "word": aligned.word,
                        "start": round(time_offset + aligned.start, 2),
                        "end": round(time_offset + aligned.end, 2),
                        "probability": float(aligned.probability),
                    }
                )
            saved_tokens += len(aligned.tokens)
            word_index += 1

        if len(words) > 0:
            _trim_segment_edges(segment, words, last_speech_timestamp, median_duration, max_duration)
            previous_end = _keep_in_order(segment, words, previous_end)
            last_speech_timestamp = segment["end"]
        segment["words"] = words

    return last_speech_timestamp


def _trim_segment_edges(
    segment: dict,
    words: list[dict],
    last_speech_timestamp: float,
    median_duration: float,
    max_duration: float,
) -> None:
    """openai's hacks at segment edges (a VAD-based segmentation should replace them one day)."""
    # The first word (and second) after a pause should not be longer than twice the median word.
    if words[0]["end"] - last_speech_timestamp > median_duration * 4 and (
        words[0]["end"] - words[0]["start"] > max_duration
        or (len(words) > 1 and words[1]["end"] - words[0]["start"] > max_duration * 2)
    ):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
            words[0]["end"] = words[1]["start"] = boundary
        words[0]["start"] = max(0, words[0]["end"] - max_duration)

    # Prefer the segment-level start timestamp if the first word is too long.
    if segment["start"] < words[0]["end"] and segment["start"] - 0.5 > words[0]["start"]:
        words[0]["start"] = max(0, min(words[0]["end"] - median_duration, segment["start"]))
    else:
        segment["start"] = words[0]["start"]

    # Prefer the segment-level end timestamp if the last word is too long.
    if segment["end"] > words[-1]["start"] and segment["end"] + 0.5 < words[-1]["end"]:
        words[-1]["end"] = max(words[-1]["start"] + median_duration, segment["end"])
    else:
        segment["end"] = words[-1]["end"]


def _keep_in_order(segment: dict, words: list[dict], previous_end: float) -> float:
    """Round, make the words non-overlapping and non-decreasing from previous_end on, and make the
    segment span its words. Returns the last word's end. A no-op whenever openai's output is already
    ordered (the common case): it only repairs the rare overlaps its edge rules can create."""
    for word in words:
        start = max(round(float(word["start"]), 2), previous_end)
        end = max(round(float(word["end"]), 2), start)
        word["start"], word["end"] = start, end
        previous_end = end
    segment["start"] = words[0]["start"]
    segment["end"] = words[-1]["end"]
    return previous_end


# Restored times are rounded to 1 ms: finer than the 20 ms of Whisper's timestamps, and rounding never
# reorders times, so it keeps them monotonic.
RESTORED_TIME_DECIMALS = 3


def restore_timestamps(segments: Sequence[Segment], time_map: SpeechTimestampsMap,
                       voiced: np.ndarray | None = None) -> list[Segment]:
    """The segments with their times and their words' measured on the speech-only audio put back on the original audio.

    As faster-whisper's ``restore_speech_timestamps``, except for a word across the boundary of two regions:
    its start is mapped in the region it starts in and its end in the region it ends in (faster-whisper maps
    both in the region of the word's middle, which can put the start or the end in removed audio). With
    ``voiced`` (the VAD's windows at or above its threshold, over the original audio), such a word is then
    kept on the side of the removed audio where the VAD hears more of it: the earlier up to that region's end,
    or the later from its first voiced window (DTW can start the first word after a cut in the padding before
    it: tiny.en put one 3 ms into 3.7 s of inserted tones); a word that starts in a region's unvoiced head after
    removed audio starts at the region's first voiced window (``start_after_cut``). A segment with words spans
    its first word's start to its last word's end; one without is mapped directly. The mapping never
    decreases, so times keep their order. ``seek`` stays on the speech-only timeline.
    """
    previous_end = 0.0  # the original end of the word before (a region's first word follows removed audio)
    restored = []
    for segment in segments:
        if not segment.words:
            start, end = _restored_span(segment.start, segment.end, time_map)
            restored.append(replace(segment, start=start, end=end))
            continue
        words = []
        for word in segment.words:
            start, end = _restored_span(word.start, word.end, time_map, voiced, previous_end)
            words.append(replace(word, start=start, end=end))
            previous_end = end
        restored.append(replace(segment, words=tuple(words), start=words[0].start, end=words[-1].end))
    return restored


def _restored_span(start: float, end: float, time_map: SpeechTimestampsMap, voiced: np.ndarray | None = None,
                   previous_end: float = 0.0) -> tuple[float, float]:
    """A start on a region boundary belongs to the next region and an end to the previous one; an empty span
    on a boundary would then end before it starts, so the end is kept at the start. ``previous_end``: the
    original end of the word before."""
    first, last = time_map.region_index(start), time_map.region_index(end, is_end=True)
    original_start = time_map.original_time(start, first)
    original_end = time_map.original_time(end, last, is_end=True)
    if voiced is not None and first < last:
        original_start, original_end = _one_side(original_start, original_end, time_map.regions[first],
                                                 time_map.regions[last], voiced)
    elif voiced is not None:
        original_start = start_after_cut(original_start, original_end, time_map, first, voiced, previous_end)
    original_start = round(original_start, RESTORED_TIME_DECIMALS)
    original_end = round(original_end, RESTORED_TIME_DECIMALS)
    return original_start, max(original_start, original_end)


def start_after_cut(start: float, end: float, time_map: SpeechTimestampsMap, index: int, voiced: np.ndarray,
                     previous_end: float) -> float:
    """The start of the first word of region ``index``, where audio was removed before the region, put on the
    region's first voiced window (its onset) in two cases. A start in the head before the onset, when the word
    reaches it: the head is padding taken from what the VAD called silence, and DTW on the speech-only timeline,
    with other speech just before it, can start the first word there (tiny.en, batched: 160 ms into inserted
    tones, 4 ms into silence, against the VAD's onsets 48 and 52 ms after the clips' starts). A start after the
    onset with voice all the way from the onset to it: nothing else is heard there, and DTW after the cut can
    start the word late (tiny.en: "Stuff" 0.40 s after the clip's first sound, 20 ms long, 0.17 s into the
    voice; the VAD's onset lags a fricative by ~0.2 s, so the move is never too early)."""
    region = time_map.regions[index]
    if region.start <= (time_map.regions[index - 1].end if index else 0) or previous_end > region.start_s:
        return start
    head_start = region.start // WINDOW_SAMPLES
    head = voiced[head_start : -(-region.end // WINDOW_SAMPLES)]
    if not head.any():
        return start
    onset_window = head_start + int(head.argmax())
    onset = onset_window * WINDOW_SAMPLES / SAMPLE_RATE
    if start < onset <= end:
        return onset
    voiced_through = voiced[onset_window : int(start * SAMPLE_RATE) // WINDOW_SAMPLES + 1]
    return onset if start > onset and voiced_through.all() else start


def _one_side(start: float, end: float, before: SpeechRegion, after: SpeechRegion,
              voiced: np.ndarray) -> tuple[float, float]:
    """A word from ``start`` in region ``before`` to ``end`` in the later region ``after``, kept on one side."""
    window = WINDOW_SAMPLES / SAMPLE_RATE
    head = voiced[int(start / window) : -(-before.end // WINDOW_SAMPLES)]
    tail = voiced[after.start // WINDOW_SAMPLES : int(end / window) + 1]
    if not tail.any():  # nothing to move it to
        return (start, min(end, before.end_s)) if head.any() else (start, end)
    if head.sum() >= tail.sum():  # where it sounds longer (the VAD's probability lags the voice)
        return start, min(end, before.end_s)
    onset = (after.start // WINDOW_SAMPLES + int(tail.argmax())) * window
    return max(after.start_s, min(onset, end)), end
