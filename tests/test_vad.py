"""Silero VAD over ONNX Runtime (whisperane.vad) against faster-whisper's VAD and against the audio's content.

The audio is real speech (the corpus, else tests/data) with inserted gaps of digital silence, low noise and
music-like tones, so where the speech is and where it is not is known independently of any VAD.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass

import faster_whisper.vad as fw_vad
import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
from conftest import CORPUS_DIR, DATA_DIR
from hypothesis import given, settings
from hypothesis import strategies as st

from whisperane import vad
from whisperane.audio import SAMPLE_RATE, load_audio, open_audio
from whisperane.errors import ModelError

GAP_SECONDS = (2.0, 10.0)
NOISE_RMS = 0.003  # about -50 dBFS: a quiet room or a hissing line
TONE_AMPLITUDE = 0.2
# faster-whisper's batched pipeline runs the VAD with these (transcribe.py, BatchedInferencePipeline).
BATCHED_OPTIONS = vad.VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160)


# --------------------------------------------------------------------------------------------------
# test audio


@dataclass(frozen=True)
class SpeechClip:
    name: str
    audio: np.ndarray
    words: tuple[tuple[float, float], ...]  # reference word times in the clip (s); empty when none published


@dataclass(frozen=True)
class GappedAudio:
    audio: np.ndarray
    clips: tuple[tuple[int, SpeechClip], ...]  # (first sample, clip)
    gaps: tuple[tuple[int, int, str], ...]  # (start, end, kind) of the inserted gaps


def _speech_clips() -> list[SpeechClip]:
    manifest = CORPUS_DIR / "manifest.jsonl"
    if manifest.is_file():
        entries = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line]
        return [
            SpeechClip(
                e["id"],
                load_audio(CORPUS_DIR / e["audio"]),
                tuple((w["start"], w["end"]) for w in e.get("words", ())),
            )
            for e in entries
        ]
    files = sorted([*DATA_DIR.glob("*.flac"), *DATA_DIR.glob("*.wav")])
    return [SpeechClip(f.stem, load_audio(f), ()) for f in files]


def _music_like_tones(n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Sustained chords of pure tones (organ-like) alternating with a melody of sine notes."""
    out = np.zeros(n_samples, dtype=np.float32)
    pos = 0
    while pos < n_samples:
        length = int(rng.uniform(0.3, 1.5) * SAMPLE_RATE)
        t = np.arange(length) / SAMPLE_RATE
        root = 130.81 * 2 ** (rng.integers(0, 24) / 12)
        ratios = (1.0, 1.26, 1.5, 2.0) if rng.random() < 0.5 else (1.0,)
        note = sum(np.sin(2 * np.pi * root * r * t + rng.uniform(0, 6.3)) for r in ratios) / len(ratios)
        envelope = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.03)  # no clicks at the note edges
        piece = (TONE_AMPLITUDE * note * envelope)[: n_samples - pos]
        out[pos : pos + len(piece)] = piece
        pos += length
    return out


def _gap(kind: str, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "silence":
        return np.zeros(n_samples, dtype=np.float32)
    if kind == "noise":
        return rng.normal(0.0, NOISE_RMS, n_samples).astype(np.float32)
    return _music_like_tones(n_samples, rng)


def _gapped_audio(clips: list[SpeechClip], seed: int = 11) -> GappedAudio:
    rng = np.random.default_rng(seed)
    kinds = ("silence", "noise", "tones")
    parts, placed, gaps, pos = [], [], [], 0
    for i, clip in enumerate([*clips, None]):
        gap = _gap(kinds[i % 3], int(rng.uniform(*GAP_SECONDS) * SAMPLE_RATE), rng)
        gaps.append((pos, pos + len(gap), kinds[i % 3]))
        parts.append(gap)
        pos += len(gap)
        if clip is not None:
            placed.append((pos, clip))
            parts.append(clip.audio)
            pos += len(clip.audio)
    return GappedAudio(np.concatenate(parts), tuple(placed), tuple(gaps))


def _voiced_spans(clip: SpeechClip) -> list[tuple[int, int]]:
    """Where the clip has speech, in its samples: the reference words when published, else its 10 ms frames
    at least 20 dB above its noise floor and within 25 dB of its loudest (an energy rule that knows nothing
    of Silero; the floor matters for the LibriVox reading, whose hiss is only 24 dB below its peak)."""
    if clip.words:
        return [(int(start * SAMPLE_RATE), int(end * SAMPLE_RATE)) for start, end in clip.words]
    frame = SAMPLE_RATE // 100
    frames = clip.audio[: len(clip.audio) // frame * frame].reshape(-1, frame)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    loud = rms >= max(np.percentile(rms, 10) * 10 ** (20 / 20), np.max(rms) * 10 ** (-25 / 20))
    return [(i * frame, (i + 1) * frame) for i in np.flatnonzero(loud)]


@pytest.fixture(scope="module")
def gapped() -> GappedAudio:
    return _gapped_audio(_speech_clips())


@pytest.fixture(scope="module")
def gapped_probabilities(gapped) -> tuple[np.ndarray, int]:
    return vad.default_vad().speech_probabilities(gapped.audio)


# --------------------------------------------------------------------------------------------------
# the model


@pytest.mark.parametrize("model", ["v6.0", "v6.2.3"])
def test_sequence_model_equals_streaming_model(model):
    """Many windows per call, the state carried across calls, give the probabilities of silero-vad's own
    streaming model of the same version run one 32 ms window per call (as silero-vad's OnnxWrapper does)."""
    clip = load_audio(DATA_DIR / "jfk.flac")
    probabilities, n_samples = vad.SileroVad(model=model, windows_per_call=37).speech_probabilities(clip)
    assert n_samples == len(clip)
    assert len(probabilities) == -(-len(clip) // vad.WINDOW_SAMPLES)

    session = ort.InferenceSession(
        str(vad.silero_model_path(f"{model}-streaming")), providers=["CPUExecutionProvider"]
    )
    padded = np.pad(clip, (0, len(probabilities) * vad.WINDOW_SAMPLES - len(clip)))
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros(vad.CONTEXT_SAMPLES, dtype=np.float32)
    reference = []
    for window in padded.reshape(-1, vad.WINDOW_SAMPLES):
        row = np.concatenate([context, window])[None]
        out, state = session.run(
            None, {"input": row, "state": state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)}
        )
        reference.append(out[0, 0])
        context = window[-vad.CONTEXT_SAMPLES :]
    np.testing.assert_allclose(probabilities, np.array(reference), rtol=0, atol=1e-5)
    assert np.ptp(probabilities) > 0.9  # speech and pauses both present: the comparison means something


def test_model_file_checked_and_cached(tmp_path, monkeypatch):
    """The cached model matches its sha256; without network a missing or corrupt copy is one clear error."""
    path = vad.silero_model_path()
    model = vad.SILERO_MODELS[vad.DEFAULT_MODEL]
    assert vad._file_sha256(path) == model.sha256

    monkeypatch.setenv("WHISPERANE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(vad.MODEL_ENV, raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip as if offline
    corrupt = tmp_path / "cache" / "vad" / f"{model.package}-{model.version}" / path.name
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b"not a model")
    with pytest.raises(ModelError) as err:
        vad.silero_model_path()
    message = str(err.value)
    assert "\n" not in message and vad.MODEL_ENV in message and model.requirement in message

    monkeypatch.setenv(vad.MODEL_ENV, str(path))
    assert vad.silero_model_path() == path
    monkeypatch.setenv(vad.MODEL_ENV, str(tmp_path / "missing.onnx"))
    with pytest.raises(ModelError, match="no such file"):
        vad.silero_model_path()


def test_tampered_wheel_is_refused(tmp_path, monkeypatch):
    """A wheel whose model files do not match the sha256 in the code is refused; nothing is cached."""
    model = vad.SILERO_MODELS[vad.DEFAULT_MODEL]
    distribution = f"{model.package.replace('-', '_')}-{model.version}"
    wheel = tmp_path / "links" / f"{distribution}-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(model.member, b"tampered")
        metadata = f"Metadata-Version: 2.1\nName: {model.package}\nVersion: {model.version}\n"
        archive.writestr(f"{distribution}.dist-info/METADATA", metadata)
        archive.writestr(
            f"{distribution}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{distribution}.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel.parent))
    monkeypatch.delenv(vad.MODEL_ENV, raising=False)
    with pytest.raises(ModelError, match="sha256"):
        vad.silero_model_path(cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.onnx"))


# --------------------------------------------------------------------------------------------------
# speech regions


def _faster_whisper_options(options: vad.VadOptions) -> fw_vad.VadOptions:
    names = ("threshold", "neg_threshold", "min_speech_duration_ms", "max_speech_duration_s")
    names += ("min_silence_duration_ms", "speech_pad_ms")
    return fw_vad.VadOptions(**{name: getattr(options, name) for name in names})


@pytest.mark.parametrize(
    "options",
    [
        vad.VadOptions(),
        BATCHED_OPTIONS,
        vad.VadOptions(threshold=0.6, neg_threshold=0.3, min_speech_duration_ms=250, speech_pad_ms=30),
        vad.VadOptions(max_speech_duration_s=4, min_silence_duration_ms=100, speech_pad_ms=200),
    ],
    ids=["defaults", "batched", "strict", "short-max"],
)
def test_regions_follow_faster_whisper_rules(gapped, gapped_probabilities, monkeypatch, options):
    """Given the same window probabilities, the regions are faster-whisper's exactly (its state machine,
    the cut of long regions, the padding)."""
    probabilities, n_samples = gapped_probabilities

    def same_probabilities(padded_audio: np.ndarray) -> np.ndarray:
        n_windows = len(padded_audio) // vad.WINDOW_SAMPLES  # faster-whisper may add a window of padding
        return np.pad(probabilities, (0, n_windows - len(probabilities)))[:n_windows]

    monkeypatch.setattr(fw_vad, "get_vad_model", lambda: same_probabilities)
    expected = fw_vad.get_speech_timestamps(gapped.audio, _faster_whisper_options(options))
    regions = vad.speech_regions(probabilities, n_samples, options)
    assert [(r.start, r.end) for r in regions] == [(d["start"], d["end"]) for d in expected]
    assert len(regions) >= len(gapped.clips) // 2  # the gaps do split the speech


def test_probabilities_equal_faster_whisper_model(gapped, gapped_probabilities):
    """The default model scored in blocks of WINDOWS_PER_CALL windows gives faster-whisper's probabilities
    (its model over the whole signal in calls of 10000 windows; it zeroes the last 64 samples, so its last
    window is left out). Measured: equal to within 2e-6."""
    padded = np.pad(gapped.audio, (0, vad.WINDOW_SAMPLES - len(gapped.audio) % vad.WINDOW_SAMPLES))
    reference = fw_vad.get_vad_model()(padded)
    probabilities, n_samples = gapped_probabilities
    assert n_samples == len(gapped.audio)
    np.testing.assert_allclose(probabilities[:-1], reference[: len(probabilities) - 1], rtol=0, atol=1e-4)


@pytest.mark.parametrize("options", [vad.VadOptions(), BATCHED_OPTIONS], ids=["defaults", "batched"])
def test_clips_give_faster_whisper_regions(gapped, options):
    """faster-whisper's own get_speech_timestamps (its model, its code) on each clip alone: the same regions,
    to the sample on all the clips."""
    for _, clip in gapped.clips:
        regions = vad.get_speech_timestamps(clip.audio, options)
        expected = fw_vad.get_speech_timestamps(clip.audio, _faster_whisper_options(options))
        assert [(r.start, r.end) for r in regions] == [(d["start"], d["end"]) for d in expected], clip.name


@pytest.mark.parametrize("options", [vad.VadOptions(), BATCHED_OPTIONS], ids=["defaults", "batched"])
def test_speech_kept_and_gaps_dropped(gapped, gapped_probabilities, options):
    """Every reference word (or loud frame) of every clip lies inside kept audio but for late onsets, and no region lies
    entirely inside an inserted gap of silence, noise or tones."""
    regions = vad.speech_regions(*gapped_probabilities, options)
    # Regions that touch (padding split a short pause between them) are one stretch of kept audio.
    spans: list[list[int]] = []
    for region in regions:
        if spans and spans[-1][1] == region.start:
            spans[-1][1] = region.end
        else:
            spans.append([region.start, region.end])
    starts = np.array([start for start, _ in spans])
    late_onsets = set()
    for offset, clip in gapped.clips:
        voiced = _voiced_spans(clip)
        for start, end in voiced:
            index = int(np.searchsorted(starts, offset + start, side="right")) - 1
            if index < 0 or spans[index][1] < offset + end:
                # Known misses (measured, both option sets): Silero v6.0 triggers late on the first word of 3
                # of the 27 corpus clips after an inserted gap (es "las" 0.96-1.09 s, de "der" 0.77-0.90 s,
                # LJ001-0006's first 0.23 s); nothing is lost after a clip's first 0.3 s of speech.
                assert end - voiced[0][0] <= 0.3 * SAMPLE_RATE, (clip.name, start / SAMPLE_RATE)
                late_onsets.add(clip.name)
    assert len(late_onsets) <= 3, late_onsets
    for gap_start, gap_end, kind in gapped.gaps:
        inside = [r for r in regions if r.start >= gap_start and r.end <= gap_end]
        assert not inside, (kind, gap_start / SAMPLE_RATE, inside)
    speech = sum(r.n_samples for r in regions)
    gaps = sum(end - start for start, end, _ in gapped.gaps)
    assert speech < len(gapped.audio) - 0.7 * gaps  # most of the gap audio is removed


def test_five_minutes_of_silence_and_noise_give_no_speech(tmp_path):
    """Read as a stream from a file: contiguous reads of at most one call's windows, a bounded buffer."""
    rng = np.random.default_rng(5)
    minute = 60 * SAMPLE_RATE
    t = np.arange(minute) / SAMPLE_RATE
    pieces = [
        np.zeros(minute),
        rng.normal(0, NOISE_RMS, minute),  # white
        np.cumsum(rng.normal(0, 1, minute)) * 1e-4 % 0.01,  # brown-ish rumble
        rng.normal(0, NOISE_RMS, minute) + 0.01 * np.sin(2 * np.pi * 50 * t),  # mains hum
        np.convolve(rng.normal(0, 0.02, minute), np.ones(8) / 8, mode="same"),  # low-passed hiss
    ]
    path = tmp_path / "no-speech.wav"
    sf.write(path, np.concatenate(pieces).astype(np.float32), SAMPLE_RATE, subtype="FLOAT")

    stream = open_audio(path)
    reads, buffered = [], []
    read = stream.read

    def spy(start: int, n: int) -> np.ndarray:
        reads.append((start, n))
        out = read(start, n)
        buffered.append(len(stream._buf))
        return out

    stream.read = spy
    probabilities, n_samples = vad.default_vad().speech_probabilities(stream)
    assert n_samples == 5 * minute
    assert vad.speech_regions(probabilities, n_samples) == []
    assert vad.speech_regions(probabilities, n_samples, BATCHED_OPTIONS) == []
    block = vad.WINDOWS_PER_CALL * vad.WINDOW_SAMPLES
    assert all(n == block for _, n in reads) and [s for s, _ in reads] == list(
        range(0, len(reads) * block, block)
    )
    assert max(buffered) <= 60 * SAMPLE_RATE


# --------------------------------------------------------------------------------------------------
# chunks and the time map


def _regions_strategy():
    """Ordered disjoint regions with gaps (0 allowed: padded regions may touch), lengths up to 70 s."""
    pairs = st.lists(
        st.tuples(st.integers(0, 20 * SAMPLE_RATE), st.integers(1, 70 * SAMPLE_RATE)), min_size=1, max_size=40
    )

    def build(items):
        regions, pos = [], 0
        for gap, length in items:
            regions.append(vad.SpeechRegion(pos + gap, pos + gap + length))
            pos += gap + length
        return regions

    return pairs.map(build)


@settings(max_examples=150, deadline=None)
@given(regions=_regions_strategy(), data=st.data())
def test_chunks_at_most_30_s_and_time_map_round_trips(regions, data):
    chunks = vad.merge_chunks(regions, max_chunk_s=30)
    assert all(0 < chunk.n_samples <= 30 * SAMPLE_RATE for chunk in chunks)
    pieces = [r for chunk in chunks for r in chunk.regions]
    assert pieces[0].start == regions[0].start and pieces[-1].end == regions[-1].end
    assert sum(r.n_samples for r in pieces) == sum(r.n_samples for r in regions)  # every sample, once
    assert all(a.end <= b.start for a, b in zip(pieces, pieces[1:], strict=False))
    for chunk in chunks:
        time = data.draw(st.floats(0, chunk.n_samples / SAMPLE_RATE))
        original = chunk.original_time(time)
        sample = original * SAMPLE_RATE
        assert any(r.start - 1 <= sample <= r.end + 1 for r in chunk.regions)
        assert chunk.time_map.speech_time(original) == pytest.approx(time, abs=1.5 / SAMPLE_RATE)


@settings(max_examples=100, deadline=None)
@given(regions=_regions_strategy(), data=st.data())
def test_chunks_and_map_match_faster_whisper(regions, data):
    """faster-whisper's collect_chunks groups regions of at most 30 s the same way, and its
    SpeechTimestampsMap (rounded to 10 ms) gives the same original times."""
    regions = [r for r in regions if r.n_samples <= 30 * SAMPLE_RATE] or [vad.SpeechRegion(0, SAMPLE_RATE)]
    as_dicts = [{"start": r.start, "end": r.end} for r in regions]
    audio = np.zeros(regions[-1].end, dtype=np.float32)
    _, metadata = fw_vad.collect_chunks(audio, as_dicts, max_duration=30)
    chunks = vad.merge_chunks(regions, max_chunk_s=30)
    assert [chunk.n_samples / SAMPLE_RATE for chunk in chunks] == pytest.approx(
        [m["duration"] for m in metadata]
    )

    reference = fw_vad.SpeechTimestampsMap(as_dicts, SAMPLE_RATE)
    ours = vad.SpeechTimestampsMap(regions)
    time = data.draw(st.floats(0, ours.n_samples / SAMPLE_RATE))
    index = ours.region_index(time)
    assert ours.original_time(time, index) == pytest.approx(
        reference.get_original_time(time, index), abs=0.006
    )
    if abs(time * SAMPLE_RATE - np.array(ours._filtered_ends)).min() > 1:  # off the boundaries: same region
        assert index == reference.get_chunk_index(time)


def test_chunk_audio_is_its_regions(gapped, gapped_probabilities):
    regions = vad.speech_regions(*gapped_probabilities, BATCHED_OPTIONS)
    chunks = vad.merge_chunks(regions)
    stream = open_audio(gapped.audio)
    for chunk in chunks:
        audio = chunk.read(stream)
        assert len(audio) == chunk.n_samples <= 30 * SAMPLE_RATE
        last = chunk.regions[-1]
        np.testing.assert_array_equal(audio[-last.n_samples :], gapped.audio[last.start : last.end])


def test_bad_options_are_one_line_errors():
    for bad in ({"threshold": 0}, {"threshold": 0.5, "neg_threshold": 0.7}, {"speech_pad_ms": -1}):
        with pytest.raises(ValueError, match="VAD"):
            vad.VadOptions(**bad)
    with pytest.raises(ValueError):
        vad.merge_chunks([vad.SpeechRegion(0, 10)], max_chunk_s=0)
