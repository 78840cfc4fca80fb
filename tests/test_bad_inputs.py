"""Malformed and unusual audio through ``whisperane transcribe``, plus property-based fuzzing of the audio
loader and of the decoding options.

Every input is generated here from one short corpus clip. A bad input must give exit code 1, exactly one stderr
line ``whisperane: error: <file>: <cause>``, no traceback and no output file; an unusual but valid one (8 or 192
kHz, six channels, clipping, DC offset) must transcribe to the reference words.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from whisperane.audio import load_audio, open_audio
from whisperane.errors import AudioError, WhisperaneError
from whisperane.result import TranscriptionResult
from whisperane.transcribe import transcribe

REPO = Path(__file__).resolve().parents[1]
CLIP = REPO / "tests" / "data" / "LJ001-0002.flac"  # 1.9 s, 22.05 kHz
CLIP_TEXT = "in being comparatively modern."


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """The clip at 16 kHz mono float32."""
    samples, sr = sf.read(CLIP, dtype="float32")
    return soxr.resample(samples, sr, 16000)




# --- bad inputs -------------------------------------------------------------------------------------------


def _encoded(speech: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech, 16000, format=fmt.upper())
    return buf.getvalue()


def _corrupt(data: bytes, start: int, length: int) -> bytes:
    out = bytearray(data)
    for i in range(start, min(start + length, len(out))):
        out[i] ^= 0x5A
    return bytes(out)


def _wav_header_only(speech: np.ndarray) -> bytes:
    """A valid 16-bit WAV header whose data chunk is empty."""
    buf = io.BytesIO()
    sf.write(buf, np.zeros(0, dtype=np.float32), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _float_wav_with(speech: np.ndarray, value: float) -> bytes:
    samples = speech.copy()
    samples[len(samples) // 2] = value
    buf = io.BytesIO()
    sf.write(buf, samples, 16000, format="WAV", subtype="FLOAT")
    return buf.getvalue()


# name -> (file name, bytes made from the 16 kHz clip (None: not created), regex the message must match)
BAD_INPUTS = {
    "missing": ("missing.wav", None, "no such file"),
    "empty": ("empty.wav", lambda s: b"", r"empty file \(0 bytes\)"),
    "truncated-wav": ("cut.wav", lambda s: _encoded(s, "wav")[:5000], "truncated WAV file"),
    "truncated-flac": ("cut.flac", lambda s: _encoded(s, "flac")[:4000], "corrupt or truncated"),
    "truncated-mp3": ("cut.mp3", lambda s: _encoded(s, "mp3")[:3000], "truncated MP3 file"),
    "truncated-ogg": ("cut.ogg", lambda s: _encoded(s, "ogg")[:3000], "truncated or corrupt|not a valid OGG file or corrupt"),
    "corrupt-wav-header": ("bad.wav", lambda s: _corrupt(_encoded(s, "wav"), 20, 2), "not a valid WAV file"),
    "corrupt-flac-header": ("bad.flac", lambda s: _corrupt(_encoded(s, "flac"), 8, 50), "not a valid FLAC file"),
    "corrupt-flac-frames": ("frames.flac", lambda s: _corrupt(_encoded(s, "flac"), 6000, 3000), "corrupt or truncated"),
    "corrupt-mp3-frames": ("frames.mp3", lambda s: _corrupt(_encoded(s, "mp3"), 2000, 2000), "corrupt or truncated"),
    "corrupt-ogg-header": ("bad.ogg", lambda s: _corrupt(_encoded(s, "ogg"), 30, 90), "not a valid OGG file"),
    "text-as-wav": ("text.wav", lambda s: b"hello, not audio\n" * 100, "not a valid WAV file"),
    "text-as-flac": ("text.flac", lambda s: b"hello, not audio\n" * 100, "not a valid FLAC file"),
    "text-as-mp3": ("text.mp3", lambda s: b"hello, not audio\n" * 100, "not a valid MP3 file"),
    "text-as-ogg": ("text.ogg", lambda s: b"hello, not audio\n" * 100, "not a valid OGG file"),
    "zero-samples": ("zero.wav", _wav_header_only, "contains no audio samples"),
    "nan-samples": ("nan.wav", lambda s: _float_wav_with(s, math.nan), "NaN or infinite sample values"),
    "inf-samples": ("inf.wav", lambda s: _float_wav_with(s, math.inf), "NaN or infinite sample values"),
}


def _make(directory: Path, case: str, speech: np.ndarray) -> Path:
    name, make, _ = BAD_INPUTS[case]
    path = directory / name
    if make is not None:
        path.write_bytes(make(speech))
    return path


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_writes_nothing(case, speech, run, tmp_path):
    path = _make(tmp_path, case, speech)
    out = tmp_path / "out"
    code, stdout, err = run(path, "-o", out)
    cause = BAD_INPUTS[case][2]
    assert code == 1
    assert len(err) == 1, err
    assert err[0].startswith(f"whisperane: error: {path}: ") and re.search(cause, err[0]), err[0]
    assert stdout == "" and list(out.iterdir()) == []


def test_directory_instead_of_a_file(run, tmp_path):
    folder = tmp_path / "recording.wav"
    folder.mkdir()
    code, _, err = run(folder, "-o", tmp_path / "out")
    assert code == 1 and err == [f"whisperane: error: {folder}: directory holds no audio files"]
    with pytest.raises(AudioError, match="is a directory, not an audio file"):
        open_audio(folder)


def test_other_container_without_pyav_or_ffmpeg(run, tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` fails, as where PyAV is not installed
    path = tmp_path / "talk.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(200))
    code, _, err = run(path, "-o", tmp_path / "out")
    assert code == 1 and len(err) == 1
    assert err[0].startswith(f"whisperane: error: {path}: PyAV or ffmpeg is needed to decode .m4a files")


def test_every_bad_input_in_one_real_batch(speech, tiny_en_bundle, tmp_path):
    """The real command on all of them at once: native libraries (libmpg123 warns about broken MP3 frames on
    file descriptor 2) must not add lines; each file gets its one error line and the summary lists them all."""
    paths = [_make(tmp_path, case, speech) for case in BAD_INPUTS]
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "whisperane", "transcribe", *map(str, paths), "-o", str(out), "--model", str(tiny_en_bundle)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    n = len(BAD_INPUTS)
    assert [line for line in lines if line.startswith("whisperane: error:")] == lines[:n]
    for path, line in zip(paths, lines[:n], strict=True):
        assert line.startswith(f"whisperane: error: {path}: ")
    assert lines[n] == f"whisperane: {n} of {n} file(s) failed:"
    assert lines[n + 1 :] == ["  " + line.removeprefix("whisperane: error: ") for line in lines[:n]]
    assert not out.exists() or list(out.iterdir()) == []


# --- unusual but valid inputs -----------------------------------------------------------------------------


def _six_channels(s: np.ndarray) -> np.ndarray:
    gains = np.array([1.0, 0.8, 0.6, 0.4, 0.2, 0.0], dtype=np.float32)
    return s[:, None] * gains[None, :]


VALID_ODDITIES = {
    "8kHz": lambda s: ("speech-8k.wav", soxr.resample(s, 16000, 8000), 8000, "PCM_16"),
    "192kHz": lambda s: ("speech-192k.wav", soxr.resample(s, 16000, 192000), 192000, "FLOAT"),
    "6-channels": lambda s: ("speech-6ch.flac", _six_channels(s), 16000, "PCM_24"),
    "clipping": lambda s: ("speech-clipped.wav", np.clip(s / np.abs(s).max() * 6.0, -1.0, 1.0), 16000, "PCM_16"),
    "dc-offset": lambda s: ("speech-dc.wav", 0.5 + 0.4 * s / np.abs(s).max(), 16000, "FLOAT"),
}


@pytest.mark.parametrize("case", list(VALID_ODDITIES))
def test_unusual_valid_audio_transcribes(case, speech, run, tmp_path):
    name, samples, rate, subtype = VALID_ODDITIES[case](speech)
    path = tmp_path / name
    sf.write(path, samples.astype(np.float32), rate, subtype=subtype)
    assert sf.info(path).samplerate == rate
    code, stdout, err = run(path, "-o", "-")
    assert code == 0, err
    assert words(json.loads(stdout)["text"]) == words(CLIP_TEXT)


def _transcript_words(result: TranscriptionResult) -> list[str]:
    return [w for s in result.segments for w in words(s.text)]


def test_digital_silence_gives_no_words(model, tmp_path):
    # tiny.en invents " you" on digital silence with openai-whisper's thresholds alone (no_speech_prob 0.95 but
    # avg_logprob -0.70 > -1.0; faster-whisper gives the same); whisperane skips windows below -80 dBFS.
    path = tmp_path / "silence.wav"
    sf.write(path, np.zeros(45 * 16000, dtype=np.float32), 16000, subtype="PCM_16")
    result = transcribe(path, model)
    assert result.duration == pytest.approx(45.0)
    assert _transcript_words(result) == []


@pytest.mark.slow
def test_low_level_noise_gives_no_words(model, tmp_path):
    """-60 dBFS white noise gives no words, and any segments lie inside the audio. 10 s of noise, not 20 (CI time):
    measured with tiny.en on the shared 2-core machine (load 2-4), 20 s and 10 s both fall back to temperature 0.6
    and keep segments of " ." without words (52 s and 21 s of CPU); 5 s and 15 s give no segment at all."""
    rng = np.random.default_rng(0)
    path = tmp_path / "noise.wav"
    sf.write(path, (1e-3 * rng.standard_normal(10 * 16000)).astype(np.float32), 16000, subtype="PCM_16")
    result = transcribe(path, model)
    assert _transcript_words(result) == []
    for s in result.segments:
        assert 0.0 <= s.start <= s.end <= result.duration


# --- fuzzing: the audio loader ----------------------------------------------------------------------------


def _wav_bytes(fmt_tag: int, channels: int, rate: int, bits: int, declared: int, payload: bytes) -> bytes:
    block = (channels * bits // 8) & 0xFFFF
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", declared) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


random_wav = st.builds(
    _wav_bytes,
    fmt_tag=st.sampled_from([1, 3, 6, 7, 0xFFFE, 0, 0x1234]),
    channels=st.integers(0, 12),
    rate=st.one_of(st.sampled_from([8000, 16000, 44100, 192000]), st.integers(0, 2**32 - 1)),
    bits=st.sampled_from([0, 8, 16, 24, 32, 64, 12]),
    declared=st.one_of(st.integers(0, 4096), st.just(0xFFFFFFFF)),
    payload=st.binary(max_size=4096),
)


@pytest.fixture(scope="module")
def seed_files() -> dict[str, bytes]:
    """Small valid files (0.3 s of a tone) in each format libsndfile reads, for mutation."""
    t = np.arange(4800) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = {}
    for ext, fmt in (("wav", "WAV"), ("flac", "FLAC"), ("mp3", "MP3"), ("ogg", "OGG")):
        buf = io.BytesIO()
        sf.write(buf, tone, 16000, format=fmt)
        out[ext] = buf.getvalue()
    return out


@st.composite
def mutated(draw, seeds: dict[str, bytes]):
    ext = draw(st.sampled_from(sorted(seeds)))
    data = bytearray(seeds[ext])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "splice"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
        else:
            data[at : at + draw(st.integers(0, 64))] = draw(st.binary(max_size=64))
    return ext, bytes(data)


def _check_loader(path: Path) -> None:
    try:
        audio = load_audio(path)
    except AudioError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    assert isinstance(audio, np.ndarray) and audio.dtype == np.float32 and audio.ndim == 1
    assert audio.size > 0 and np.isfinite(audio).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_audio_loader(data, seed_files, tmp_path_factory):
    """Random bytes, random WAV headers and mutated valid files: a float32 array or an AudioError, nothing else."""
    kind = data.draw(st.sampled_from(["random", "wav-header", "mutated"]))
    if kind == "random":
        ext, payload = data.draw(st.sampled_from(["wav", "flac", "mp3", "ogg", "aiff"])), data.draw(st.binary(max_size=2048))
    elif kind == "wav-header":
        ext, payload = "wav", data.draw(random_wav)
    else:
        ext, payload = data.draw(mutated(seed_files))
    path = tmp_path_factory.mktemp("fuzz", numbered=True) / f"input.{ext}"
    path.write_bytes(payload)
    _check_loader(path)
    shutil.rmtree(path.parent)


@settings(max_examples=60, deadline=None)
@given(
    array=st.one_of(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=64).map(
            lambda v: np.asarray(v, dtype=np.float32)
        ),
        st.lists(st.integers(-32768, 32767), max_size=64).map(lambda v: np.asarray(v, dtype=np.int16)),
        st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 3)).map(lambda s: np.zeros(s, dtype=np.float64)),
        st.lists(st.booleans(), max_size=8).map(np.asarray),
    )
)
def test_fuzz_array_input(array):
    try:
        stream = open_audio(array)
    except AudioError as e:
        assert "\n" not in str(e)
        return
    samples = stream.read_all()
    assert samples.dtype == np.float32 and samples.ndim == 1 and samples.size > 0 and np.isfinite(samples).all()


# --- fuzzing: the decoding options ------------------------------------------------------------------------
# Valid and invalid options are generated apart: every valid combination must give a well-formed result, every
# invalid one the project's option error (a WhisperaneError that is also a ValueError) in one line.

VALID_OPTION_EXAMPLES = 10  # each one is a transcription (about a second)
INVALID_OPTION_EXAMPLES = 40  # each one fails before any decoding

clip_timestamps = st.lists(st.floats(0.0, 4.0), max_size=4).map(lambda v: ",".join(f"{x:.2f}" for x in v))
valid_options = st.fixed_dictionaries({
    "temperature": st.one_of(
        st.floats(0.0, 1.0), st.lists(st.sampled_from([0.0, 0.4, 1.0]), min_size=1, max_size=3).map(tuple)
    ),
    "compression_ratio_threshold": st.one_of(st.none(), st.floats(0.5, 4.0)),
    "logprob_threshold": st.one_of(st.none(), st.floats(-3.0, 0.0)),
    "no_speech_threshold": st.one_of(st.none(), st.floats(0.0, 1.0)),
    "initial_prompt": st.one_of(st.none(), st.text(max_size=40)),
    "clip_timestamps": clip_timestamps,
    "prefill": st.sampled_from(["exact", "table"]),
    "best_of": st.integers(1, 3),
    "word_timestamps": st.booleans(),
    "condition_on_previous_text": st.booleans(),
})

not_finite = st.sampled_from([math.nan, math.inf, -math.inf])
not_a_number = st.sampled_from(["0.5", "none", [0.5], b"1"])
# One option at a time set to a value the options object must refuse (the others keep their defaults).
invalid_options = st.one_of(
    st.fixed_dictionaries({"temperature": st.one_of(
        st.floats(max_value=-1e-3), not_finite, st.sampled_from([(), "hot", (0.0, -0.5), (0.2, math.nan)]))}),
    st.fixed_dictionaries({"compression_ratio_threshold": st.one_of(not_finite, not_a_number)}),
    st.fixed_dictionaries({"logprob_threshold": st.one_of(not_finite, not_a_number)}),
    st.fixed_dictionaries({"no_speech_threshold": st.one_of(not_finite, not_a_number)}),
    st.fixed_dictionaries({"hallucination_silence_threshold": st.one_of(st.floats(max_value=-1e-3),
                                                                        not_finite)}),
    st.fixed_dictionaries({"best_of": st.one_of(st.integers(max_value=0), st.sampled_from([1.5, True, "3"]))}),
    st.fixed_dictionaries({"clip_timestamps": st.one_of(
        st.floats(max_value=-1e-3).map(lambda x: f"{x:.3f}"),
        st.sampled_from(["a,b", "1,nan", "0,inf", "1;2"]))}),
    st.fixed_dictionaries({"prefill": st.sampled_from(["fast", "", "EXACT", "tables"])}),
    st.fixed_dictionaries({"task": st.sampled_from(["summarize", "", "Transcribe"])}),
    st.fixed_dictionaries({"language": st.sampled_from(["klingon", "xx", "", 42])}),
    st.fixed_dictionaries({"initial_prompt": st.sampled_from([42, b"bytes", ["a"]])}),
    st.fixed_dictionaries({"word_timestamps": st.sampled_from(["yes", 1, None])}),
    st.fixed_dictionaries({"suppress_tokens": st.sampled_from(["a,b", "-2", [1.5j]])}),
)


@pytest.mark.slow
def test_fuzz_valid_options_give_well_formed_results(model, speech):
    ran = []

    # No shrinking: each example is a transcription, and a failing one is printed as drawn.
    @settings(max_examples=VALID_OPTION_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate])
    @given(options=valid_options)
    def check(options):
        result = transcribe(speech, model, **options)
        assert_well_formed(result, speech, options)
        ran.append(options)

    check()
    assert len(ran) == VALID_OPTION_EXAMPLES


def test_fuzz_invalid_options_raise_one_line_option_errors(model, speech):
    raised: list[str] = []

    # No shrinking either: an invalid value that is let through costs a transcription per shrinking step.
    @settings(max_examples=INVALID_OPTION_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate])
    @given(options=invalid_options)
    def check(options):
        with pytest.raises(WhisperaneError) as error:
            transcribe(speech, model, **options)
        assert isinstance(error.value, ValueError), f"{options}: {type(error.value).__name__}, no ValueError"
        message = str(error.value)
        assert message and "\n" not in message
        raised.append(next(iter(options)))

    check()
    assert len(raised) == INVALID_OPTION_EXAMPLES
    assert len(set(raised)) >= 8  # the examples spread over the options, not one field over and over


def assert_well_formed(result: TranscriptionResult, speech: np.ndarray, options: dict) -> None:
    assert isinstance(result, TranscriptionResult)
    assert result.duration == pytest.approx(len(speech) / 16000, abs=0.001)
    duration = result.duration  # times are rounded to the millisecond, like the duration itself
    assert result.language == "en" and isinstance(result.text, str)
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    bounds = [float(x) for x in options["clip_timestamps"].split(",") if x]
    ascending = bounds == sorted(bounds)
    previous_end = 0.0
    for s in result.segments:
        assert 0.0 <= s.start <= s.end <= duration + 1e-6
        if ascending:  # clip ranges given out of order overlap by request (openai-whisper does the same)
            assert s.start >= previous_end - 1e-6  # ordered, non-overlapping
        previous_end = s.end
        assert s.text.strip() and all(isinstance(t, int) for t in s.tokens)
        assert 0.0 <= s.no_speech_prob <= 1.0 and math.isfinite(s.avg_logprob) and s.avg_logprob <= 0.0
        if options["word_timestamps"]:
            assert s.words is not None
            for w in s.words:
                assert 0.0 <= w.start <= w.end <= duration + 1e-6 and 0.0 <= w.probability <= 1.0
        else:
            assert s.words is None
    assert words(result.text) == words("".join(s.text for s in result.segments))
    json.dumps(result.to_dict(), allow_nan=False)
