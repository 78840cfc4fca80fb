"""Batched mode (lanes of VAD speech decoded side by side) and the sequential loop with VAD, on real speech with
inserted gaps of digital silence, low noise and music-like tones (test_vad's gapped audio, English clips,
tiny.en int8).

Measured on the corpus's three gapped files (287 s each, gap draws 5, 1, 2, converter revision 11,
2026-12-02, AMD EPYC), pooled WER: batched 4.77 % (3-4 lanes a file), the sequential loop on the whole audio
with the speech guard 5.76 % and without it 7.27 %, the sequential loop over the VAD's speech alone
(vad_filter) 4.92 %. Per file, batched against the guarded loop moves by -1.8 to +0.7 points (draw 5: -0.22
on AMD EPYC, +0.68 on an Intel Xeon): one file alone is too few words for a half-point bound.

Not asserted (issue 11 stays open): on seven 840-870 s gapped files (every English clip three times, in
three orders, tiny.en, 8 lanes), batched mode was on average 0.21 points above the guarded loop (-1.13 to
+1.44; beyond +0.5 on three of seven) and 0.46 above vad_filter (0 to +0.99): lanes cost there. On the 609 s benchmark file
(bench.build_long_file): batched 4.69 %, sequential 3.94 % (2026-12-02-lanes-after-lane-cuts.md; 4.08-5.57 %
over five such files, 2026-12-02-lane-cuts.md).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from test_vad import _gapped_audio, _speech_clips, _voiced_spans

from whisperane.audio import SAMPLE_RATE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tiny_int8_model):
    """tiny.en int8 at two threads: conftest's session model, shared with the other modules that load it."""
    return tiny_int8_model


def english_speech_clips() -> list:
    """test_vad's speech clips in English (the gapped files' clips; benchmarks/bench_lanes.py's too)."""
    return [c for c in _speech_clips() if not c.name.startswith(("picovoice", "aishell", "aeneas-simplicissimus"))
            and c.name not in ("es", "de", "test_es", "test_de")]


def gapped_file(seed: int):
    """test_vad's gapped audio of the English clips, gap draw ``seed``."""
    return _gapped_audio(english_speech_clips(), seed=seed)


@pytest.fixture(scope="module")
def english_clips():
    return english_speech_clips()


# One draw of the gaps (where every window and lane falls). On one 287 s file the modes' WERs move by a few words
# with the CPU's arithmetic alone (seed 5, batched against the default loop: 4.55 against 4.77 % on AMD EPYC, 5.23
# against 4.55 % on an Intel Xeon); per file, batched against the default loop moved by -1.8 to +0.7 points over
# the draws measured. The bounds here are per file (ONE_FILE_POINTS); issue 11's half-point bound on the pooled WER
# of three draws is checked by benchmarks/bench_lanes.py (nine transcriptions of 287 s: a benchmark's time).
GAP_SEEDS = (5,)
ONE_FILE_POINTS = 0.01
# The modes compared on a gapped file: lanes side by side, one lane over the VAD's speech (the same loop, not side
# by side), the default loop over the whole audio (with the speech guard).
MODES = {"batched": {"batch_size": 8}, "vad_filter": {"vad_filter": True}, "guarded": {}}


@pytest.fixture(scope="module")
def gapped():
    return [gapped_file(seed) for seed in GAP_SEEDS]


def _counting_windows(model, audio, **options) -> tuple[object, int]:
    """The transcription and the number of windows its encoder steps encoded."""
    windows = []
    encode_rows = model.encode_rows
    model.encode_rows = lambda mels, into=None: windows.append(len(mels)) or encode_rows(mels, into)
    try:
        return model.transcribe(audio, **options), sum(windows)
    finally:
        del model.encode_rows  # the method again


@pytest.fixture(scope="module")
def batched_runs(model, gapped) -> list[tuple[object, int]]:
    """Batched mode on each draw, with the windows its encoder steps encoded (test_lanes_tails_share_windows)."""
    return [_counting_windows(model, g.audio, **MODES["batched"]) for g in gapped]


@pytest.fixture(scope="module")
def results(model, gapped, batched_runs):
    """Each mode's transcripts of the draws. openai's seek rule alone (the speech guard off) is held against the
    guard in test_longform."""
    results = {mode: [model.transcribe(g.audio, **options) for g in gapped]
               for mode, options in MODES.items() if mode != "batched"}
    return {"batched": [r for r, _ in batched_runs], **results}


def normalized(text: str) -> str:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


def reference_text(gapped_audio, texts: dict[str, str]) -> str:
    """The normalized reference of a gapped file: its clips' texts (clip id -> text) in order."""
    return normalized(" ".join(texts.get(clip.name, "") for _, clip in gapped_audio.clips))


@pytest.fixture(scope="module")
def wers(results, gapped, corpus_manifest) -> dict[str, float]:
    """Each mode's WER on the gapped file."""
    import jiwer

    texts = {e["id"]: e["text"] for e in corpus_manifest}
    references = [reference_text(g, texts) for g in gapped]
    wers = {mode: jiwer.wer(references, [normalized(r.text) for r in rs]) for mode, rs in results.items()}
    print("WER on the gapped files:", {m: f"{100 * w:.2f} %" for m, w in wers.items()})
    return wers


def test_lanes_side_by_side_cost_at_most_a_point(wers):
    """Lanes decoded side by side against the same loop over the speech as one lane (vad_filter): every lane
    but the first starts without previous text (corpus gapped file of draw 5, 2026-12-06, AMD EPYC: 5.45 against
    5.23 %; on it, with chunks decoded independently, before lanes, batched mode gave 12.73 %)."""
    assert wers["batched"] <= wers["vad_filter"] + ONE_FILE_POINTS


def test_lanes_cost_at_most_a_point_against_the_sequential_loop(wers):
    """Batched mode against the default sequential loop on the whole audio (speech guard on) (corpus gapped file
    of draw 5, 2026-12-06, AMD EPYC: batched 5.45 %, sequential 5.00 %)."""
    assert wers["batched"] <= wers["guarded"] + ONE_FILE_POINTS


def test_batched_equals_sequential_where_the_vad_changes_nothing(model, english_clips):
    """A clip whose one speech region is the whole clip gives batched mode the sequential loop's input: the
    same words, word times within 20 ms (measured: identical on the 11 such corpus clips). Where the VAD trims
    even 16-208 ms of a clip's lead-in, tiny.en's transcript may differ (a comma, a word): a different input,
    not asserted here. The sequential loop with openai's seek rule alone: the default mode's voice check moves
    word edges at pauses onto the voice (longform.speech_guard.edges_onto_voice; JFK's "what" from 4.56 to 5.41 s, out
    of the pause after "not"), which batched mode leaves as they are."""
    from whisperane.longform.vad_filter import vad_options
    from whisperane.options import TranscribeOptions
    from whisperane.vad.regions import speech_regions
    from whisperane.vad.silero import default_vad

    options = vad_options(TranscribeOptions(batch_size=8), batched=True)
    whole = []
    for clip in english_clips:
        regions = speech_regions(*default_vad().speech_probabilities(clip.audio), options)
        if [(r.start, r.end) for r in regions] == [(0, len(clip.audio))]:
            whole.append(clip)
    assert len(whole) >= 2, "too few clips whose speech region is the whole clip"
    for clip in whole[:4]:
        alone, batched = model.transcribe(clip.audio, speech_guard=False), model.transcribe(clip.audio, batch_size=8)
        words = [[w for s in r.segments for w in s.words] for r in (alone, batched)]
        assert [w.word for w in words[0]] == [w.word for w in words[1]], (clip.name, alone.text, batched.text)
        drift = max(max(abs(a.start - b.start), abs(a.end - b.end)) for a, b in zip(*words, strict=True))
        assert drift <= 0.02, (clip.name, drift)


def _late_first_words(results, gapped, mode: str) -> set[tuple[int, str]]:
    """(draw, clip) of each clip whose first word starts more than 0.3 s after its sound, or is missing (a clip's
    sound: its first voiced span, test_vad's ``_voiced_spans``)."""
    late = set()
    for draw, (g, result) in enumerate(zip(gapped, results[mode], strict=True)):
        words = [w for s in result.segments for w in s.words]
        for offset, clip in g.clips:
            sound = (offset + _voiced_spans(clip)[0][0]) / SAMPLE_RATE
            first = min((w for w in words if w.start >= sound - 0.3), key=lambda w: w.start, default=None)
            if first is None or first.start - sound > 0.3:
                late.add((draw, clip.name))
    return late


@pytest.mark.parametrize("mode", ["batched", "vad_filter"])
def test_every_clips_first_word_starts_within_300_ms_of_its_sound(results, gapped, mode):
    """No clip's first word is lost or late in a VAD mode where the loop over the whole audio (the default) has it
    within 0.3 s. On the speech-only timeline the first word after a cut is where DTW goes wrong: "Stuff it into
    you" started 0.40 s late (words.start_after_cut now moves such a start back to the voice), the sonnet's "1." was
    put at one instant in the pause after its voice and cleared by openai's rule (longform.speech_guard.instants_onto_voice
    keeps it on that voice). Measured (tiny.en int8, AMD EPYC Zen 4, the corpus's three files, 54 clips): 5 clips
    beyond 0.3 s before, none after, in both VAD modes; the whole-audio loop: 4 (tiny.en drops LJ001-0006's "And"
    in all three draws, and starts the sonnet 0.31 s early in the tones before it in one)."""
    late, whole_audio = (_late_first_words(results, gapped, m) for m in (mode, "guarded"))
    assert not late - whole_audio, sorted(late - whole_audio)


@pytest.mark.parametrize("draw", range(len(GAP_SEEDS)))
@pytest.mark.parametrize("mode", ["batched", "guarded"])
def test_no_word_starts_in_an_inserted_gap(results, gapped, mode, draw):
    """No word starts in the silence, noise or tones between two clips. The default mode ("guarded") puts the
    edges of words at a pause onto the VAD's voice (longform.speech_guard.edges_onto_voice): before it, 9, 8 and 6
    words started in the gaps of the three draws (clips' first words that DTW starts 0.01-0.63 s early, a "for"
    stretched over seconds of tones, words at an instant after a stretched "in"; tiny.en int8, AMD EPYC)."""
    gaps = [(start / SAMPLE_RATE, end / SAMPLE_RATE) for start, end, _ in gapped[draw].gaps]
    starts = [w.start for s in results[mode][draw].segments for w in s.words]
    assert starts
    inside = [t for t in starts for a, b in gaps if a < t < b]
    assert not inside, inside


def test_windows_encoded_one_call_each_fill_their_batch_rows(model, english_clips):
    """Batched mode's encoder step: every row of the batch is bitwise the window encoded alone (the int8
    encoder's activation scale is per call, so a row must never be computed beside others), also when a later
    step reuses the batch's arrays for fewer windows."""
    mels = [model.log_mel(clip.audio[: 30 * SAMPLE_RATE]) for clip in english_clips[:3]]
    batch = model.encode_rows(mels)
    arrays = {name: value.ctypes.data for name, value in batch.feeds.items()}
    assert batch.batch == len(mels)
    later = [mels[2], mels[0]]
    reused = model.encode_rows(later, batch)
    assert reused is batch and {n: v.ctypes.data for n, v in reused.feeds.items()} == arrays
    for mel, row in [*zip(later, (0, 1), strict=True), (mels[2], 2)]:
        alone = model.encode(mel)
        assert reused.feeds.keys() == alone.feeds.keys()
        for name, value in alone.feeds.items():
            np.testing.assert_array_equal(reused.feeds[name][row : row + 1], value)


def test_five_minutes_of_silence_and_noise_give_no_text(model):
    rng = np.random.default_rng(3)
    minute = SAMPLE_RATE * 60
    audio = np.concatenate([
        np.zeros(minute, np.float32), rng.normal(0, 0.003, minute).astype(np.float32),
        np.zeros(minute, np.float32), np.cumsum(rng.normal(0, 1e-4, minute)).astype(np.float32) * 0.05,
        rng.normal(0, 0.01, minute).astype(np.float32),
    ])
    for options in ({"batch_size": 8}, {"vad_filter": True}):
        result = model.transcribe(audio, **options)
        assert result.text.strip() == "" and not result.segments, (options, result.text)


@pytest.mark.parametrize("draw", range(len(GAP_SEEDS)))
def test_batched_segments_and_words_are_in_audio_order(results, draw):
    """Lanes and the bins of their tails (``lanes.pack_tails``) merged into one transcript: no segment
    starts before the one ahead of it ends, and no word before the word ahead of it (a bin's segment across two
    lanes' tails is split there, ``lanes.split_at``)."""
    segments = results["batched"][draw].segments
    for a, b in zip(segments, segments[1:], strict=False):
        assert b.start >= a.end, (a, b)
    words = [w for s in segments for w in s.words]
    for a, b in zip(words, words[1:], strict=False):
        assert b.start >= a.end, (a, b)


def test_a_segment_across_two_tails_is_split_where_the_later_starts(model):
    from whisperane.longform.lanes import split_at
    from whisperane.result import Segment, Word

    tokenizer = model.tokenizer()
    words = tuple(Word(w, s, e, 0.9) for w, s, e in
                  [(" And", 10.0, 10.2), (" so", 10.2, 10.5), (" my", 40.1, 40.3), (" fellow", 40.3, 40.6)])
    segment = Segment(id=0, seek=0, start=10.0, end=40.6, text=" And so my fellow",
                      tokens=tuple(tokenizer.encode(" And so my fellow")), temperature=0.0, avg_logprob=-0.2,
                      compression_ratio=1.0, no_speech_prob=0.1, words=words)
    alone = replace(segment, words=words[:2], start=10.0, end=10.5)
    parts = split_at([alone, segment], [40.0], tokenizer)
    assert parts[0] is alone
    assert [(p.text, p.start, p.end) for p in parts[1:]] == [(" And so", 10.0, 10.5), (" my fellow", 40.1, 40.6)]
    assert [tokenizer.decode(p.tokens) for p in parts[1:]] == [" And so", " my fellow"]
    assert [p.words for p in parts[1:]] == [words[:2], words[2:]]
    assert split_at([segment], [5.0, 50.0], tokenizer) == [segment]


def test_lanes_tails_share_windows(model, english_clips, gapped, batched_runs, monkeypatch):
    """Lanes whose last windows would not be full leave their tails to bins (``lanes.pack_tails``): fewer
    encoder windows than each lane ending on its own (measured: 7 against 8 on each of the three gapped files,
    the bin holding two lanes' tails; 609 s benchmark file, 8 lanes: 26 against 29). Lanes need a minute of speech
    each: tests/data's clips (a minute in all) are repeated until there is room for three; the corpus's (more than
    two minutes) are the first draw, whose batched run is the module's."""
    import whisperane.longform.lanes as lanes

    speech = sum(len(c.audio) for c in english_clips) / SAMPLE_RATE
    if speech >= 2 * lanes.MIN_LANE_SECONDS:
        audio, packed = gapped[0].audio, batched_runs[0][1]
    else:
        audio = _gapped_audio(english_clips * math.ceil(3 * lanes.MIN_LANE_SECONDS / speech), seed=GAP_SEEDS[0]).audio
        packed = _counting_windows(model, audio, batch_size=8)[1]
    monkeypatch.setattr(lanes.SeekLoop, "ends_in_a_tail", lambda loop: False)
    assert packed < _counting_windows(model, audio, batch_size=8)[1]
