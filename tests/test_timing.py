"""Word timing: DTW, the attention-to-matrix steps, word boundaries and openai's segment rules.

References are independent: a line-by-line port of openai-whisper's dtw_cpu/backtrace (which checks
the vectorised port in tests/dtw_reference.py), dtw-python itself, scipy's median filter and softmax
on raw attention logits, and faster-whisper's own add_word_timestamps / merge_punctuations / tokenizer.
"""

from __future__ import annotations

import string
import subprocess
import sys

import numpy as np
import pytest
from dtw_reference import openai_dtw
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import whisperane
import whisperane.timing
from whisperane.longform.hallucinations import (
    is_segment_anomaly,
    next_words_segment,
    word_anomaly_score,
)
from whisperane.longform.step import get_end
from whisperane.longform.words import add_word_timestamps, median, segment_text_tokens
from whisperane.result import Segment, Word
from whisperane.runtime.decoder_adapters import text_token_probabilities
from whisperane.timing import (
    APPEND_PUNCTUATIONS,
    PREPEND_PUNCTUATIONS,
    WordTiming,
    alignment_matrix,
    dtw,
    find_alignment,
    median_filter,
    merge_punctuations,
    standardised_rows,
)

# --------------------------------------------------------------------------- references


def reference_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's dtw_cpu + backtrace, transcribed loop for loop (float32 cumulative cost)."""
    n, m = x.shape
    cost = np.ones((n + 1, m + 1), dtype=np.float32) * np.inf
    trace = -np.ones((n + 1, m + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    i, j = n, m
    trace[0, :] = 2
    trace[:, 0] = 1
    result = []
    while i > 0 or j > 0:
        result.append((i - 1, j - 1))
        if trace[i, j] == 0:
            i, j = i - 1, j - 1
        elif trace[i, j] == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(result)[::-1].T
    return path[0], path[1]


class FakeTokenizer:
    """Token id k decodes to vocab[k]; words split as openai's split_tokens_on_spaces does."""

    eot = 1000

    def __init__(self, vocab: dict[int, str]):
        self.vocab = vocab

    def split_to_word_tokens(self, tokens):
        words, word_tokens = [], []
        for t in tokens:
            text = "<|endoftext|>" if t == self.eot else self.vocab[t]
            new_word = t >= self.eot or text.startswith(" ") or text.strip() in string.punctuation
            if new_word or not words:
                words.append(text)
                word_tokens.append([t])
            else:
                words[-1] += text
                word_tokens[-1].append(t)
        return words, word_tokens


def make_words(rng, n_words: int, max_tokens: int = 3):
    """Random words: (text pieces, token ids) with a FakeTokenizer vocabulary."""
    vocab, words, next_id = {}, [], 0
    for w in range(n_words):
        pieces = [f" w{w}"] + [f"p{k}" for k in range(1, int(rng.integers(1, max_tokens + 1)))]
        ids = list(range(next_id, next_id + len(pieces)))
        vocab.update(zip(ids, pieces, strict=True))
        next_id += len(pieces)
        words.append(("".join(pieces), ids))
    return vocab, words


def synthetic_attention(
    rng, predicted_spans, n_prompt_rows=0, n_after_rows=0, heads=4, frames=1500, noise=0.3
):
    """[heads, rows, frames] softmaxed attention: row n_prompt_rows + k attends to predicted_spans[k]
    (a [start, end) frame range); prompt rows and trailing rows attend at random."""
    rows = n_prompt_rows + len(predicted_spans) + n_after_rows
    logits = rng.normal(0.0, noise, size=(heads, rows, frames))
    for k, (s, e) in enumerate(predicted_spans):
        logits[:, n_prompt_rows + k, s:e] += 4.0
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)


def contiguous_spans(rng, n_tokens: int, first_frame: int, trailing_end: int):
    """Contiguous frame ranges of random lengths for n_tokens, then the eot row's range up to trailing_end."""
    lengths = rng.integers(4, 20, size=n_tokens)
    starts = first_frame + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    spans = [(int(s), int(s + n)) for s, n in zip(starts, lengths, strict=True)]
    spans.append((spans[-1][1], trailing_end))
    return spans


# --------------------------------------------------------------------------- DTW


def _random_cost(rng, shape, integers: bool) -> np.ndarray:
    if integers:  # many exact ties
        return rng.integers(-2, 3, size=shape).astype(np.float64)
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("integers", [False, True], ids=["continuous", "ties"])
def test_reference_dtw_equals_openai_backtrace(integers):
    """tests/dtw_reference.py (vectorised) is openai's dtw_cpu + backtrace, tie rule included."""
    rng = np.random.default_rng(1234 + integers)
    for _ in range(150):
        x = _random_cost(rng, (int(rng.integers(1, 12)), int(rng.integers(1, 30))), integers)
        for got, want in zip(openai_dtw(x), reference_dtw(x), strict=True):
            np.testing.assert_array_equal(got, want)
    x = -np.abs(rng.standard_normal((40, 300)))
    for got, want in zip(openai_dtw(x), reference_dtw(x), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("integers", [False, True], ids=["continuous", "ties"])
def test_dtw_is_dtw_python_symmetric1(integers):
    from dtw import dtw as dtw_fn
    from dtw import symmetric1

    rng = np.random.default_rng(7 + integers)
    shapes = [(1, 1), (1, 9), (9, 1), (5, 40), (60, 700)]
    shapes += [(int(rng.integers(1, 12)), int(rng.integers(1, 30))) for _ in range(50)]
    for shape in shapes:
        x = _random_cost(rng, shape, integers)
        ref = dtw_fn(x, step_pattern=symmetric1)
        ti, tj = dtw(x)
        assert ti.dtype == tj.dtype == np.int64
        np.testing.assert_array_equal(ti, ref.index1)
        np.testing.assert_array_equal(tj, ref.index2)
        # a path through every row and column, monotonic, unit steps
        assert set(ti) == set(range(shape[0])) and set(tj) == set(range(shape[1]))
        steps = np.diff(np.stack([ti, tj]), axis=1)
        assert ((steps >= 0) & (steps <= 1)).all() and (steps.sum(axis=0) >= 1).all()
        if not integers:  # without ties openai's rule finds the same path
            for got, want in zip((ti, tj), openai_dtw(x), strict=True):
                np.testing.assert_array_equal(got, want)


def test_dtw_tie_rule_differs_from_openai():
    """The documented case: openai's rule (diagonal and vertical tied below horizontal -> horizontal)
    walks one cell more than dtw-python's first-minimum rule, at the same total cost."""
    x = np.array([[0, 2], [0, 1], [1, 1], [1, 2], [0, 2]], dtype=np.float64)
    oi, oj = openai_dtw(x)
    assert oi.tolist() == [0, 1, 2, 3, 4, 4] and oj.tolist() == [0, 0, 0, 0, 0, 1]
    ti, tj = dtw(x)
    assert len(ti) == 5
    assert x[ti, tj].sum() == x[oi, oj].sum() == 4


def _modules_loaded_by(code: str, *packages: str) -> list[str]:
    """The modules in ``packages`` (and below them) that a fresh interpreter holds after running ``code``."""
    probe = (f"import sys, numpy as np, whisperane, whisperane.timing as t, whisperane.longform.words as words; {code}; "
             f"print([m for m in sorted(sys.modules) if any(m == p or m.startswith(p + '.') for p in {packages!r})])")
    return eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)


def test_word_timing_needs_no_scipy():
    """DTW and the median filter run without dtw-python's scipy import (0.8 s of an 11 s file's run)."""
    code = "t.dtw(-np.random.default_rng(0).random((5, 40))); t.median_filter(np.ones((2, 5, 40)), 7)"
    assert _modules_loaded_by(code, "scipy", "dtw") == []


@given(st.lists(st.floats(0.0, 30.0, allow_nan=False), min_size=1, max_size=60))
def test_median_is_numpys(durations):
    values = np.asarray(durations)
    assert median(values) == float(np.median(values))


def test_word_durations_need_no_numpy_ma():
    """numpy's median imports numpy.ma at its first call (18 ms of a short file's run); the word-duration limits
    do without it."""
    code = "words.word_duration_limits([t.WordTiming(' a', (1,), 0.0, 0.4, 0.9), t.WordTiming(' b', (2,), 0.4, 0.6, 0.9)])"
    assert _modules_loaded_by(code, "numpy.ma") == []


def test_dtw_rejects_bad_cost_matrices():
    for bad in [np.zeros((0, 3)), np.zeros(4), np.array([[0.0, np.nan]]), np.array([[np.inf]])]:
        with pytest.raises(ValueError, match="cost matrix"):
            dtw(bad)


# --------------------------------------------------------------------------- DTW on real alignment matrices


def _largest_shift(ours: list[WordTiming], theirs: list[WordTiming]) -> float:
    return max(
        (
            abs(a - b)
            for o, t in zip(ours, theirs, strict=True)
            for a, b in ((o.start, t.start), (o.end, t.end))
        ),
        default=0.0,
    )


@pytest.mark.slow
def test_dtw_python_gives_openai_word_times_on_every_clip(monkeypatch, corpus_transcripts):
    """dtw-python (run time) against openai's exact tie rule (tests/dtw_reference.py) on the alignment
    matrix of every window of every corpus clip, as the default transcription computes it (int8 decoders,
    English with tiny.en, the other languages with base; conftest's session fixture, shared with
    test_transcribe): identical word times.

    Measured on the 27 corpus clips (31 windows, matrices from 6 x 89 to 96 x 1500): no clip where a tie
    changes a word time, and not even a DTW path that differs. The cost is the shared transcription of the
    corpus; the comparison itself took 14 s at load 12 on the 2-core machine."""
    calls = [(t.entry["id"], args, kwargs) for t in corpus_transcripts for args, kwargs in t.alignment_calls]
    clips = {t.entry["id"] for t in corpus_transcripts}
    assert {clip_id for clip_id, _, _ in calls} == clips  # every clip gave words, so was compared

    differing_words: dict[str, float] = {}  # clip -> largest difference of a word's start or end (s)
    differing_paths, shapes = 0, []
    for clip_id, args, kwargs in calls:
        ours = find_alignment(*args, **kwargs)
        monkeypatch.setattr(whisperane.timing, "dtw", openai_dtw)
        theirs = find_alignment(*args, **kwargs)
        monkeypatch.undo()
        assert [w.word for w in ours] == [w.word for w in theirs]
        if (shift := _largest_shift(ours, theirs)) > 0:
            differing_words[clip_id] = max(shift, differing_words.get(clip_id, 0.0))
        weights, text_tokens, _, num_frames = args[:4]
        first_row = kwargs.get("first_row", 0)
        cost = -alignment_matrix(weights, len(text_tokens) + 1, num_frames, first_row=first_row)
        shapes.append(cost.shape)
        paths = zip(dtw(cost), openai_dtw(cost), strict=True)
        differing_paths += not all(np.array_equal(a, b) for a, b in paths)
    print(
        f"{len(calls)} windows of {len(clips)} clips (matrices {min(shapes)} to {max(shapes)}): "
        f"{differing_paths} DTW paths differ, "
        f"word times differ in {differing_words or 'no clip'}"
    )
    assert differing_words == {}


# --------------------------------------------------------------------------- median filter, matrix


@pytest.mark.parametrize("width", [1, 3, 7, 9])
def test_median_filter_matches_scipy_reflect(width):
    from scipy.ndimage import median_filter as scipy_median

    # 3 x 7 = 21 rows: more than one of the filter's row blocks
    x = np.random.default_rng(width).standard_normal((3, 7, 50)).astype(np.float32)
    # numpy/torch "reflect" (edge not repeated) is scipy's "mirror"
    want = scipy_median(x, size=(1, 1, width), mode="mirror")
    np.testing.assert_array_equal(median_filter(x, width), want)
    np.testing.assert_array_equal(median_filter(x[0, 0], width), want[0, 0])


def test_median_filter_leaves_inputs_shorter_than_half_width():
    x = np.arange(3.0)
    np.testing.assert_array_equal(median_filter(x, 7), x)
    with pytest.raises(ValueError):
        median_filter(x, 4)


@pytest.mark.parametrize("qk_scale", [1.0, 1.7])
def test_alignment_matrix_matches_openai_steps_on_raw_logits(qk_scale):
    """From raw attention logits, openai slices the frames, softmaxes (logits * qk_scale), standardizes
    each head over all rows, median-filters, averages heads and keeps rows sot_len .. -1. The decoder
    gives us softmax over all 1500 frames; the matrix built from that must be the same."""
    from scipy.ndimage import median_filter as scipy_median
    from scipy.special import softmax

    rng = np.random.default_rng(3)
    heads, n_text, sot_len, frames, num_frames = 3, 12, 1, 1500, 1234
    rows = sot_len + 1 + n_text + 1  # [*sot_sequence, no_timestamps, *text, eot]
    qk = rng.normal(0, 2.0, size=(heads, rows, frames))
    decoder_weights = softmax(qk, axis=-1)

    w = softmax(qk[..., : num_frames // 2] * qk_scale, axis=-1)
    w = (w - w.mean(axis=-2, keepdims=True)) / w.std(axis=-2, keepdims=True)
    w = scipy_median(w, size=(1, 1, 7), mode="mirror").mean(axis=0)
    want = w[sot_len:-1]

    got = alignment_matrix(decoder_weights, n_text + 1, num_frames, first_row=sot_len, qk_scale=qk_scale)
    assert got.shape == want.shape == (n_text + 1, num_frames // 2)
    np.testing.assert_allclose(got, want, atol=2e-4)


def test_standardisation_is_numpys_bitwise():
    """The per-head standardisation computes numpy's mean and std once each (``w.std`` computes the mean and the
    deviations again); its result must be numpy's ``(w - mean) / std`` to the bit, since DTW's ties see every bit,
    with a zero std dividing by 1."""
    rng = np.random.default_rng(7)
    w = rng.random((4, 83, 750)).astype(np.float32) ** 6
    w[2, :, 10] = 0.25  # a frame every row of a head attends to alike: std 0
    std = w.std(axis=-2, keepdims=True)
    want = (w - w.mean(axis=-2, keepdims=True)) / np.where(std > 0, std, 1.0)
    got = standardised_rows(w)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_alignment_matrix_mean_only_is_not_standardized():
    rng = np.random.default_rng(5)
    p = rng.random((6, 1500)).astype(np.float32)
    p /= p.sum(axis=-1, keepdims=True)
    got = alignment_matrix(p, 6, 3000, medfilt_width=1)
    np.testing.assert_allclose(got, p / p.sum(axis=-1, keepdims=True), rtol=1e-6)


def test_text_token_probabilities_softmax_over_text_vocabulary():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 20))
    tokens = [3, 0, 9, 14]
    eot = 15
    e = np.exp(logits[:, :eot])
    want = (e / e.sum(axis=-1, keepdims=True))[np.arange(4), tokens]
    # float32 exponentials (the logits are float32), summed in float64
    np.testing.assert_allclose(text_token_probabilities(logits, tokens, eot), want, rtol=2e-6)


# --------------------------------------------------------------------------- find_alignment


def test_find_alignment_recovers_known_word_boundaries():
    rng = np.random.default_rng(11)
    vocab, words = make_words(rng, 25)
    tokenizer = FakeTokenizer(vocab)
    text_tokens = [t for _, ids in words for t in ids]
    num_frames = 2 * 1200  # 24 s of audio in the window; frames past 1200 are padding
    spans = contiguous_spans(rng, len(text_tokens), first_frame=37, trailing_end=1200)
    assert spans[-2][1] < 1150
    weights = synthetic_attention(rng, spans)
    # padding frames that draw attention must be ignored
    weights[:, :, 1200:] += 0.5
    probs = rng.uniform(0.2, 1.0, size=len(text_tokens))

    alignment = find_alignment(weights, text_tokens, probs, num_frames, tokenizer)

    assert [a.word for a in alignment] == [w for w, _ in words]
    k = 0
    for timing, (_, ids) in zip(alignment, words, strict=True):
        assert timing.tokens == tuple(ids)
        want_start, want_end = spans[k][0] / 50, spans[k + len(ids) - 1][1] / 50
        if k == 0:
            want_start = 0.0  # the DTW path starts at frame 0: the first word absorbs leading silence
        assert abs(timing.start - want_start) <= 0.04 + 1e-9, (timing, want_start)
        assert abs(timing.end - want_end) <= 0.04 + 1e-9, (timing, want_end)
        assert timing.probability == pytest.approx(np.mean(probs[k : k + len(ids)]))
        k += len(ids)


def test_find_alignment_uses_the_rows_that_predict_each_token():
    """Full teacher-forced pass [sot, no_timestamps, *text, eot]: row r predicts token r + 1, so row 1
    (no_timestamps) attends to the first text token's frames."""
    rng = np.random.default_rng(12)
    vocab, words = make_words(rng, 12, max_tokens=1)
    tokenizer = FakeTokenizer(vocab)
    text_tokens = [t for _, ids in words for t in ids]
    spans = contiguous_spans(rng, len(text_tokens), first_frame=50, trailing_end=1500)
    sot_len = 1
    # rows: sot (predicts no_timestamps), no_timestamps .. last text (predict text + eot), eot (nothing)
    weights = synthetic_attention(rng, spans, n_prompt_rows=sot_len, n_after_rows=1)
    probs = np.full(len(text_tokens), 0.9)

    right = find_alignment(weights, text_tokens, probs, 3000, tokenizer, first_row=sot_len)
    starts = np.array([a.start for a in right])
    want = np.array([s for s, _ in spans[:-1]]) / 50
    want[0] = 0.0  # the DTW path starts at frame 0
    np.testing.assert_allclose(starts, want, atol=0.04 + 1e-9)
    assert right[-1].end == pytest.approx(spans[-2][1] / 50, abs=0.04 + 1e-9)

    # the same rows alone (first_row=0) give the same words
    minimal = find_alignment(
        weights[:, sot_len : sot_len + len(text_tokens) + 1], text_tokens, probs, 3000, tokenizer
    )
    np.testing.assert_allclose([a.start for a in minimal], want, atol=0.04 + 1e-9)

    # taking each token's own position instead (one row late) shifts every word by a token
    late = find_alignment(weights, text_tokens, probs, 3000, tokenizer, first_row=sot_len + 1)
    shifted = np.array([a.start for a in late])
    assert np.abs(shifted[1:] - want[1:]).min() > 0.04
    np.testing.assert_allclose(shifted[1:], want[2:].tolist() + [spans[-1][0] / 50], atol=0.04 + 1e-9)

    with pytest.raises(ValueError, match="rows"):
        find_alignment(weights, text_tokens, probs, 3000, tokenizer, first_row=sot_len + 2)


def test_find_alignment_mean_only_weights():
    rng = np.random.default_rng(13)
    vocab, words = make_words(rng, 10)
    tokenizer = FakeTokenizer(vocab)
    text_tokens = [t for _, ids in words for t in ids]
    spans = contiguous_spans(rng, len(text_tokens), first_frame=0, trailing_end=1500)
    mean_weights = synthetic_attention(rng, spans, heads=4).mean(axis=0)  # WhisperKit: [T, F]
    alignment = find_alignment(mean_weights, text_tokens, np.ones(len(text_tokens)), 3000, tokenizer)
    k = 0
    for timing, (_, ids) in zip(alignment, words, strict=True):
        assert abs(timing.start - spans[k][0] / 50) <= 0.04 + 1e-9
        k += len(ids)


def test_find_alignment_empty_and_eot_only():
    tokenizer = FakeTokenizer({})
    assert find_alignment(np.ones((2, 1, 1500)), [], [], 3000, tokenizer) == []


# --------------------------------------------------------------------------- real tokenizer


@pytest.fixture(scope="module")
def real_tokenizer(ct2_tiny_en_dir):
    """faster-whisper's tokenizer over the real tiny.en checkpoint's tokenizer.json."""
    import tokenizers
    from faster_whisper.tokenizer import Tokenizer

    hf_tokenizer = tokenizers.Tokenizer.from_file(str(ct2_tiny_en_dir / "tokenizer.json"))
    return Tokenizer(hf_tokenizer, multilingual=False, task="transcribe", language="en")


def test_real_tokenizer_words_punctuation_and_segments(real_tokenizer):
    tk = real_tokenizer
    text = " And so, my fellow Americans: ask not what your country can do for you."
    text_tokens = tk.encode(text)
    rng = np.random.default_rng(21)
    spans = contiguous_spans(rng, len(text_tokens), first_frame=20, trailing_end=1500)
    weights = synthetic_attention(rng, spans, n_prompt_rows=1, n_after_rows=1)
    probs = rng.uniform(0.5, 1.0, size=len(text_tokens))
    alignment = find_alignment(weights, text_tokens, probs, 3000, tk, first_row=len(tk.sot_sequence))
    assert "".join(a.word for a in alignment) == text
    assert [t for a in alignment for t in a.tokens] == text_tokens

    half = text_tokens.index(tk.encode(" ask")[0])
    segments = [
        {"start": 0.0, "end": spans[half][0] / 50, "tokens": text_tokens[:half]},
        {"start": spans[half][0] / 50, "end": 29.0, "tokens": text_tokens[half:] + [tk.eot]},
    ]
    last = add_word_timestamps(segments, alignment, time_offset=30.0, last_speech_timestamp=30.0, eot=tk.eot)
    words = [[w["word"] for w in s["words"]] for s in segments]
    assert words == [
        [" And", " so,", " my", " fellow", " Americans:"],
        [" ask", " not", " what", " your", " country", " can", " do", " for", " you."],
    ]
    assert segments[0]["start"] == segments[0]["words"][0]["start"] >= 30.0
    assert last == segments[1]["end"] == segments[1]["words"][-1]["end"]


# --------------------------------------------------------------------------- merge_punctuations


def _timings(words):
    return [WordTiming(w, (i,), i * 0.5, i * 0.5 + 0.4, 0.9) for i, w in enumerate(words)]


def test_merge_punctuations_openai_cases():
    merged = merge_punctuations(_timings([" (", "hello", ",", " world", "."]))
    assert [m.word for m in merged] == ["", " (hello,", "", " world.", ""]
    assert [m.tokens for m in merged] == [(), (0, 1, 2), (), (3, 4), ()]
    # a merged word keeps its own timing
    assert (merged[1].start, merged[1].end) == (0.5, 0.9)
    assert (merged[3].start, merged[3].end) == (1.5, 1.9)

    merged = merge_punctuations(_timings([' "', " (", " word", '"', " next"]))
    assert [m.word for m in merged] == ["", "", ' " ( word"', "", " next"]
    assert merged[2].tokens == (0, 1, 2, 3)

    # a prepended mark without a leading space, or an appended mark after a word ending in a space,
    # stays alone
    merged = merge_punctuations(_timings(["(", " a ", "."]))
    assert [m.word for m in merged] == ["(", " a ", "."]
    assert PREPEND_PUNCTUATIONS == "\"'“¿([{-" and APPEND_PUNCTUATIONS == "\"'.。,，!！?？:：”)]}、"


def test_merge_punctuations_matches_faster_whisper():
    fw = pytest.importorskip("faster_whisper.transcribe")
    rng = np.random.default_rng(4)
    pool = [" a", " bc", "de", ",", ".", " (", ' "', '"', "?", " -", "”", " ¿", ")", " x"]
    for _ in range(200):
        words = [pool[i] for i in rng.integers(0, len(pool), size=int(rng.integers(1, 10)))]
        ours = merge_punctuations(_timings(words), PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
        theirs = [dict(word=t.word, tokens=list(t.tokens), start=t.start, end=t.end) for t in _timings(words)]
        fw.merge_punctuations(theirs, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
        assert [(o.word, list(o.tokens), o.start, o.end) for o in ours] == [
            (t["word"], t["tokens"], t["start"], t["end"]) for t in theirs
        ]


# --------------------------------------------------------------------------- add_word_timestamps


def _alignment(spec):
    """spec: (word, start, end) in window seconds, one token per word."""
    return [WordTiming(w, (i,), s, e, 0.8) for i, (w, s, e) in enumerate(spec)]


def test_long_word_after_sentence_end_is_clamped():
    spec = [
        (" One", 0.0, 0.3), (" two", 0.3, 0.6), (" three", 0.6, 0.9), (".", 0.9, 1.2),
        (" Four", 1.2, 4.0),  # swallowed the pause after the sentence
        (" five", 4.0, 4.3), (" six", 4.3, 4.6), ("!", 4.6, 7.0),  # a sentence end stretched over silence
        (" Seven", 7.0, 7.3),
    ]
    segments = [{"start": 0.0, "end": 7.3, "tokens": list(range(len(spec)))}]
    add_word_timestamps(segments, _alignment(spec), time_offset=0.0, last_speech_timestamp=0.0)
    words = {w["word"]: w for w in segments[0]["words"]}
    # median of the durations is 0.3 -> max_duration 0.6
    assert (words[" Four"]["start"], words[" Four"]["end"]) == (3.4, 4.0)
    assert words[" three."]["end"] == 0.9  # merged punctuation: the word keeps its own timing
    assert words[" six!"]["end"] == 4.6
    assert (words[" Seven"]["start"], words[" Seven"]["end"]) == (7.0, 7.3)


def test_first_word_after_a_pause_is_clamped():
    spec = [(" a", 0.0, 0.2), (" b", 0.2, 0.4), (" c", 0.4, 0.6), (" d", 0.6, 3.0), (" e", 3.0, 3.2)]
    segments = [
        {"start": 0.0, "end": 0.6, "tokens": [0, 1, 2]},
        {"start": 2.5, "end": 3.2, "tokens": [3, 4]},
    ]
    last = add_word_timestamps(segments, _alignment(spec), time_offset=10.0, last_speech_timestamp=9.0)
    first, second = segments
    assert [w["word"] for w in first["words"]] == [" a", " b", " c"]
    # " d" starts 2.4 s before it ends: after a pause (> 4x median 0.2) it is cut to max_duration 0.4
    d = second["words"][0]
    assert (d["start"], d["end"]) == (12.6, 13.0)
    assert second["start"] == 12.6 and second["end"] == 13.2 == last


def test_segment_with_no_words_and_empty_input():
    segments = [{"start": 1.0, "end": 2.0, "tokens": []}, {"start": 2.0, "end": 3.0, "tokens": [0]}]
    last = add_word_timestamps(
        segments, _alignment([(" x", 0.1, 0.5)]), time_offset=2.0, last_speech_timestamp=1.0
    )
    assert segments[0]["words"] == [] and (segments[0]["start"], segments[0]["end"]) == (1.0, 2.0)
    assert segments[1]["words"][0]["word"] == " x"
    assert last == segments[1]["end"]
    assert add_word_timestamps([], [], time_offset=0.0, last_speech_timestamp=4.2) == 4.2


def test_segment_text_tokens_drops_special_tokens():
    segments = [{"tokens": [50364, 10, 11, 50400]}, {"tokens": [12, 50256]}]
    assert segment_text_tokens(segments, eot=50256) == [[10, 11], [12]]


@st.composite
def window_case(draw):
    """A window: random words (some punctuation) on the 0.02 s grid, split into segments."""
    n_words = draw(st.integers(1, 25))
    kinds = [" w", "w", ".", ",", " (", "!", '"']
    frame = draw(st.integers(0, 100))
    spec, token_id = [], 0
    for _ in range(n_words):
        word = draw(st.sampled_from(kinds))
        n_tokens = draw(st.integers(1, 3))
        start = frame
        frame += draw(st.integers(0, 120))
        spec.append((word, tuple(range(token_id, token_id + n_tokens)), start / 50, frame / 50))
        token_id += n_tokens
    cuts = sorted(draw(st.lists(st.integers(0, token_id), max_size=3)))
    bounds = [0, *cuts, token_id]
    seek = draw(st.integers(0, 9000))
    offset = seek / 100
    segments = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        s = offset + draw(st.floats(0, 30, allow_nan=False))
        e = s + draw(st.floats(0, 10, allow_nan=False))
        segments.append({"seek": seek, "start": round(s, 2), "end": round(e, 2), "tokens": list(range(a, b))})
    last_speech = draw(st.floats(0, offset + 5, allow_nan=False))
    probs = draw(st.lists(st.floats(0, 1), min_size=n_words, max_size=n_words))
    alignment = [WordTiming(w, t, s, e, p) for (w, t, s, e), p in zip(spec, probs, strict=True)]
    return alignment, segments, offset, last_speech


def _ordered(segments, offset):
    previous = offset
    for segment in segments:
        for w in segment["words"]:
            if not (
                previous <= w["start"] <= w["end"]
                and segment["start"] <= w["start"]
                and w["end"] <= segment["end"]
            ):
                return False
            previous = w["end"]
        if segment["words"] and (
            segment["start"] != segment["words"][0]["start"] or segment["end"] != segment["words"][-1]["end"]
        ):
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_case())
def test_words_monotonic_inside_segments_and_all_placed(case):
    alignment, segments, offset, last_speech = case
    last = add_word_timestamps(segments, alignment, time_offset=offset, last_speech_timestamp=last_speech)
    assert _ordered(segments, round(offset, 2))
    for segment in segments:
        for w in segment["words"]:
            assert w["start"] == round(w["start"], 2) and w["end"] == round(w["end"], 2)
    # every word (after punctuation merging) is placed once, in order
    merged = [m.word for m in merge_punctuations(alignment) if m.word]
    assert [w["word"] for s in segments for w in s["words"]] == merged
    with_words = [s for s in segments if s["words"]]
    assert last == (with_words[-1]["end"] if with_words else last_speech)


FASTER_WHISPER_CASES = 300


def test_add_word_timestamps_matches_faster_whisper():
    """Where faster-whisper's (= openai's) result is already ordered, ours is the same numbers rounded.

    Cases where openai's edge rules overlap words are not compared (``assume``; the ordering property
    test covers ours there); hypothesis draws until FASTER_WHISPER_CASES cases were compared, and the
    count is asserted."""
    compared: list[int] = []

    @settings(max_examples=FASTER_WHISPER_CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(window_case())
    def compare(case):
        _compare_with_faster_whisper(*case)
        compared.append(1)

    compare()
    assert len(compared) >= FASTER_WHISPER_CASES


def _compare_with_faster_whisper(alignment, segments, offset, last_speech) -> None:
    from faster_whisper.transcribe import WhisperModel

    eot = 50257

    class Model:
        frames_per_second = 100

        @staticmethod
        def find_alignment(tokenizer, text_tokens, encoder_output, num_frames):
            return [[dict(word=a.word, tokens=list(a.tokens), start=a.start, end=a.end, probability=a.probability)
                     for a in alignment]]

    class Tok:
        pass

    tok = Tok()
    tok.eot = eot
    theirs = [dict(s) for s in segments]
    their_last = WhisperModel.add_word_timestamps(
        Model(), [theirs], tok, None, 3000, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS, last_speech
    )
    ours = [dict(s) for s in segments]
    our_last = add_word_timestamps(
        ours, alignment, time_offset=offset, last_speech_timestamp=last_speech, eot=eot
    )

    assume(_ordered(theirs, offset))  # openai's edge rules overlapped words here
    for o, t in zip(ours, theirs, strict=True):
        assert [w["word"] for w in o["words"]] == [w["word"] for w in t["words"]]
        for ow, tw in zip(o["words"], t["words"], strict=True):
            assert ow["start"] == round(tw["start"], 2) and ow["end"] == round(tw["end"], 2)
            assert ow["probability"] == tw["probability"]
        if t["words"]:
            assert (o["start"], o["end"]) == (round(t["start"], 2), round(t["end"], 2))
    assert our_last == pytest.approx(their_last, abs=0.005)


# --------------------------------------------------------------------------- hallucination helpers


def _words_segment(end: float, words: list[Word]) -> Segment:
    return Segment(id=0, seek=0, start=0.0, end=end, text=" hi", tokens=(), temperature=0.0, avg_logprob=0.0,
                   compression_ratio=1.0, no_speech_prob=0.0, words=tuple(words))


def test_hallucination_helpers():
    assert word_anomaly_score(Word(" a", 0.0, 0.5, 0.9)) == 0.0
    assert word_anomaly_score(Word(" a", 0.0, 0.5, 0.1)) == 1.0
    assert word_anomaly_score(Word(" a", 0.0, 0.033, 0.9)) == pytest.approx(1.5)
    assert word_anomaly_score(Word(" a", 0.0, 3.5, 0.9)) == pytest.approx(1.5)

    good = _words_segment(0.4, [Word(" hi", 0.0, 0.4, 0.9)] * 3)
    bad = _words_segment(0.4, [Word(" hi", 0.0, 0.4, 0.05)])
    only_punct = _words_segment(0.0, [Word(".", 0.0, 0.0, 0.01)])
    assert not is_segment_anomaly(good) and is_segment_anomaly(bad)
    assert not is_segment_anomaly(None) and not is_segment_anomaly(_words_segment(0.0, []))
    assert is_segment_anomaly(only_punct)  # openai: score 0 + 0.01 >= 0 words

    segments = [_words_segment(5.0, list(good.words)), _words_segment(9.0, [])]
    assert next_words_segment(segments[::-1]) is segments[0]
    assert get_end(segments) == 0.4
    assert get_end([_words_segment(9.0, [])]) == 9.0
    assert get_end([]) is None
