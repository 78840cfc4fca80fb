"""The decoding loop against an independent reference: faster-whisper (CTranslate2) on the same weights.

Greedy float32 transcripts must be identical to faster-whisper's float32 ones and word timestamps within
openai-whisper's/faster-whisper's own DTW (median 20 ms, p95 100 ms); long-form segmentation must be ordered,
inside the audio and free of loops. The int8 decoders (the CPU default) are held to the reference transcripts
(WER no worse than float32's by more than 0.5 points) and to faster-whisper's language detection.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS_DIR, DATA_CLIPS, corpus_entries

from whisperane.audio import SAMPLE_RATE, load_audio
from whisperane.transcribe import transcribe

DATA_DIR = Path(__file__).resolve().parent / "data"

EN_CLIPS = ["jfk.flac", "1089-134686-0001.flac", "1089-134691-0000.flac", "LJ001-0002.flac"]
LONG_CLIPS = [*EN_CLIPS, "1089-134691-0001.flac", "LJ001-0008.flac"]
REFERENCES = {path.name: text for path, _, text in DATA_CLIPS.values()}  # tests/data/README.md
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tiny_float32_model):
    return tiny_float32_model


@pytest.fixture(scope="module")
def base(base_float32_model):
    return base_float32_model


@pytest.fixture(scope="module")
def tiny_int8(tiny_int8_model):
    m = tiny_int8_model
    assert m.kind.decoder == "appending" and "sequence" not in m.kind.files  # one int8 session for both uses
    return m


@pytest.fixture(scope="module")
def base_int8(base_int8_model):
    return base_int8_model


_FASTER_WHISPER: dict = {}


def _faster_whisper(ct2_dir, audio: np.ndarray, **kw):
    from faster_whisper import WhisperModel

    key = str(ct2_dir)
    if key not in _FASTER_WHISPER:
        _FASTER_WHISPER[key] = WhisperModel(key, device="cpu", compute_type="float32", cpu_threads=2)
    segments, info = _FASTER_WHISPER[key].transcribe(audio, beam_size=1, word_timestamps=True, **kw)
    return list(segments), info


@pytest.fixture(scope="module")
def tiny_default(tiny) -> dict:
    """Each long clip through float32 tiny.en with the default options, once for the tests that compare it."""
    return {clip: transcribe(load_audio(DATA_DIR / clip), tiny) for clip in LONG_CLIPS}


def _words(result):
    return [(w.word, w.start, w.end) for s in result.segments for w in s.words]


def _check_words_well_formed(result, duration: float) -> None:
    last = 0.0
    for s in result.segments:
        assert 0.0 <= s.start <= s.end <= duration + 1e-6
        for w in s.words:
            assert s.start - 1e-6 <= w.start <= w.end <= s.end + 1e-6, (s, w)
            assert w.start >= last - 1e-6, "words go back in time"
            assert 0.0 <= w.probability <= 1.0
            last = w.end


def test_tiny_en_matches_faster_whisper(tiny, tiny_default, ct2_tiny_en_dir):
    """Same segments and words as faster-whisper; word times within 20 ms median, 100 ms p95 over the clips, with
    openai's seek rule alone (the DTW the two share).

    (whisperane moves word edges that DTW leaves in silence onto sound, e.g. the first word of
    1089-134691-0000 starts at the voice, 0.58 s, where faster-whisper starts it at 0.0. The default mode also
    moves word edges at pauses onto the VAD's voice, longform.speech_guard.edges_onto_voice: its starts then lie further
    from faster-whisper's, p95 0.36 s, and nearer the corpus's published word times, 2026-12-06-session29-voiced-edges.md.)
    """
    d_start, d_end = [], []
    for clip in LONG_CLIPS:
        audio = load_audio(DATA_DIR / clip)
        fw_segments, _ = _faster_whisper(ct2_tiny_en_dir, audio, language="en")
        default, result = tiny_default[clip], transcribe(audio, tiny, speech_guard=False)
        assert [w[0] for w in _words(default)] == [w[0] for w in _words(result)], clip
        assert result.text.strip() == "".join(s.text for s in fw_segments).strip(), clip
        assert [s.text for s in result.segments] == [s.text for s in fw_segments], clip
        ours, theirs = _words(result), [(w.word, w.start, w.end) for s in fw_segments for w in s.words]
        assert [w[0] for w in ours] == [w[0] for w in theirs], clip
        d_start += [abs(a[1] - b[1]) for a, b in zip(ours, theirs, strict=True)]
        d_end += [abs(a[2] - b[2]) for a, b in zip(ours, theirs, strict=True)]
        _check_words_well_formed(result, len(audio) / SAMPLE_RATE)
    assert len(d_start) >= 50
    assert np.median(d_start) <= 0.02 and np.median(d_end) <= 0.02
    assert np.percentile(d_start, 95) <= 0.1 and np.percentile(d_end, 95) <= 0.1


@pytest.mark.parametrize("clip,language", [("test_es.wav", "es"), ("test_de.wav", "de")])
def test_base_detects_language_and_matches(base, ct2_base_dir, clip, language):
    audio = load_audio(DATA_DIR / clip)
    fw_segments, info = _faster_whisper(ct2_base_dir, audio)
    result = transcribe(audio, base)
    assert info.language == language
    assert result.language == info.language
    assert result.language_probs is not None
    assert max(result.language_probs, key=result.language_probs.get) == language
    assert abs(result.language_probs[language] - info.language_probability) < 0.02
    assert result.text.strip() == "".join(s.text for s in fw_segments).strip()


def _english_wer(texts: dict[str, str]) -> float:
    """Corpus WER (Whisper's English normalizer) of {clip: hypothesis} against REFERENCES."""
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    clips = sorted(texts)
    return jiwer.wer([norm(REFERENCES[c]) for c in clips], [norm(texts[c]) or "<empty>" for c in clips])


def _int8_by_clip(corpus_transcripts) -> dict:
    """The default int8 transcripts of LONG_CLIPS from conftest's corpus transcription (the same model and
    options as ``transcribe(audio, tiny_int8)``; the corpus holds these files byte for byte, and without the
    corpus the session transcribes tests/data's own)."""
    by_name = {Path(t.entry["audio"]).name: t for t in corpus_transcripts}
    assert set(LONG_CLIPS) <= set(by_name), sorted(by_name)
    for clip in LONG_CLIPS:
        assert (CORPUS_DIR / by_name[clip].entry["audio"]).read_bytes() == (DATA_DIR / clip).read_bytes(), clip
    return {clip: by_name[clip].result for clip in LONG_CLIPS}


def test_int8_accuracy_on_english_clips(tiny_default, tiny_int8, corpus_transcripts):
    """int8 decoder weights against the reference transcripts: WER within 0.5 points of float32's, and word
    starts within 20 ms (one frame) of float32's at the median on the words both share (measured: 0 ms)."""
    fp32, int8, d_start = {}, {}, []
    int8_results = _int8_by_clip(corpus_transcripts)
    for clip in LONG_CLIPS:
        audio = load_audio(DATA_DIR / clip)
        a, b = tiny_default[clip], int8_results[clip]
        fp32[clip], int8[clip] = a.text, b.text
        _check_words_well_formed(b, len(audio) / SAMPLE_RATE)
        if [w[0] for w in _words(a)] == [w[0] for w in _words(b)]:
            d_start += [abs(x[1] - y[1]) for x, y in zip(_words(a), _words(b), strict=True)]
    wer32, wer8 = _english_wer(fp32), _english_wer(int8)
    print(f"tiny.en WER float32 {wer32:.4f}, int8 {wer8:.4f}")
    assert wer8 <= wer32 + 0.005
    assert len(d_start) >= 30 and np.median(d_start) <= 0.02


@pytest.fixture(scope="module")
def base_without_words(base) -> dict:
    """test_es.wav and test_de.wav through float32 base without word timestamps, the language detected: the
    float32 side of the int8 comparison and the exact prefill of the prefill-table comparison."""
    return {clip: transcribe(load_audio(DATA_DIR / clip), base, word_timestamps=False)
            for clip in ("test_es.wav", "test_de.wav")}


@pytest.mark.parametrize("clip,language", [("test_es.wav", "es"), ("test_de.wav", "de")])
def test_base_int8_detects_language(base_int8, base_without_words, clip, language):
    """int8 base: the language faster-whisper detects, with nearly float32's probability; transcript within
    25 % WER of float32's (measured: es 1 of 12 words differs, de none)."""
    import jiwer
    from whisper_normalizer.basic import BasicTextNormalizer

    norm = BasicTextNormalizer()
    audio = load_audio(DATA_DIR / clip)
    a, b = base_without_words[clip], transcribe(audio, base_int8, word_timestamps=False)
    assert b.language == a.language == language
    assert abs(b.language_probs[language] - a.language_probs[language]) < 0.05
    wer = jiwer.wer(norm(a.text), norm(b.text))
    print(f"{clip}: int8 vs float32 WER {wer:.3f}: {a.text!r} -> {b.text!r}")
    assert wer <= 0.25


# A translation of tests/data/test_es.wav's "Las arenas son blanquecinas de grano medio y tiene muy poca
# asistencia." (the recording's own wording, "asistencia" included). Measured WER against it: base float32
# 0.58 ("The sand is white, the middle grain and has very few assistance."), int8 0.33.
ES_TRANSLATION = "The sands are whitish, of medium grain, and have very little assistance."


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_base_translate_gives_english(base, base_int8, compute_type):
    model = {"float32": base, "int8": base_int8}[compute_type]
    result = transcribe(load_audio(DATA_DIR / "test_es.wav"), model, task="translate", language="es")
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    wer = jiwer.wer(norm(ES_TRANSLATION), norm(result.text))
    print(f"translate es -> en ({compute_type}): {result.text!r}, WER {wer:.2f}")
    assert wer <= 0.6


def _speech_onset(audio: np.ndarray) -> float:
    """Seconds from the start of a recording to its first 20 ms frame 20 dB above its own noise floor
    (LibriSpeech utterances begin with up to 0.6 s of room noise)."""
    n = len(audio) // 320
    db = 20 * np.log10(np.sqrt(np.mean(audio[: n * 320].reshape(n, 320) ** 2, axis=1)) + 1e-10)
    return float(np.argmax(db > np.percentile(db, 5) + 20)) * 0.02


def _gapped_audio() -> tuple[np.ndarray, list[tuple[float, float]], list[float]]:
    """The six clips separated by known silences (two windows): (audio, gaps, each clip's speech onset)."""
    rng = np.random.default_rng(0)
    pieces, starts, gaps = [], [], []
    t = 0.0
    for i, clip in enumerate(LONG_CLIPS):
        gap = 1.0 + 0.5 * (i % 3)
        silence = np.zeros(int(gap * SAMPLE_RATE), dtype=np.float32)
        audio = load_audio(DATA_DIR / clip)
        pieces += [silence, audio]
        gaps.append((t, t + gap))
        starts.append(t + gap + _speech_onset(audio))
        t += gap + len(audio) / SAMPLE_RATE
    audio = np.concatenate(pieces)
    audio += rng.normal(0, 1e-4, size=audio.shape).astype(np.float32)  # not digital silence
    return audio, gaps, starts


@pytest.mark.parametrize("options", [{}, {"hallucination_silence_threshold": 1.0}], ids=["default", "hallucination_silence"])
def test_long_form_with_gaps(tiny, options):
    """Ordered, non-overlapping segments inside the audio; no word starts inside a gap; each clip's first word
    starts within 0.3 s of the clip's speech onset; the reference words in order, without loops. Also with
    openai-whisper's hallucination_silence_threshold, which skips silence around anomalous segments."""
    audio, gaps, starts = _gapped_audio()
    duration = len(audio) / SAMPLE_RATE
    result = transcribe(audio, tiny, **options)
    assert result.duration == pytest.approx(duration, abs=0.01)
    prev_end = 0.0
    for s in result.segments:
        assert s.start >= prev_end - 1e-6 and s.end <= duration + 1e-6
        prev_end = s.end
    _check_words_well_formed(result, duration)
    words = [w for s in result.segments for w in s.words]
    for g0, g1 in gaps:
        if g1 - g0 > 0.5:
            inside = [w for w in words if g0 + 0.1 < w.start < g1 - 0.1]
            assert not inside, f"words start inside the silence {g0:.2f}-{g1:.2f}: {inside}"
    for start in starts:
        first = min((w for w in words if w.start >= start - 0.3), key=lambda w: w.start)
        assert abs(first.start - start) <= 0.3, (start, first)
    # no repeated-phrase loops, and the words are the clips' reference transcripts, in order
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    reference = norm(" ".join(REFERENCES[c] for c in LONG_CLIPS)).split()
    hypothesis = norm(result.text).split()

    def trigrams(words):
        return [tuple(words[i : i + 3]) for i in range(len(words) - 2)]

    ref_trigrams = trigrams(reference)
    for g in set(trigrams(hypothesis)):  # no phrase more often than the speakers said it
        assert trigrams(hypothesis).count(g) <= max(1, ref_trigrams.count(g)), g
    assert jiwer.wer(" ".join(reference), " ".join(hypothesis)) <= 0.15


@pytest.mark.parametrize("pad", ["silence", "noise"])
def test_words_inside_padded_audio(tiny, pad):
    audio = load_audio(DATA_DIR / "jfk.flac")
    rng = np.random.default_rng(1)
    n = 3 * SAMPLE_RATE
    filler = np.zeros(n, np.float32) if pad == "silence" else rng.normal(0, 0.01, n).astype(np.float32)
    padded = np.concatenate([filler, audio, filler])
    result = transcribe(padded, tiny)
    _check_words_well_formed(result, len(padded) / SAMPLE_RATE)
    words = [w for s in result.segments for w in s.words]
    assert words[0].start >= 2.7 and words[-1].end <= 3.0 + len(audio) / SAMPLE_RATE + 0.3


@pytest.mark.parametrize("clip,language", [("test_es.wav", "es"), ("test_de.wav", "de")])
def test_prefill_table_transcripts(base, base_without_words, clip, language):
    """WhisperKit's prefill table instead of the exact prefix: how much the greedy transcript changes.

    Measured: de unchanged; es "Las arenas son blancasinas ... estésias." becomes "las arenas son
    blancesinas ... estésias" (2 of 12 words after normalization). Exact prefill stays the default.
    The exact side detected its language: once detected, a window decodes under the prefix that
    ``language=`` gives (sot, language, task), so it is the transcript of the language given.
    """
    import jiwer
    from whisper_normalizer.basic import BasicTextNormalizer

    norm = BasicTextNormalizer()
    audio = load_audio(DATA_DIR / clip)
    exact = base_without_words[clip]
    assert exact.language == language
    table = transcribe(audio, base, language=language, word_timestamps=False, prefill="table")
    wer = jiwer.wer(norm(exact.text), norm(table.text))
    print(f"prefill table vs exact, {clip}: WER {wer:.3f}: {exact.text!r} -> {table.text!r}")
    assert wer <= 0.2


def test_decode_time_alignment_close_to_teacher_forced(tiny, tiny_default):
    """Word timings from the attention gathered while decoding vs the teacher-forced pass."""
    audio = load_audio(DATA_DIR / "jfk.flac")
    forced = _words(tiny_default["jfk.flac"])
    gathered = _words(transcribe(audio, tiny, alignment="decode"))
    assert [w[0] for w in forced] == [w[0] for w in gathered]
    d = np.abs([a[1] - b[1] for a, b in zip(forced, gathered, strict=True)])
    assert np.median(d) <= 0.1


def test_words_well_formed_on_every_corpus_clip(tiny_int8, corpus_transcripts):
    """Every corpus clip with the default (int8) decoders, English with tiny.en, the others with base: words
    monotonic, inside their segment and inside the audio; no repetition loop; the language of every non-English
    clip detected as the manifest says (the clips in tests/data without the corpus). The transcripts come from
    conftest's session fixture, which test_timing's DTW test shares."""
    assert [t.entry["id"] for t in corpus_transcripts] == [e["id"] for e in corpus_entries()]
    wrong_language = []
    for transcript in corpus_transcripts:
        entry, result = transcript.entry, transcript.result
        assert transcript.duration == pytest.approx(result.duration, abs=0.01), entry["id"]
        _check_words_well_formed(result, transcript.duration)
        assert result.segments and any(s.words for s in result.segments), entry["id"]
        # no repetition loop survives (the sonnet's 0.3 s tail once decoded as "Thou art thou art ..." with a
        # high no-speech probability, which an older openai rule exempted from the fallback)
        assert max(s.compression_ratio for s in result.segments) <= 2.4, entry["id"]
        if entry["language"] != "en" and result.language != entry["language"]:
            wrong_language.append((entry["id"], result.language))
    assert not wrong_language


def test_public_api_is_the_functions():
    """`whisperane.transcribe` is the function even after the module of the same name was imported."""
    import importlib

    import whisperane

    importlib.import_module("whisperane.transcribe")
    assert callable(whisperane.transcribe) and callable(whisperane.load_model)
    from whisperane import transcribe as fn

    assert fn.__module__ == "whisperane.transcribe"
