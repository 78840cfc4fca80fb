"""Audio decoding, validation, streaming and the numpy log-mel reference."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from reference import log_mel_spectrogram_numpy

from whisperane.audio import (
    HOP_LENGTH,
    N_SAMPLES,
    SAMPLE_RATE,
    AudioStream,
    load_audio,
    open_audio,
    pad_or_trim,
    probe_duration,
)
from whisperane.audio_files import MAX_SAMPLE_MAGNITUDE
from whisperane.convert.mel import mel_filters
from whisperane.errors import AudioError

JFK = Path(__file__).parent / "data" / "jfk.flac"


def tone(freq: float, seconds: float, sr: int, channels: int = 1, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    x = amplitude * np.sin(2 * np.pi * freq * t)
    return np.repeat(x[:, None], channels, axis=1).astype(np.float32)


def peak_frequency(x: np.ndarray, sr: int = SAMPLE_RATE) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / sr)[np.argmax(spectrum)])


def reference_16k(path: Path) -> np.ndarray:
    """Independent decode: soundfile in one go, mean downmix, soxr.resample (HQ)."""
    data, sr = sf.read(path, dtype="float32", always_2d=True)
    return soxr.resample(data.mean(axis=1), sr, SAMPLE_RATE, quality="HQ")


# --- log-mel reference ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_transformers(n_mels):
    from transformers.audio_utils import mel_filter_bank

    ref = mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=n_mels,
        min_frequency=0,
        max_frequency=8000,
        sampling_rate=16000,
        norm="slaney",
        mel_scale="slaney",
    ).T
    ours = mel_filters(n_mels)
    assert ours.shape == (n_mels, 201) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_matches_whisper_feature_extractor_on_jfk(n_mels):
    from transformers import WhisperFeatureExtractor

    audio = load_audio(JFK)
    ref = WhisperFeatureExtractor(feature_size=n_mels)(
        audio, sampling_rate=16000, return_tensors="np"
    ).input_features[0]
    ours = log_mel_spectrogram_numpy(pad_or_trim(audio), n_mels)
    assert ours.shape == ref.shape == (n_mels, 3000)
    assert ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 1e-3


def test_log_mel_frame_count_and_padding():
    audio = np.random.default_rng(0).standard_normal(16000 * 3 + 77).astype(np.float32) * 0.1
    mel = log_mel_spectrogram_numpy(audio, 80)
    assert mel.shape == (80, len(audio) // HOP_LENGTH)
    padded = log_mel_spectrogram_numpy(audio, 80, padding=N_SAMPLES)
    assert padded.shape == (80, (len(audio) + N_SAMPLES) // HOP_LENGTH)
    # dynamic range is clamped to 8 (log10 units) below the maximum, then scaled by 1/4
    assert padded.max() - padded.min() <= 2.0 + 1e-6


# --- loading files ----------------------------------------------------------------------------------


def test_load_jfk_resamples_44k_stereo_to_16k_mono():
    info = sf.info(JFK)
    assert (info.samplerate, info.channels) == (44100, 2)  # the clip exercises downmix and resampling
    audio = load_audio(JFK)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == round(info.frames * 16000 / 44100)
    np.testing.assert_allclose(audio, reference_16k(JFK), atol=1e-6)


@pytest.mark.parametrize(
    "fmt,subtype,ext,exact",
    [
        ("WAV", "PCM_16", "wav", True),
        ("FLAC", "PCM_24", "flac", True),
        ("OGG", "VORBIS", "ogg", False),
        ("MP3", "MPEG_LAYER_III", "mp3", False),
    ],
)
def test_formats_decode_to_16k(tmp_path, fmt, subtype, ext, exact):
    path = tmp_path / f"tone.{ext}"
    sf.write(path, tone(440.0, 2.0, 44100, channels=2), 44100, format=fmt, subtype=subtype)
    audio = load_audio(path)
    assert audio.dtype == np.float32
    assert abs(len(audio) - 32000) <= (0 if exact else 1600)  # mp3 adds encoder delay/padding
    assert open_audio(path).length_known  # libsndfile counts ogg exactly; its mp3 writer adds a Xing header
    assert abs(peak_frequency(audio) - 440.0) < 1.0
    if exact:
        np.testing.assert_allclose(audio, reference_16k(path), atol=1e-6)


@pytest.mark.parametrize("sr", [8000, 22050, 16000, 48000, 192000])
def test_sample_rates(tmp_path, sr):
    path = tmp_path / f"tone_{sr}.wav"
    sf.write(path, tone(1000.0, 1.5, sr), sr, subtype="FLOAT")
    audio = load_audio(path)
    assert len(audio) == 24000
    assert abs(peak_frequency(audio) - 1000.0) < 1.0
    if sr == SAMPLE_RATE:  # no resampling at all
        np.testing.assert_array_equal(audio, sf.read(path, dtype="float32")[0])


def test_eight_channels_are_downmixed_by_mean(tmp_path):
    rng = np.random.default_rng(1)
    data = (rng.standard_normal((16000, 8)) * 0.1).astype(np.float32)
    path = tmp_path / "eight.wav"
    sf.write(path, data, 16000, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(path), data.mean(axis=1), atol=1e-7)


def test_other_target_rate(tmp_path):
    path = tmp_path / "tone.wav"
    sf.write(path, tone(300.0, 1.0, 44100), 44100)
    audio = load_audio(path, sr=8000)
    assert len(audio) == 8000
    assert abs(peak_frequency(audio, 8000) - 300.0) < 1.5


# --- arrays -----------------------------------------------------------------------------------------


def test_arrays():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(1000) * 0.1).astype(np.float32)
    np.testing.assert_array_equal(load_audio(x), x)
    assert load_audio(x.astype(np.float64)).dtype == np.float32
    pcm = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    np.testing.assert_allclose(load_audio(pcm), pcm / 32768.0)
    stereo = np.stack([x, -0.5 * x], axis=1)  # (samples, channels)
    np.testing.assert_allclose(load_audio(stereo), 0.25 * x, atol=1e-7)
    np.testing.assert_allclose(load_audio(stereo.T), 0.25 * x, atol=1e-7)  # (channels, samples)


@pytest.mark.parametrize(
    "array,cause",
    [
        (np.zeros(0, np.float32), "no audio samples"),
        (np.array([0.0, np.nan, 0.1], np.float32), "NaN or infinite"),
        (np.array([0.0, 0.1, np.inf], np.float32), "NaN or infinite"),
        (np.array([0.0, 0.1, -2 * MAX_SAMPLE_MAGNITUDE]), "absurdly large sample values"),
        (np.zeros((2, 3, 4), np.float32), "shape"),
        (np.array(["a", "b"]), "dtype"),
    ],
)
def test_bad_arrays(array, cause):
    with pytest.raises(AudioError, match=cause):
        load_audio(array)


def test_pad_or_trim():
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(pad_or_trim(x, 4), x[:4])
    np.testing.assert_array_equal(pad_or_trim(x, 12), np.r_[x, 0, 0])
    m = np.ones((3, 5), np.float32)
    assert pad_or_trim(m, 8).shape == (3, 8)
    assert pad_or_trim(m, 2, axis=0).shape == (2, 5)
    assert len(pad_or_trim(x)) == N_SAMPLES


# --- validation -------------------------------------------------------------------------------------


def assert_audio_error(path, *causes):
    with pytest.raises(AudioError) as info:
        load_audio(path)
    message = str(info.value)
    assert "\n" not in message
    assert os.fspath(path) in message
    for cause in causes:
        assert cause in message
    return message


@pytest.fixture
def no_ffmpeg(tmp_path, monkeypatch):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_missing_directory_and_empty(tmp_path, no_ffmpeg):
    assert_audio_error(tmp_path / "nope.wav", "no such file")
    assert_audio_error(tmp_path, "directory")
    empty = tmp_path / "empty.flac"
    empty.write_bytes(b"")
    assert_audio_error(empty, "empty file")


def test_non_audio_bytes_with_audio_extension(tmp_path, no_ffmpeg):
    path = tmp_path / "notes.wav"
    path.write_text("these are not audio samples\n" * 50)
    assert_audio_error(path, "not a valid WAV file")


def test_truncated_wav(tmp_path):
    path = tmp_path / "cut.wav"
    sf.write(path, tone(440.0, 2.0, 16000), 16000)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_audio_error(path, "truncated")


def test_wav_with_placeholder_size_is_read(tmp_path):
    # Recorders that never finalise the header leave 0xFFFFFFFF as the data size: read what is there.
    path = tmp_path / "live.wav"
    sf.write(path, tone(440.0, 1.0, 16000), 16000)
    data = bytearray(path.read_bytes())
    idx = data.index(b"data")
    data[idx + 4 : idx + 8] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(data))
    assert abs(len(load_audio(path)) - 16000) <= 1


def test_truncated_and_corrupt_flac(tmp_path):
    src = tmp_path / "src.flac"
    sf.write(src, (np.random.default_rng(3).standard_normal(16000 * 4) * 0.1).astype(np.float32), 16000)
    data = src.read_bytes()
    cut = tmp_path / "cut.flac"
    cut.write_bytes(data[: len(data) // 2])
    assert_audio_error(cut, "corrupt or truncated")
    garbled = bytearray(data)
    garbled[len(data) // 2 : len(data) // 2 + 3000] = bytes(3000)
    bad = tmp_path / "garbled.flac"
    bad.write_bytes(bytes(garbled))
    assert_audio_error(bad, "corrupt or truncated")


def test_zero_samples(tmp_path):
    path = tmp_path / "silence0.wav"
    sf.write(path, np.zeros((0, 1), np.float32), 16000)
    assert_audio_error(path, "no audio samples")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_in_file(tmp_path, bad):
    x = tone(440.0, 3.0, 16000)[:, 0]
    x[int(2.5 * 16000)] = bad
    path = tmp_path / "bad.wav"
    sf.write(path, x, 16000, subtype="FLOAT")
    message = assert_audio_error(path, "NaN or infinite", "2.50 s")
    with pytest.raises(AudioError) as info:  # float PCM is read through before any transcribing
        probe_duration(path, 60.0)
    assert str(info.value) == message
    # past the limit the file is refused for its length: its samples are not read
    assert probe_duration(path, 1.0) == pytest.approx(3.0)


@pytest.mark.parametrize(
    "bad_from,value,at",
    [(0.0, 1e19, "0.00 s"), (1.5, 1e7, "1.50 s"), (1.5, -1e7, "1.50 s")],
)
def test_absurd_sample_values_in_float_file(tmp_path, bad_from, value, at):
    # finite, so the NaN check let them through; the log-mel of 1e19 is not finite
    x = tone(440.0, 3.0, 16000)[:, 0]
    x[int(bad_from * 16000) :] = value
    path = tmp_path / "absurd.wav"
    sf.write(path, x, 16000, subtype="FLOAT")
    message = assert_audio_error(path, "absurdly large sample values", f"first at {at}", f"{abs(value):.3g}")
    with pytest.raises(AudioError) as info:
        probe_duration(path, 60.0)
    assert str(info.value) == message


def test_float_file_at_integer_scale_is_accepted(tmp_path):
    # some tools write float WAV unnormalised, at int16 scale: loud, but audio
    x = tone(440.0, 2.0, 16000, amplitude=32767.0)[:, 0]
    path = tmp_path / "int_scale.wav"
    sf.write(path, x, 16000, subtype="FLOAT")
    assert probe_duration(path, 60.0) == pytest.approx(2.0)
    assert np.abs(load_audio(path)).max() == pytest.approx(32767.0, rel=1e-3)


def test_other_container_without_pyav_or_ffmpeg(tmp_path, no_ffmpeg, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` fails, as where PyAV is not installed
    path = tmp_path / "talk.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(200))
    assert_audio_error(path, "PyAV or ffmpeg is needed", ".m4a")


def write_fake_ffmpeg(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "ffmpeg"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_ffmpeg_pipe(tmp_path, monkeypatch):
    # A stand-in ffmpeg (the fallback, forced) that checks the arguments it is given and writes known samples.
    monkeypatch.setenv("WHISPERANE_AUDIO_DECODER", "ffmpeg")
    write_fake_ffmpeg(
        tmp_path / "bin",
        """
        import sys
        import numpy as np
        args = sys.argv[1:]
        assert args[args.index("-f") + 1] == "s16le", args
        assert args[args.index("-ac") + 1] == "1", args
        assert args[args.index("-ar") + 1] == "16000", args
        assert args[args.index("-i") + 1].endswith("talk.m4a"), args
        assert "-nostdin" in args and args[-1] == "-", args
        sys.stdout.buffer.write((np.arange(-40000, 40000) * 0.8).astype("<i2").tobytes())
        """,
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no ffprobe: the length is counted
    path = tmp_path / "talk.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(200))
    audio = load_audio(path)
    np.testing.assert_array_equal(audio, (np.arange(-40000, 40000) * 0.8).astype(np.int16) / np.float32(32768))
    stream = open_audio(path)
    assert not stream.length_known and stream.duration == 80000 / 16000


def test_ffmpeg_failure_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("WHISPERANE_AUDIO_DECODER", "ffmpeg")
    write_fake_ffmpeg(
        tmp_path / "bin",
        """
        import sys
        sys.stderr.write("talk.webm: Invalid data found when processing input\\n")
        sys.exit(1)
        """,
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    path = tmp_path / "talk.webm"
    path.write_bytes(b"\x1aE\xdf\xa3" + bytes(100))
    assert_audio_error(path, "ffmpeg could not decode", "Invalid data found")


# --- streaming --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_flac(tmp_path_factory):
    """150 s of 22.05 kHz stereo noise with a slow tone, so every window has distinct content."""
    sr = 22050
    n = 150 * sr
    rng = np.random.default_rng(4)
    t = np.arange(n) / sr
    left = 0.3 * np.sin(2 * np.pi * (100 + t) * t) + 0.05 * rng.standard_normal(n)
    data = np.stack([left, 0.5 * left[::-1]], axis=1).astype(np.float32)
    path = tmp_path_factory.mktemp("long") / "long.flac"
    sf.write(path, data, sr)
    return path


def test_stream_follows_whisper_seek_pattern(long_flac):
    reference = reference_16k(long_flac)
    stream = AudioStream(long_flac)
    assert stream.duration == pytest.approx(150.0)
    assert not stream.exhausted
    # windows of 30 s; each next start lies inside the previous window, or jumps forward (clip_timestamps)
    starts = [
        0,
        25 * SAMPLE_RATE,
        27 * SAMPLE_RATE + 123,
        55 * SAMPLE_RATE,
        110 * SAMPLE_RATE,
        140 * SAMPLE_RATE,
    ]
    bound = (60 + 2 * 10) * SAMPLE_RATE  # 30 s window + 30 s history + decode blocks
    for start in starts:
        window = stream.read(start, N_SAMPLES)
        expected = reference[start : start + N_SAMPLES]
        assert len(window) == len(expected)
        np.testing.assert_allclose(window, expected, atol=1e-6)
        assert stream.buffered_samples <= bound
    assert stream.exhausted and stream.n_samples == len(reference)
    assert len(stream.read(len(reference) + 10, 100)) == 0
    with pytest.raises(ValueError, match="released"):
        stream.read(0, 100)


def test_stream_reaches_back_within_history(long_flac):
    with AudioStream(long_flac) as stream:
        stream.read(10 * SAMPLE_RATE, 5 * SAMPLE_RATE)  # ends at 15 s: may reach back to 10 s
        again = stream.read(10 * SAMPLE_RATE, N_SAMPLES)
        np.testing.assert_allclose(
            again, reference_16k(long_flac)[10 * SAMPLE_RATE : 40 * SAMPLE_RATE], atol=1e-6
        )


def test_stream_memory_is_bounded(tmp_path):
    sr = 16000
    path = tmp_path / "ten_minutes.wav"
    with sf.SoundFile(path, "w", sr, 1, subtype="PCM_16") as f:
        rng = np.random.default_rng(5)
        for _ in range(10):
            f.write((rng.standard_normal(60 * sr) * 0.1).astype(np.float32))
    whole_size = 600 * sr * 4  # the whole file as float32: 38 MB
    tracemalloc.start()
    try:
        with open_audio(path) as stream:
            start = 0
            while start < stream.n_samples:
                window = stream.read(start, N_SAMPLES)
                assert len(window) > 0
                start += 28 * sr
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < whole_size / 3


def test_stream_detects_nan_in_later_block(tmp_path):
    x = tone(440.0, 80.0, 16000)[:, 0]
    x[70 * 16000] = np.nan
    path = tmp_path / "late_nan.wav"
    sf.write(path, x, 16000, subtype="FLOAT")
    stream = open_audio(path)
    assert len(stream.read(0, N_SAMPLES)) == N_SAMPLES  # the first window is clean
    with pytest.raises(AudioError, match=r"late_nan\.wav.*NaN or infinite.*70\.00 s"):
        stream.read(50 * 16000, N_SAMPLES)


def test_stream_mp3_duration_is_approximate_from_header(tmp_path):
    path = tmp_path / "tone.mp3"
    sf.write(path, tone(440.0, 4.0, 44100), 44100, format="MP3", subtype="MPEG_LAYER_III")
    stream = open_audio(path)
    assert stream.duration == pytest.approx(4.0, abs=0.1)
    stream.read_all()
    assert stream.exhausted and stream.duration == pytest.approx(4.0, abs=0.1)


def flac_without_total(src: Path, dst: Path) -> Path:
    """``src`` with STREAMINFO's total samples set to 0 ("unknown"), as a streaming encoder leaves it."""
    data = bytearray(src.read_bytes())
    # "fLaC", then STREAMINFO first (type 0, 34 bytes); in it, after 16+16+24+24 bits of block and frame sizes
    # and 20+3+5 of rate, channels and depth, the 36-bit total: the low nibble of byte 13 and bytes 14-17
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0 and data[5:8] == (34).to_bytes(3, "big")
    info = data[8:42]
    assert ((info[13] & 0x0F) << 32 | int.from_bytes(info[14:18], "big")) == sf.info(src).frames
    data[8 + 13] &= 0xF0
    data[8 + 14 : 8 + 18] = bytes(4)
    dst.write_bytes(bytes(data))
    return dst


def test_flac_without_total_samples(tmp_path):
    path = flac_without_total(JFK, tmp_path / "streamed.flac")
    assert sf.info(path).frames >= 2**62  # libsndfile's "unknown"
    stream = open_audio(path)
    assert not stream.length_known and open_audio(JFK).length_known
    assert "unknown" in repr(stream)  # showing a stream never decodes it
    # counted, never libsndfile's placeholder: what the seek loop sizes its windows and clips by
    assert stream.n_samples == open_audio(JFK).n_samples and stream.duration == 11.0
    assert probe_duration(path, 60.0) == probe_duration(JFK, 60.0) == 11.0
    assert 5.0 < probe_duration(path, 5.0) < 5.01  # decoded just past the limit, not to the end
    np.testing.assert_array_equal(stream.read_all(), load_audio(JFK))
    assert stream.exhausted and stream.n_samples == 176000


@pytest.mark.slow
def test_flac_without_total_samples_transcribes_like_the_original(tmp_path, tiny_float32_model):
    model = tiny_float32_model
    ours = model.transcribe(flac_without_total(JFK, tmp_path / "streamed.flac")).to_dict()
    reference = model.transcribe(JFK).to_dict()
    assert "ask not what your country can do for you" in reference["text"]
    assert ours == reference


def mp3_without_length_header(path: Path, seconds: float = 30.0) -> Path:
    """A VBR MP3 whose first frame (LAME's Xing/Info frame, the only record of its length) is cut off: loud
    noise first, then a quiet tone, so that libsndfile's estimate (file size over the first frame's bitrate)
    is far too short."""
    sr = 44100
    x = tone(440.0, seconds, sr, amplitude=0.2)[:, 0]
    x[: 2 * sr] += 0.3 * np.random.default_rng(6).standard_normal(2 * sr).astype(np.float32)
    sf.write(path, x, sr, format="MP3", subtype="MPEG_LAYER_III")
    data = path.read_bytes()
    assert data[:2] == b"\xff\xfb" and data[21:25] == b"Xing"  # MPEG-1 layer III; the tag after mono side info
    kbps = [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320][data[2] >> 4]
    frame_size = 144000 * kbps // sr + (data[2] >> 1 & 1)
    path.write_bytes(data[frame_size:])
    assert not any(tag in path.read_bytes()[:2048] for tag in (b"Xing", b"Info", b"VBRI"))
    return path


def test_mp3_without_length_header(tmp_path):
    path = mp3_without_length_header(tmp_path / "vbr.mp3")
    assert sf.info(path).duration < 10.0  # libsndfile's guess, and where it would stop decoding the file
    stream = open_audio(path)
    assert not stream.length_known
    frame = 1152 / 44100  # without the LAME tag, encoder delay and padding are decoded too: under two frames
    assert 30.0 <= probe_duration(path, 60.0) < 30.0 + 2 * frame
    assert stream.n_samples == len(load_audio(path)) == round(probe_duration(path, 60.0) * SAMPLE_RATE)
    assert 5.0 < probe_duration(path, 5.0) < 5.01  # stops just past the limit
    assert abs(peak_frequency(stream.read(20 * SAMPLE_RATE, 5 * SAMPLE_RATE)) - 440.0) < 1.0


def test_probe_duration_from_header(tmp_path):
    path = tmp_path / "pcm16.wav"
    sf.write(path, tone(440.0, 3.0, 22050), 22050, subtype="PCM_16")
    assert probe_duration(path, 60.0) == probe_duration(path, 1.0) == 3.0  # integer PCM: its header, no decode
    assert probe_duration(np.zeros(8000, np.float32), 60.0) == 0.5
    with pytest.raises(AudioError, match="no such file"):
        probe_duration(tmp_path / "missing.wav", 60.0)


def test_from_array_and_open_audio_dispatch(tmp_path):
    x = np.linspace(-1, 1, 5000, dtype=np.float32)
    stream = open_audio(x)
    assert stream.exhausted and stream.n_samples == 5000 and stream.duration == 5000 / 16000
    np.testing.assert_array_equal(stream.read(4000, 2000), x[4000:])
    np.testing.assert_array_equal(stream.read(0, 10), x[:10])  # in memory: any order
    path = tmp_path / "x.flac"
    sf.write(path, x, 16000, subtype="PCM_24")
    file_stream = open_audio(path)
    assert not file_stream.exhausted  # streamed, not decoded up front
    np.testing.assert_allclose(file_stream.read(100, 50), x[100:150], atol=1e-6)


def test_run_side_does_not_import_torch():
    code = "import sys, whisperane.audio; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
